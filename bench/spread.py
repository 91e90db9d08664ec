"""How much does the same artifact's build-time benchmark move between builds? Builds a recipe --repeat times into
fresh stores with `enginefarm build -j N` (jobs build and benchmark side by side, as on a farm runner) and compares
each artifact's p50 across the builds (same build key = same artifact).

Prints, per artifact: the p50 of each build, max/min and (max - min)/median across builds, and the spread and runs
each record claims (IQR / median; records from before spreads were kept have none). Run it with another checkout's
interpreter to measure that version (it only drives the CLI and reads manifests).

    .venv/bin/python bench/spread.py [--recipe R] [--ref MODEL/COMPONENT] [--repeat 3] [-j 2] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "sd_vae_decoder.toml")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("-j", type=int, default=2, dest="parallel")
    p.add_argument("--work", type=Path, default=ROOT / ".enginefarm" / "bench-spread")
    p.add_argument("--target", action="append", default=[], help="only this target (repeatable)")
    p.add_argument("--precision", action="append", default=[], help="only this precision (repeatable)")
    args = p.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    p50s: dict[str, list[float]] = {}
    records: dict[str, list[dict]] = {}
    labels: dict[str, str] = {}
    for n in range(args.repeat):
        store, home = work / f"store-{n}", work / f"home-{n}"
        store.mkdir(parents=True)
        env = {**os.environ, "ENGINEFARM_HOME": str(home), "ENGINEFARM_STORE": str(store)}
        select = [x for t in args.target for x in ("--target", t)] + [
            x for q in args.precision for x in ("--precision", q)
        ]
        started = time.perf_counter()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "enginefarm.cli",
                "build",
                str(args.recipe.resolve()),
                "-j",
                str(args.parallel),
                *select,
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        print(f"build {n + 1}/{args.repeat}: exit {proc.returncode}, {time.perf_counter() - started:.0f} s", flush=True)
        if proc.returncode != 0:
            print(proc.stdout[-2000:], proc.stderr[-2000:])
        for path in sorted((store / "manifests").glob("*.json")):
            manifest = json.loads(path.read_text())
            for bench in manifest.get("benchmarks", [])[:1]:
                key = manifest["build_key"]
                labels[key] = f"{manifest['target']} {manifest['precision']}"
                p50s.setdefault(key, []).append(bench["p50_ms"])
                records.setdefault(key, []).append(bench)
    print(
        f"\n{'artifact':<26}{'p50 ms per build':<34}{'max/min':>8}{'(max-min)/median':>18}  claimed spread (runs, "
        "share of the cores used)"
    )
    worst = []
    for key in sorted(p50s, key=lambda k: labels[k]):
        values = p50s[key]
        ratio = max(values) / min(values)
        rel = (max(values) - min(values)) / statistics.median(values)
        worst.append(rel)
        claimed = ", ".join(
            (f"{100 * r['spread']:.1f}% ({r.get('runs')}" if "spread" in r else f"- ({r.get('runs')}")
            + (f", cpu {r['cpu_share']:.2f}" if "cpu_share" in r else "")
            + ")"
            for r in records[key]
        )
        print(
            f"{labels[key]:<26}{', '.join(f'{v:.1f}' for v in values):<34}{ratio:>8.2f}{100 * rel:>17.1f}%  {claimed}"
        )
    if worst:
        print(
            f"\nacross {len(worst)} artifacts: median (max-min)/median {100 * statistics.median(worst):.1f}%, worst "
            f"{100 * max(worst):.1f}%"
        )


if __name__ == "__main__":
    main()
