"""An upscaler at real size: time per megapixel and peak memory, built engines against spandrel's torch model.

The model is RealESRGAN_x4plus's layout (RRDBNet, 64 features, 23 blocks, x4) with seeded random weights, saved as
its .pth is (`params_ema`), exported with `export_filter` for sides --sides MIN,OPT,MAX and built for ONNX Runtime and
OpenVINO at fp32 and fp16 (export and build times are reported). Then, each in a fresh process of its own:

- time: one warm run at --side² pixels per backend and precision, and spandrel's torch model on the same input,
  given as seconds per input megapixel (the output is 16x that);
- memory: peak RSS (/proc/self VmHWM, after importing and loading) of `up(image)` whole and with `tile=`, for a
  --rss-side² input. A 512² input (a 2048² result) takes many minutes on a small CPU: `--rss-side` measures a
  smaller one, and the report extrapolates to 512² in pixels (whole: the activations grow with the image; tiled:
  only the result array does) and says so.

A benchmark, not a test: it never fails on numbers.

    .venv/bin/python bench/filters_upscale.py [--sides 32,64,128] [--side 64] [--rss-side 128] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("onnxruntime:cpu", "openvino:cpu")
PRECISIONS = ("fp32", "fp16")

_CHILD = """
import json, sys, time
import numpy as np
from enginefarm.hardware.rss import current_bytes, peak_bytes
what, path, store, target, precision, side, tile = sys.argv[1:8]
side, tile = int(side), int(tile) or None
image = np.random.default_rng(0).random((side, side, 3), dtype=np.float32)
if what == "torch":
    import torch
    sys.path.insert(0, "tests/export/filters")
    from upscaler_files import spandrel_model
    model = spandrel_model(path)
    def run(x):
        with torch.no_grad():
            return model(torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))[None])
else:
    import enginefarm.filters
    up = enginefarm.filters.load(path, store=store, precision=precision, target=target, device="cpu")
    def run(x):
        return up(x, tile=tile)
run(image[:32, :32])  # warm: first-run allocations and compilation are not the time asked for
loaded = current_bytes()
start = time.perf_counter()
run(image)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "loaded": loaded, "peak": peak_bytes()}))
"""


def _triple(text: str) -> tuple[int, int, int]:
    low, opt, high = (int(v) for v in text.split(","))
    return low, opt, high


def prepare(work: Path, sides: tuple[int, int, int]) -> dict:
    """The file, its export and the store, made once per --work folder; export and build seconds."""
    sys.path.insert(0, str(ROOT / "tests" / "export" / "filters"))
    from upscaler_files import rrdb_state, save

    done = work / "prepared.json"
    if done.is_file():
        return json.loads(done.read_text())
    from enginefarm.export.filters.run import export_filter

    path = save(rrdb_state(features=64, blocks=23, seed=0), work / "RealESRGAN_x4plus.pth")
    started = time.monotonic()
    export = export_filter(path, work / "export", "realesrgan-x4plus", profile={"height": sides, "width": sides})
    exported = time.monotonic() - started
    started = time.monotonic()
    store = work / "store"
    store.mkdir(exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "enginefarm.cli", "build", str(export.recipe), "--store", str(store), "--no-bench"],
        check=True,
        env={**os.environ, "ENGINEFARM_HOME": str(work / "home")},
    )
    record = {
        "file": str(path),
        "store": str(store),
        "export_s": exported,
        "build_s": time.monotonic() - started,
        "deviation": max(export.parts[0].deviations.values()),
    }
    done.write_text(json.dumps(record))
    return record


def child(work: Path, what: str, path: str, store: str, target: str, precision: str, side: int, tile: int) -> dict:
    env = {**os.environ, "ENGINEFARM_HOME": str(work / "home"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, what, path, store, target, precision, str(side), str(tile)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{what} {target} {precision} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sides", default="32,64,128", help="the export's profile sides MIN,OPT,MAX")
    p.add_argument("--side", type=int, default=64, help="input side for the time per megapixel")
    p.add_argument("--rss-side", type=int, default=128, help="input side for peak memory (512: a 2048² result)")
    p.add_argument("--tile", type=int, default=64, help="tile side for the tiled memory run")
    p.add_argument("--work", type=Path, default=None, help="keep the file, export and store here")
    args = p.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="filters-upscale-"))
    work.mkdir(parents=True, exist_ok=True)
    prepared = prepare(work.resolve(), _triple(args.sides))
    print(
        f"export {prepared['export_s']:.0f} s (max deviation from torch {prepared['deviation']:.1e}), "
        f"build {prepared['build_s']:.0f} s (4 jobs)",
        flush=True,
    )
    megapixels = args.side**2 / 1e6
    torch_run = child(work, "torch", prepared["file"], "", "", "", args.side, 0)
    print(f"torch (spandrel) fp32: {torch_run['seconds'] / megapixels:.0f} s per input megapixel", flush=True)
    for target in TARGETS:
        for precision in PRECISIONS:
            run = child(work, "engine", "realesrgan-x4plus", prepared["store"], target, precision, args.side, 0)
            print(f"{target} {precision}: {run['seconds'] / megapixels:.0f} s per input megapixel", flush=True)
    scale_to_512 = (512 / args.rss_side) ** 2
    result_bytes = lambda side: (4 * side) ** 2 * 3 * 4  # noqa: E731 (the float32 result)
    for target in TARGETS:
        whole = child(work, "engine", "realesrgan-x4plus", prepared["store"], target, "fp32", args.rss_side, 0)
        tiled = child(work, "engine", "realesrgan-x4plus", prepared["store"], target, "fp32", args.rss_side, args.tile)
        grow = whole["peak"] - whole["loaded"]
        note = "" if args.rss_side == 512 else f" (measured at {args.rss_side}²; 512² extrapolated in pixels)"
        print(
            f"{target} fp32 peak RSS, {args.rss_side}² input: loaded {whole['loaded'] / 2**20:.0f} MiB, whole "
            f"{whole['peak'] / 2**20:.0f} MiB, tile {args.tile} {tiled['peak'] / 2**20:.0f} MiB; for a 512² input "
            f"(2048² result): whole {(whole['loaded'] + grow * scale_to_512) / 2**20:.0f} MiB, tiled "
            f"{(tiled['peak'] + result_bytes(512) - result_bytes(args.rss_side)) / 2**20:.0f} MiB{note}",
            flush=True,
        )


if __name__ == "__main__":
    main()
