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

`--peak-2048` measures instead (fp32 only, nothing extrapolated): the tiled peak of a 512² input (the 2048² result)
in `--tile` tiles, and the whole-image peak at the largest input the profile holds (`--sides`' MAX), each backend in
a child process of its own; the parent watches each child's RSS (psutil) and stops it past `--cap-gib`, so a whole
image cannot take the machine. From the whole runs' growth per input pixel it gives the largest input whose whole
run fits the cap.

A benchmark, not a test: it never fails on numbers.

    .venv/bin/python bench/filters_upscale.py [--sides 32,64,128] [--side 64] [--rss-side 128] [--work DIR]
    .venv/bin/python bench/filters_upscale.py --peak-2048 --sides 64,128,192 --tile 128 [--cap-gib 4] [--work DIR]
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
warm = 64 if tile is not None and tile < 0 else 32
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
        if tile < 0:  # whole, past the profile: the backend session enginefarm loaded (the graph is dynamic)
            feed = np.ascontiguousarray(x.transpose(2, 0, 1)[None])
            return up.session._session.run({"image": feed})["upscaled"]
        return up(x, tile=tile)
run(image[:warm, :warm])  # warm: first-run allocations and compilation are not the time asked for
loaded = current_bytes()
start = time.perf_counter()
run(image)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "loaded": loaded, "peak": peak_bytes()}))
"""


def _triple(text: str) -> tuple[int, int, int]:
    low, opt, high = (int(v) for v in text.split(","))
    return low, opt, high


def prepare(work: Path, sides: tuple[int, int, int], precisions: tuple[str, ...] = PRECISIONS) -> dict:
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
    chosen = [arg for precision in precisions for arg in ("--precision", precision)]
    subprocess.run(
        [sys.executable, "-m", "enginefarm.cli", "build", str(export.recipe), "--store", str(store), "--no-bench"]
        + chosen,
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


def child(
    work: Path, what: str, path: str, store: str, target: str, precision: str, side: int, tile: int, cap: int = 0
) -> dict:
    """One measurement in a fresh process; with `cap` (bytes), the process is stopped once its RSS passes it and the
    result is {"capped": peak seen}."""
    env = {**os.environ, "ENGINEFARM_HOME": str(work / "home"), "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-c", _CHILD, what, path, store, target, precision, str(side), str(tile)]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True, env=env, cwd=ROOT)
        seen = _watch(proc, cap)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if cap and seen > cap:
        return {"capped": seen}
    if proc.returncode != 0:
        raise SystemExit(f"{what} {target} {precision} failed:\n{stderr[-3000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def _watch(proc: subprocess.Popen, cap: int) -> int:
    """Wait for `proc`, polling its RSS; past `cap` bytes (0: no cap) kill it. The highest RSS seen."""
    import psutil

    watched, seen = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        try:
            seen = max(seen, watched.memory_info().rss)
        except psutil.Error:
            break
        if cap and seen > cap:
            proc.kill()
            break
        time.sleep(0.1)
    proc.wait()
    return seen


def peak_2048(
    work: Path, prepared: dict, whole_side: int, tile: int, cap: int, targets=TARGETS, past_profile: bool = False
) -> None:
    """The tiled peak for a 512² input (2048² result) and the whole-image peak at `whole_side`², per backend, fp32.
    `past_profile`: only the whole run, through the loaded backend session without the profile's check."""
    mib = lambda n: n / 2**20  # noqa: E731
    if past_profile:
        for target in targets:
            whole = child(work, "engine", "realesrgan-x4plus", prepared["store"], target, "fp32", whole_side, -1, cap)
            if "capped" in whole:
                print(f"{target}: whole {whole_side}² stopped past the {mib(cap):.0f} MiB cap", flush=True)
                continue
            print(
                f"{target} fp32, whole {whole_side}² input ({4 * whole_side}² result), the backend session past the "
                f"profile: loaded {mib(whole['loaded']):.0f} MiB, peak {mib(whole['peak']):.0f} MiB, "
                f"{whole['seconds']:.0f} s",
                flush=True,
            )
        return
    for target in targets:
        tiled = child(work, "engine", "realesrgan-x4plus", prepared["store"], target, "fp32", 512, tile, cap)
        whole = child(work, "engine", "realesrgan-x4plus", prepared["store"], target, "fp32", whole_side, 0, cap)
        if "capped" in tiled or "capped" in whole:
            print(f"{target}: stopped past the {mib(cap):.0f} MiB cap (tiled {tiled}, whole {whole})", flush=True)
            continue
        per_pixel = (whole["peak"] - whole["loaded"]) / whole_side**2
        fits = int(((cap - whole["loaded"]) / per_pixel) ** 0.5)
        print(
            f"{target} fp32: loaded {mib(tiled['loaded']):.0f} MiB; 512² input (2048² result) in {tile}-pixel tiles: "
            f"peak {mib(tiled['peak']):.0f} MiB, {tiled['seconds']:.0f} s; whole {whole_side}² input "
            f"({4 * whole_side}² result): peak {mib(whole['peak']):.0f} MiB (+{per_pixel / 1024:.1f} KiB per input "
            f"pixel), {whole['seconds']:.0f} s; whole, the largest square input under {mib(cap):.0f} MiB: about "
            f"{fits}² (512² would peak at about {mib(whole['loaded'] + per_pixel * 512**2):.0f} MiB)",
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sides", default="32,64,128", help="the export's profile sides MIN,OPT,MAX")
    p.add_argument("--side", type=int, default=64, help="input side for the time per megapixel")
    p.add_argument("--rss-side", type=int, default=128, help="input side for peak memory (512: a 2048² result)")
    p.add_argument("--tile", type=int, default=64, help="tile side for the tiled memory run")
    p.add_argument("--work", type=Path, default=None, help="keep the file, export and store here")
    p.add_argument("--peak-2048", action="store_true", help="measure the 2048² result's peaks (see above), fp32")
    p.add_argument("--cap-gib", type=float, default=4.0, help="stop a --peak-2048 child past this RSS")
    p.add_argument("--targets", default=",".join(TARGETS), help="--peak-2048's backends")
    p.add_argument(
        "--whole-side",
        type=int,
        default=0,
        help="--peak-2048: only a whole run at this side, past the built profile (the backend session called directly)",
    )
    args = p.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="filters-upscale-"))
    work.mkdir(parents=True, exist_ok=True)
    prepared = prepare(work.resolve(), _triple(args.sides), ("fp32",) if args.peak_2048 else PRECISIONS)
    if args.peak_2048:
        print(f"export {prepared['export_s']:.0f} s, build {prepared['build_s']:.0f} s (fp32)", flush=True)
        cap, targets = int(args.cap_gib * 2**30), tuple(args.targets.split(","))
        side = args.whole_side or _triple(args.sides)[2]
        peak_2048(work.resolve(), prepared, side, args.tile, cap, targets, past_profile=bool(args.whole_side))
        return
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
