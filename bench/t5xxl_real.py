#!/usr/bin/env python3
"""SD3's T5-XXL encoder at real size, from the folder a user has to a stored fp16 artifact: what each step takes in
time and peak memory, against the need `plan` declares (38.1 GB for ONNX Runtime fp16, over a 24 GB machine).

Runs the user's commands, each in its own process, and reads each process's own peak (wait4):
1. `recipes/make_real_pipeline.py t5xxl`: an SD3 pipeline with a real-size T5-XXL (seeded random weights, saved
   at fp16) and the tiny test model's other parts;
2. `enginefarm export --targets onnxruntime:cpu --precisions fp16`;
3. `enginefarm plan` and `enginefarm build --component text_encoder_3 --report`: each stage's time and peak.

    # ~50 GB RAM and ~50 GB disk, the build's work folder (ENGINEFARM_HOME/build: 19 GB) elsewhere
    ENGINEFARM_HOME=/dev/shm/ef python bench/t5xxl_real.py --work /big/t5 --out results.json
    python bench/t5xxl_real.py --work /tmp/t5 --t5-layers 1                 # the same steps, small

Needs the `export` and `build` extras.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "enginefarm.cli_entry"]


def timed(label: str, command: list[str], log: Path) -> dict:
    """Run `command`, its output to `log`; its wall time and its own peak resident memory (GB)."""
    started = time.monotonic()
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(command)}\n".encode())
        out.flush()
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        _, status, usage = os.wait4(child.pid, 0)
    result = {
        "step": label,
        "seconds": round(time.monotonic() - started, 1),
        "peak_gb": round(usage.ru_maxrss * 1024 / 1e9, 2),  # ru_maxrss is in KiB on Linux
        "exit": os.waitstatus_to_exitcode(status),
    }
    with log.open("a") as out:
        out.write(json.dumps(result) + "\n")
    print(json.dumps(result), flush=True)
    return result


def disk_gb(folder: Path) -> float:
    return round(sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e9, 2)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, required=True, help="a new folder for the model, its export and store")
    p.add_argument("--t5-layers", type=int, default=24)
    p.add_argument("--out", type=Path, help="write the results here as JSON")
    p.add_argument("--no-bench", action="store_true", help="build without the benchmark stage")
    args = p.parse_args()
    work = args.work
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    log = args.out.with_suffix(".log") if args.out else work / "log.txt"  # beside the results: kept if stopped
    source, onnx, store, report = work / "source", work / "onnx", work / "store", work / "report.json"
    steps = [
        timed(
            "make",
            [sys.executable, "recipes/make_real_pipeline.py", "t5xxl", "--out", str(source)]
            + ["--t5-layers", str(args.t5_layers)],
            log,
        )
    ]
    found: dict = {"steps": steps, "t5_layers": args.t5_layers}
    if steps[-1]["exit"] == 0:
        found["source_gb"] = disk_gb(source)
        steps.append(
            timed(
                "export",
                [*CLI, "export", str(source), "--out", str(onnx), "--name", "sd3-t5xxl"]
                + ["--targets", "onnxruntime:cpu", "--precisions", "fp16", "--batch", "1,1,2"]
                # the tiny transformer's positions reach 32 latent pixels; T5's tokens are the family's 16,256,512
                + ["--latent", "8,16,32"],
                log,
            )
        )
    if steps[-1]["exit"] == 0:
        found["onnx_gb"] = disk_gb(onnx)
        shutil.rmtree(source)  # the export read it: its disk goes to the build (64 GB held at once otherwise)
        recipe = str(onnx / "recipe.toml")
        plan = subprocess.run(
            [*CLI, "plan", recipe, "--store", str(store), "--component", "text_encoder_3"],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        found["plan"] = plan.stdout + plan.stderr
        print(found["plan"], flush=True)
        build = [*CLI, "build", recipe, "--store", str(store), "--component", "text_encoder_3"]
        build += ["--report", str(report), "--memory", "120G"] + (["--no-bench"] if args.no_bench else [])
        steps.append(timed("build", build, log))
        if report.exists():
            found["report"] = json.loads(report.read_text())
            found["store_gb"] = disk_gb(store)
    text = json.dumps(found, indent=1)
    if args.out:
        args.out.write_text(text)
    print(log.read_text()[-6000:])
    return 0 if all(s["exit"] == 0 for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
