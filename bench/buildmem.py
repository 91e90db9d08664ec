"""Build time and memory per stage: each job of a recipe built alone, its process tree's RSS sampled from outside.

For every job selected (default: every job of --component in --recipe), one at a time, the script runs the
executor (`run_jobs`, one worker process per job, as `enginefarm build` does) and samples the resident memory
of the whole process tree under it (worker, benchmark and SDK subprocesses) every 0.1 s, attributing each
sample to the stage the job last reported. It prints per job and stage: seconds and the tree's peak RSS; and,
where the build reports it, the job's own measurement (`stages` in the report: time and peak RSS measured
inside the processes that did the work). The outside view double-counts pages shared between processes (a
file mapped by two of them), so it is an upper bound; the job's own numbers are what it asserts on.

    .venv/bin/python bench/buildmem.py --recipe recipes/models/sd15/recipe.toml --component unet
                                       [--target T] [--precision P] [--store DIR] [--home DIR] [--json OUT.json]
                                       [--no-bench]

The store and work folder default to .enginefarm/bench-store and .enginefarm/bench-home; a job whose key is
already stored is skipped, so point --store at an empty folder to measure builds. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _stage(step: str) -> str:
    """The executor's step names → the report's stage names (the build step names its target)."""
    return "compile" if step.startswith("build ") else step


class TreeSampler:
    """Peak RSS of this process's children (recursively), per stage, sampled every `period` seconds."""

    def __init__(self, period: float = 0.1) -> None:
        import psutil

        self.psutil, self.me, self.period = psutil, psutil.Process(), period
        self.stage, self.peaks, self.started = "start", {}, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def enter(self, stage: str) -> None:
        self.stage = stage
        self.started.setdefault(stage, time.perf_counter())

    def _tree_rss(self) -> int:
        total = 0
        for child in self.me.children(recursive=True):
            try:
                total += child.memory_info().rss
            except (self.psutil.NoSuchProcess, self.psutil.AccessDenied):
                pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = self._tree_rss()
            self.peaks[self.stage] = max(self.peaks.get(self.stage, 0), rss)
            self._stop.wait(self.period)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def measure(job, store_url: str, workroot: Path, bench: bool) -> dict:
    from enginefarm.builder.executor import run_jobs

    marks: list[tuple[str, float]] = []
    with TreeSampler() as sampler:

        def on_event(_job_id, kind, detail):
            if kind == "step":
                stage = _stage(str(detail))
                marks.append((stage, time.perf_counter()))
                sampler.enter(stage)

        started = time.perf_counter()
        sampler.enter("start")
        results = run_jobs([job], store_url, workroot, parallel=1, bench=bench, on_event=on_event)
        ended = time.perf_counter()
    result = results[0]
    outside = {}
    for index, (stage, at) in enumerate(marks):
        until = marks[index + 1][1] if index + 1 < len(marks) else ended
        row = outside.setdefault(stage, {"seconds": 0.0, "peak_rss_mb": 0.0})
        row["seconds"] += until - at
        row["peak_rss_mb"] = max(row["peak_rss_mb"], sampler.peaks.get(stage, 0) / 2**20)
    report = result.to_dict()
    return {
        "job": job.label,
        "status": result.status,
        "reason": result.reason,
        "seconds": ended - started,
        "tree_peak_rss_mb": max(sampler.peaks.values(), default=0) / 2**20,
        "outside": outside,
        "own": report.get("stages"),
        "peak_rss_mb": report.get("peak_rss_mb"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "models" / "sd15" / "recipe.toml")
    p.add_argument("--component", action="append", default=[], help="only this component (repeatable)")
    p.add_argument("--target", action="append", default=[], help="only this target (repeatable)")
    p.add_argument("--precision", action="append", default=[], help="only this precision (repeatable)")
    p.add_argument("--store", type=Path, default=ROOT / ".enginefarm" / "bench-store")
    p.add_argument("--home", type=Path, default=ROOT / ".enginefarm" / "bench-home")
    p.add_argument("--json", type=Path, help="also write the measurements here")
    p.add_argument("--no-bench", action="store_true", help="skip each job's benchmark stage")
    args = p.parse_args()
    os.environ["ENGINEFARM_HOME"] = str(args.home.resolve())

    from enginefarm.builder.planner import plan
    from enginefarm.builder.recipe import load_recipe
    from enginefarm.cache.stores import open_store

    store = open_store(str(args.store.resolve()))
    planned = plan(
        [load_recipe(args.recipe)],
        args.home.resolve() / "sources",
        store=store,
        targets=tuple(args.target),
        precisions=tuple(args.precision),
        components=tuple(args.component),
    )
    rows = []
    for entry in planned:
        if entry.built or not entry.availability.can_build:
            print(f"skipped {entry.job.label}: {entry.status}", flush=True)
            continue
        print(f"building {entry.job.label} ...", flush=True)
        row = measure(entry.job, store.url, args.home.resolve() / "build", not args.no_bench)
        rows.append(row)
        print(
            f"  {row['status']} in {row['seconds']:.0f} s, process tree peak {row['tree_peak_rss_mb']:.0f} MB"
            + (f"; job's own peak {row['peak_rss_mb']:.0f} MB" if row.get("peak_rss_mb") else "")
            + (f": {row['reason']}" if row["reason"] else ""),
            flush=True,
        )
        own = {s["stage"]: s for s in row["own"] or []}
        for stage, seen in row["outside"].items():
            mine = own.get(stage)
            extra = f"   own: {mine['seconds']:7.1f} s {mine['peak_rss_mb']:8.0f} MB" if mine else ""
            print(
                f"    {stage:<10} {seen['seconds']:7.1f} s  tree peak {seen['peak_rss_mb']:8.0f} MB{extra}", flush=True
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    sys.exit(1 if any(r["status"] == "failed" for r in rows) else 0)


if __name__ == "__main__":
    main()
