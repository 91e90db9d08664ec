"""A pipeline with and without a memory budget: peak RSS, time per image and the images themselves, side by side.

Each run is a fresh process (its own VmHWM) that loads MODEL with `Pipeline.load(memory_budget=...)` from a store and
generates IMAGES images. "none" loads every component up front; a size (or "1", less than any component) loads each
stage's components when it needs them and closes the others first. Prints a table, each component's resident memory
as measured when it loaded, the peak against the largest component's, the reload cost per image, and whether every
run's images are bit-identical to the unbudgeted run's.

    python bench/pipeline_budget.py sd15 --store /work/big/sd15/store --home /work/big/sd15/home \\
        --target openvino:cpu --precision fp16 [--budgets none,1] [--steps 2] [--size 512] [--images 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = """
import hashlib, json, sys, time
from pathlib import Path
import numpy as np
from enginefarm.hardware.rss import peak_bytes
from enginefarm.diffusion import Pipeline
model, store, target, precision, budget, steps, size, images = sys.argv[1:9]
budget = None if budget == "none" else (int(budget) if budget.isdigit() else budget)
start = time.perf_counter()
pipe = Pipeline.load(model, store=store, target=target, precision=precision, memory_budget=budget)
loaded = time.perf_counter() - start
seconds, digests = [], []
for seed in range(int(images)):
    start = time.perf_counter()
    image = pipe("a lighthouse at dawn", steps=int(steps), width=int(size), height=int(size), seed=seed)
    seconds.append(time.perf_counter() - start)
    digests.append(hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest())
if pipe.residency:
    pipe.residency.need(())  # counts what the last stage (the decoder) grew by while it ran
held = {c: (b + pipe.residency.ran.get(c, 0)) / 2**20 for c, b in pipe.residency.held.items()} if pipe.residency else {}
loads = pipe.residency.loads if pipe.residency else len(pipe.sessions)
print(json.dumps({"load_s": loaded, "image_s": seconds, "digests": digests, "held_mb": held, "loads": loads,
                  "peak_mb": peak_bytes() / 2**20}))
"""


def measure(args: argparse.Namespace, budget: str) -> dict:
    env = dict(os.environ, ENGINEFARM_HOME=str(args.home))
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD,
            args.model,
            str(args.store),
            args.target,
            args.precision,
            budget,
            str(args.steps),
            str(args.size),
            str(args.images),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        sys.exit(f"budget {budget}: failed\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--store", type=Path, required=True)
    p.add_argument(
        "--home", type=Path, required=True, help="ENGINEFARM_HOME: the device cache (warm it with one run first)"
    )
    p.add_argument("--target", default="openvino:cpu")
    p.add_argument("--precision", default="fp16")
    p.add_argument("--budgets", default="none,1", help="comma-separated: none, bytes, a size such as 3G, or auto")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--size", type=int, default=512)
    p.add_argument("--images", type=int, default=2)
    args = p.parse_args()
    runs = {budget: measure(args, budget) for budget in args.budgets.split(",")}

    print(
        f"{args.model} on {args.target} {args.precision}, {args.images} images of {args.size}² px, {args.steps} steps "
        "each"
    )
    print(f"{'budget':>8} {'peak MB':>9} {'load s':>7} {'s/image':>14} {'loads':>6}  same images")
    base = runs.get("none")
    for budget, run in runs.items():
        same = "—" if base is None or run is base else ("yes" if run["digests"] == base["digests"] else "NO")
        per_image = " ".join(f"{s:.1f}" for s in run["image_s"])
        print(f"{budget:>8} {run['peak_mb']:>9.0f} {run['load_s']:>7.1f} {per_image:>14} {run['loads']:>6}  {same}")
    held = next((r["held_mb"] for r in runs.values() if r["held_mb"]), {})
    if held:
        print(
            "resident per component, MB (measured as each loaded and ran): "
            + ", ".join(f"{c} {m:.0f}" for c, m in held.items())
        )
        largest = max(held.values())
        for budget, run in runs.items():
            if run["held_mb"]:
                print(
                    f"budget {budget}: peak / largest component = {run['peak_mb'] / largest:.2f}"
                    + (f"; peak / unbudgeted peak = {run['peak_mb'] / base['peak_mb']:.2f}" if base else "")
                )
                if base:
                    extra = sum(run["image_s"]) / len(run["image_s"]) - sum(base["image_s"]) / len(base["image_s"])
                    print(f"budget {budget}: reloading costs {extra:+.1f} s per image")
    digest = hashlib.sha256(json.dumps({b: r["digests"] for b, r in runs.items()}).encode()).hexdigest()[:12]
    print(f"images digest {digest}")


if __name__ == "__main__":
    main()
