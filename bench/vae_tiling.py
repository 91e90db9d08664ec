"""Tiled VAE decode vs whole: peak RSS and time of the real SD 1.5 VAE decoder (random weights,
recipes/make_sd_vae_decoder.py) on ONNX Runtime CPU, decoding one image whole and in 512-pixel tiles
(enginefarm.diffusion.tiles, diffusers' grid), each in a fresh process (its own VmHWM). Prints a table and ratios.

    python bench/vae_tiling.py [--sizes 1024,2048] [--model recipes/models/sd_vae_decoder.onnx]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = """
import json, sys, time
from pathlib import Path
import numpy as np
import onnxruntime as ort
from enginefarm.diffusion import tiles
model, size, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
name = session.get_inputs()[0].name
run = lambda x: session.run(None, {name: x})[0]
latent = np.random.default_rng(0).standard_normal((1, 4, size // 8, size // 8)).astype(np.float32)
start = time.perf_counter()
image = run(latent) if mode == "whole" else tiles.decode(run, latent, tiles.Tiling(512, 64))
seconds = time.perf_counter() - start
peak = next(int(l.split()[1]) for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmHWM:"))
finite = bool(np.isfinite(image).all())
print(json.dumps({"seconds": seconds, "peak_mb": peak / 1024, "shape": list(image.shape), "finite": finite}))
"""


def measure(model: Path, size: int, mode: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(model), str(size), mode], capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["killed"])[-1][:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1024,2048", help="image sides in pixels, comma-separated")
    p.add_argument("--model", type=Path, default=ROOT / "recipes" / "models" / "sd_vae_decoder.onnx")
    args = p.parse_args()
    if not args.model.is_file():
        print(
            f"error: {args.model} not found; make it with: python recipes/make_sd_vae_decoder.py --out {args.model}",
            file=sys.stderr,
        )
        return 2
    print("| image | whole: s / peak MB | 512-px tiles: s / peak MB | peak ratio tiles/whole |\n|---|---|---|---|")
    for size in (int(s) for s in args.sizes.split(",")):
        started = time.perf_counter()
        whole, tiled = measure(args.model, size, "whole"), measure(args.model, size, "tiles")
        cell = lambda r: r["error"] if "error" in r else f"{r['seconds']:.1f} / {r['peak_mb']:.0f}"  # noqa: E731
        ratio = f"{tiled['peak_mb'] / whole['peak_mb']:.2f}" if "peak_mb" in whole and "peak_mb" in tiled else "-"
        print(f"| {size}² | {cell(whole)} | {cell(tiled)} | {ratio} |", flush=True)
        print(f"  ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
