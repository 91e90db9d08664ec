"""Time to apply a LoRA stack against a full build from scratch, per backend, as ratios from one run.

  full build   runner.fallback.compile_on_device: prep (check, onnxsim), backend build, weight map, validation
               against the fp32 ONNX Runtime reference, into an empty device cache (what a device does when
               nothing prebuilt fits)
  apply stack  enginefarm.load(ref, loras=[A, B]) with the base artifact already in the cache: read both LoRAs,
               merge in fp32, then refit in place (backends with `refit`, e.g. TensorRT) or give the merged weights
               to the session as it opens (ONNX Runtime, OpenVINO: Feature.WEIGHTS_AT_LOAD); its output is
               checked to differ from the base's
  again        the same load again
  base load    enginefarm.load(ref) of the base artifact (opening a session, for scale)
  patched      the former path, kept for TensorRT-RTX's on-device recompile: a patched copy of the artifact,
               compiled, cached and loaded (runner.custom.patched_artifact)
  growth       what each path adds to the device cache, as a share of the base artifact's files

LoRA A (kohya names, rank 8, alpha 4) covers every Linear and Conv weight the map places; LoRA B (PEFT names,
rank 4) every other one. Models (--model):
  vae        the SD 1.5 VAE decoder (198 MB): needs recipes/models/sd_vae_decoder.onnx and .safetensors, made once
             in a venv with torch and diffusers:  python recipes/make_sd_vae_decoder.py --checkpoint
             recipes/models/sd_vae_decoder.safetensors
  generated  no torch: Conv 3x3 512→512 ×2, Conv 1x1 512→1024 and three Linear layers 1024↔4096 (about 66 MB),
             exported as torch does (anonymous transposed MatMul weights)

    .venv/bin/python bench/lora.py [--model vae|generated] [--targets onnxruntime:cpu,openvino:cpu]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
VAE_ONNX = ROOT / "recipes" / "models" / "sd_vae_decoder.onnx"
VAE_CKPT = ROOT / "recipes" / "models" / "sd_vae_decoder.safetensors"

RECIPE = """
[model]
name = "lorabench"
version = "1"
[components.body]
source = "{source}"
checkpoint = "{checkpoint}"
precisions = ["fp32"]
targets = {targets}
[components.body.profiles.default.inputs.{input}]
min = {shape}
opt = {shape}
max = {shape}
"""


def generated_model(folder: Path) -> tuple[Path, Path, str, list[int]]:
    """A few large layers in the shape of a torch export; returns (onnx, checkpoint, input name, input shape)."""
    from onnx import TensorProto, helper, numpy_helper

    from enginefarm.formats.safetensors_io import write_safetensors

    rng = np.random.default_rng(0)
    shapes = {
        "conv1.weight": (512, 512, 3, 3),
        "conv2.weight": (512, 512, 3, 3),
        "proj.weight": (1024, 512, 1, 1),
        "ff.up.weight": (4096, 1024),
        "ff.down.weight": (1024, 4096),
        "ff.up2.weight": (4096, 1024),
    }
    ckpt = {k: (rng.normal(0, 1, s) / np.sqrt(np.prod(s[1:]))).astype(np.float32) for k, s in shapes.items()}
    inits = {
        "conv1.weight": ckpt["conv1.weight"],
        "conv2.weight": ckpt["conv2.weight"],
        "onnx::Conv_5": ckpt["proj.weight"],
        "onnx::MatMul_9": ckpt["ff.up.weight"].T,
        "onnx::MatMul_10": ckpt["ff.down.weight"].T,
        "onnx::MatMul_11": ckpt["ff.up2.weight"].T,
        "shape": np.array([1, 1024, 256], np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "conv1.weight"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "conv2.weight"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "onnx::Conv_5"], ["c3"]),
        helper.make_node("Reshape", ["c3", "shape"], ["flat"]),
        helper.make_node("Transpose", ["flat"], ["t"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["t", "onnx::MatMul_9"], ["u"]),
        helper.make_node("Tanh", ["u"], ["ut"]),
        helper.make_node("MatMul", ["ut", "onnx::MatMul_10"], ["d"]),
        helper.make_node("MatMul", ["d", "onnx::MatMul_11"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "lorabench",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256, 4096])],
        [numpy_helper.from_array(np.ascontiguousarray(v), k) for k, v in inits.items()],
    )
    import onnx

    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(folder / "model.onnx")
    )
    write_safetensors(folder / "model.safetensors", ckpt)
    return folder / "model.onnx", folder / "model.safetensors", "x", [1, 512, 16, 16]


def lora_files(folder: Path, mapped: dict) -> list[tuple[Path, float]]:
    """A (kohya, rank 8) over every placed Linear/Conv weight, B (PEFT, rank 4) over every other one."""
    from enginefarm.formats.safetensors_io import write_safetensors

    rng = np.random.default_rng(1)
    a, b = {}, {}
    layers = sorted(n for n, m in mapped.items() if n.endswith(".weight") and len(m.shape) in (2, 4))
    for i, name in enumerate(layers):
        shape, module = mapped[name].shape, name[: -len(".weight")]
        for tensors, rank, kohya in ((a, 8, True), (b, 4, False)) if i % 2 == 0 else ((a, 8, True),):
            down_shape = (rank, *shape[1:]) if len(shape) == 4 else (rank, shape[1])
            up_shape = (shape[0], rank, 1, 1) if len(shape) == 4 else (shape[0], rank)
            down = (rng.normal(0, 1, down_shape) / np.sqrt(np.prod(down_shape[1:]))).astype(np.float32)
            up = (rng.normal(0, 0.05, up_shape)).astype(np.float32)
            if kohya:
                key = "lora_unet_" + module.replace(".", "_")
                tensors.update(
                    {
                        f"{key}.lora_down.weight": down,
                        f"{key}.lora_up.weight": up,
                        f"{key}.alpha": np.array(4.0, np.float32),
                    }
                )
            else:
                tensors.update({f"{module}.lora_A.weight": down, f"{module}.lora_B.weight": up})
    write_safetensors(folder / "a.safetensors", a)
    write_safetensors(folder / "b.safetensors", b)
    print(f"LoRA A: {len(layers)} layers (kohya, rank 8); LoRA B: {(len(layers) + 1) // 2} layers (PEFT, rank 4)")
    return [(folder / "a.safetensors", 0.8), (folder / "b.safetensors", -0.5)]


def du(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def patched_load(loras, manifest, cache, backend, device):
    """The former path: the stack merged into a copy of the artifact, compiled, cached, loaded and run once."""
    from enginefarm.cache.progress import Progress
    from enginefarm.runner.custom import Stack, patched_artifact

    patched, path, _ = patched_artifact(
        Stack.parse(None, loras), manifest, cache.path_of(manifest.build_key), backend, cache, Progress()
    )
    session = backend.load(path, patched, device)
    return session.run(FEEDS)


FEEDS: dict = {}


def timed(fn):
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        choices=["vae", "generated"],
        default="vae" if VAE_CKPT.is_file() and VAE_ONNX.is_file() else "generated",
    )
    parser.add_argument("--targets", default="onnxruntime:cpu,openvino:cpu")
    parser.add_argument("--work", type=Path, default=ROOT / ".enginefarm" / "bench-lora")
    args = parser.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    (work / "model").mkdir(parents=True)
    os.environ.pop("ENGINEFARM_OFFLINE", None)
    (work / "empty-store").mkdir()  # a store that is there and holds nothing: everything is built on this device
    os.environ["ENGINEFARM_STORE"] = str(work / "empty-store")

    import enginefarm
    from enginefarm.backends import Feature, get_backend
    from enginefarm.builder.planner import expand
    from enginefarm.builder.recipe import load_recipe
    from enginefarm.cache.device_cache import DeviceCache
    from enginefarm.formats.weightmap import read_map
    from enginefarm.runner.fallback import compile_on_device

    if args.model == "vae":
        source, checkpoint, input_name, shape = VAE_ONNX, VAE_CKPT, "latent", [1, 4, 32, 32]
    else:
        source, checkpoint, input_name, shape = generated_model(work / "model")
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    recipe = work / "recipe.toml"
    recipe.write_text(
        RECIPE.format(
            source=source, checkpoint=checkpoint, targets=str(targets).replace("'", '"'), input=input_name, shape=shape
        )
    )
    print(f"model: {args.model} ({source.name}, {source.stat().st_size / 1e6:.0f} MB), input {input_name} {shape}")
    feeds = FEEDS
    feeds[input_name] = np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)
    rows, loras = [], None
    for job in expand(load_recipe(recipe), work / "downloads"):
        target = str(job.target)
        os.environ["ENGINEFARM_HOME"] = str(work / f"home-{job.target.backend}")
        cache = DeviceCache(Path(os.environ["ENGINEFARM_HOME"]))
        print(f"\n{target}: full build from scratch ...", flush=True)
        build_s, manifest = timed(partial(compile_on_device, job, cache, lambda step: None))
        wmap = read_map(cache.path_of(manifest.build_key), manifest)
        print(f"  weight map: {len(wmap.mapped)} tensors placed, {len(wmap.unmatched)} unmatched")
        if loras is None:
            loras = lora_files(work / "model", wmap.mapped)
        load = partial(enginefarm.load, "lorabench/body", precision="fp32", device="cpu", target=target)
        base_s, base = timed(load)
        base_out = next(iter(base.run(feeds).values()))
        home = Path(os.environ["ENGINEFARM_HOME"])
        base_bytes = sum(f.size for f in manifest.files)
        before = du(home)
        apply_s, stacked = timed(partial(load, loras=loras))
        growth = du(home) - before
        out = next(iter(stacked.run(feeds).values()))
        cached_s, again = timed(partial(load, loras=loras))
        same = np.array_equal(next(iter(again.run(feeds).values())), out)
        cos = float(np.dot(out.ravel(), base_out.ravel()) / (np.linalg.norm(out) * np.linalg.norm(base_out)))
        backend = get_backend(job.target.backend)
        path = (
            "refit"
            if backend.has(Feature.REFIT)
            else "at load"
            if backend.has(Feature.WEIGHTS_AT_LOAD)
            else "patch + recompile"
        )
        before = du(home)
        patched_s, patched_out = timed(partial(patched_load, loras, manifest, cache, backend, job.target.device))
        patched_growth = du(home) - before
        agree = float(np.abs(next(iter(patched_out.values())) - out).max())
        rows.append(
            (
                target,
                path,
                build_s,
                apply_s,
                cached_s,
                base_s,
                patched_s,
                growth / base_bytes,
                patched_growth / base_bytes,
                cos,
                same,
                agree,
            )
        )
        print(
            f"  build {build_s:.1f} s, apply {apply_s:.2f} s ({path}), again {cached_s:.2f} s, base load {base_s:.2f} "
            f"s, patched copy {patched_s:.2f} s",
            flush=True,
        )

    print(
        f"\n{'target':18} {'path':8} {'build':>7} {'base load':>10} {'apply':>7} {'÷ base':>7} {'again':>7} "
        f"{'growth':>7} {'patched':>8} {'÷ base':>7} {'growth':>7}  output"
    )
    for target, path, build_s, apply_s, cached_s, base_s, patched_s, growth, patched_growth, cos, same, agree in rows:
        print(
            f"{target:18} {path:8} {build_s:6.1f}s {base_s:9.2f}s {apply_s:6.2f}s {apply_s / base_s:7.2f} "
            f"{cached_s:6.2f}s {growth:7.1%} {patched_s:7.2f}s {patched_s / base_s:7.2f} {patched_growth:7.1%}  "
            f"cosine to base {cos:.4f}, again identical: {same}, max |at load − patched| {agree:.1e}"
        )
    if not any(r[1] == "refit" for r in rows):
        print("refit: no backend on this machine has refit (TensorRT does); its path is the same load() call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
