"""TensorRT-RTX on a CPU-only machine: build time and stored size per device class, and the on-device compile of a
custom-weights stack, for the SD 1.5 VAE decoder. Needs the real SDK (pip install 'enginefarm[tensorrt-rtx]').

  classes   one fp16 (or --precision) engine per class (sm_75, sm_86, sm_89, sm_120, turing+, ampere+, ada+,
            blackwell+), built through the farm's own code (compile_artifact: the build process, golden samples).
            Build time is the SDK build alone (provenance.build_seconds; the prep is shared and timed once). Stored
            size: the engine raw, with efw1 (what the farm stores), and with plain zstd-3; the golden samples' blob.
  stack     what `enginefarm.load(..., loras=[A, B])` does on a device with the SDK when the stored engine is not
            refittable and CUDA has no GPU (runner/recompile.py): fetch the component's ONNX Runtime artifact, merge
            the stack into its ONNX, compile a real engine, cache it. Timed end to end, then the same stack again
            (cached). Loading the engine needs a GPU, so the timer stops at "engine built and cached".

    .venv/bin/python bench/rtx.py [--precision fp16] [--classes ampere+,turing+] [--no-stack]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import _common

CLASSES = ("sm_75", "sm_86", "sm_89", "sm_120", "turing+", "ampere+", "ada+", "blackwell+")
VAE_ONNX = _common.ROOT / "recipes" / "models" / "sd_vae_decoder.onnx"
VAE_CKPT = _common.ROOT / "recipes" / "models" / "sd_vae_decoder.safetensors"
RECIPE = """
[model]
name = "rtxbench"
version = "1"
[components.vae_decoder]
source = "{source}"
{checkpoint}
precisions = ["{precision}"]
targets = {targets}
[components.vae_decoder.profiles.default]
batch = [1, 1, 1]
height = [32, 32, 64]
width = [32, 32, 64]
[components.vae_decoder.validate]
inputs = {{ latent = {{ low = -3.0, high = 3.0 }} }}
"""


def stored_sizes(path: Path, role: str) -> dict[str, int]:
    from enginefarm.cache.blob_codecs import codec_for, encode_file

    sizes = {"raw": path.stat().st_size}
    for codec in sorted({codec_for(role, sizes["raw"]), "zstd"}):
        with tempfile.TemporaryFile() as out:
            encode_file(path, out, codec)
            sizes[codec] = out.tell()
    return sizes


def classes(work: Path, precision: str, wanted: list[str]) -> None:
    from enginefarm.builder.build import compile_artifact
    from enginefarm.builder.planner import expand
    from enginefarm.builder.prep import prepare
    from enginefarm.builder.recipe import load_recipe
    from enginefarm.errors import EnginefarmError

    recipe = work / "classes.toml"
    recipe.write_text(
        RECIPE.format(
            source=VAE_ONNX,
            checkpoint="",
            precision=precision,
            targets=str([f"tensorrt-rtx:{c}" for c in wanted]).replace("'", '"'),
        )
    )
    jobs = expand(load_recipe(recipe), work / "downloads")
    print(
        f"SD 1.5 VAE decoder {precision}, {VAE_ONNX.stat().st_size / 1e6:.0f} MB ONNX; profile latent 1x4x32x32 .. "
        "1x4x64x64"
    )
    started = time.perf_counter()
    prepare(VAE_ONNX, precision, work / "prep-timing")
    print(
        f"prep (check, onnxsim{', fp16' if precision == 'fp16' else ''}), once for every class: "
        f"{time.perf_counter() - started:.1f} s\n",
        flush=True,
    )
    print(
        f"{'class':12} {'capabilities':38} {'build':>7} {'engine':>10} {'efw1':>10} {'zstd-3':>10} {'efw1/raw':>9} "
        f"{'golden':>8}"
    )
    for job in jobs:
        try:
            manifest, outdir = compile_artifact(job, work / "build", bench=False)
        except EnginefarmError as exc:
            print(f"{job.target.device:12} not built: {exc}")
            continue
        engine = next(f for f in manifest.files if f.role == "engine")
        golden = next((f for f in manifest.files if f.role == "golden"), None)
        sizes = stored_sizes(outdir / engine.path, "engine")
        golden_stored = stored_sizes(outdir / golden.path, "golden")["zstd"] if golden else 0
        caps = ",".join(manifest.constraints["engine"]["compute_capabilities"])
        print(
            f"{job.target.device:12} {caps[:38]:38} {manifest.provenance['build_seconds']:6.1f}s "
            f"{sizes['raw'] / 1e6:8.1f}MB {sizes.get('efw1', 0) / 1e6:8.1f}MB {sizes['zstd'] / 1e6:8.1f}MB "
            f"{sizes.get('efw1', sizes['zstd']) / sizes['raw']:9.3f} {golden_stored / 1e6:6.2f}MB",
            flush=True,
        )
        shutil.rmtree(work / "build" / "jobs", ignore_errors=True)


def stack(work: Path, precision: str) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from lora import lora_files

    from enginefarm.backends import get_backend
    from enginefarm.builder.build import build
    from enginefarm.builder.planner import expand
    from enginefarm.builder.recipe import load_recipe
    from enginefarm.cache.artifacts import read_manifest
    from enginefarm.cache.device_cache import DeviceCache
    from enginefarm.cache.progress import Progress
    from enginefarm.cache.stores.local import LocalStore
    from enginefarm.errors import BackendUnavailable
    from enginefarm.formats.weightmap import read_map
    from enginefarm.runner import recompile
    from enginefarm.runner.custom import Stack

    recipe = work / "stack.toml"
    recipe.write_text(
        RECIPE.format(
            source=VAE_ONNX,
            checkpoint=f'checkpoint = "{VAE_CKPT}"',
            precision=precision,
            targets='["tensorrt-rtx:ampere+", "onnxruntime:cpu"]',
        )
    )
    store = LocalStore(work / "store")
    keys = {}
    print(
        f"\nthe farm: tensorrt-rtx:ampere+ and onnxruntime:cpu, {precision}, with the weight map (checkpoint) ...",
        flush=True,
    )
    for job in expand(load_recipe(recipe), work / "downloads"):
        result = build(job, store, work / "farm", bench=False)
        if result.status != "built":
            sys.exit(f"error: {result.reason}")
        keys[str(job.target)] = result.key
        print(f"  {job.target}: built in {result.seconds:.0f} s")
    rtx = read_manifest(store, keys["tensorrt-rtx:ampere+"])
    ort = read_manifest(store, keys["onnxruntime:cpu"])
    scratch = DeviceCache(work / "scratch")
    wmap = read_map(scratch.fetch(store, ort), ort)
    loras = lora_files(work, wmap.mapped)

    class Said(Progress):
        def message(self, text: str) -> None:
            print(f"    {text}", flush=True)

    backend = get_backend("tensorrt-rtx")
    for attempt in ("first", "again"):
        cache = DeviceCache(work / "device")  # an empty device cache the first time: the ONNX is fetched too
        started = time.perf_counter()
        reason = "loaded (a GPU is here)"
        try:
            recompile.apply_stack(Stack.parse(None, loras), rtx, backend, cache, store, Said())
        except BackendUnavailable as exc:  # loading needs a GPU: the build half is done
            reason = str(exc).split(": ", 1)[-1][:80]
        elapsed = time.perf_counter() - started
        compiled = [
            e.manifest
            for e in cache.entries()
            if e.manifest.target == "tensorrt-rtx:ampere+" and "stack" in e.manifest.options
        ]
        engine_s = compiled[0].provenance.get("stack_seconds", 0) if compiled else 0
        print(
            f"  stack {attempt}: {elapsed:.1f} s to 'engine built and cached' (engine compile {engine_s:.1f} s); "
            f"then: {reason}",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=["fp16", "fp32"], default="fp16")
    parser.add_argument("--classes", default=",".join(CLASSES))
    parser.add_argument("--no-stack", action="store_true")
    parser.add_argument("--no-classes", action="store_true")
    parser.add_argument("--work", type=Path, default=_common.ROOT / ".enginefarm" / "bench-rtx")
    args = parser.parse_args()
    for path in (VAE_ONNX, VAE_CKPT):
        if not path.is_file():
            print(f"error: {path} is missing. Make it: {_common.MAKE_VAE} --checkpoint {VAE_CKPT}", file=sys.stderr)
            return 2
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    os.environ["ENGINEFARM_HOME"] = str(work / "home")
    if not args.no_classes:
        classes(work, args.precision, [c.strip() for c in args.classes.split(",") if c.strip()])
    if not args.no_stack:
        stack(work, args.precision)
    return 0


if __name__ == "__main__":
    sys.exit(main())
