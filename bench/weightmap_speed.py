#!/usr/bin/env python3
"""The weight map's speed at real size: `derive()` timed on its own, each model in a fresh process (its own peak RSS).

    python bench/weightmap_speed.py --make /tmp/wm                 # a synthetic ~2 GB model (below), then time it
    python bench/weightmap_speed.py --pair a.safetensors a.onnx    # a real component's checkpoint and fp32 ONNX
    python bench/weightmap_speed.py --make /tmp/wm --impl old.py --impl formats/weightmap.py --out maps/

The synthetic model is a transformer-like stack whose ONNX holds what exports do to a checkpoint: Linear weights
transposed (onnx::MatMul_…), to_q/to_k/to_v and their biases fused, norms of ones and zero biases (some under their
own names, some anonymous), an embedding tied to the LM head (a copy in the checkpoint, a transposed MatMul weight in
the graph), a conv weight, a tensor in no graph and an integer one. Values are seeded: the same model each time.

`--impl` times another weightmap.py (say the one before a change, from `git show REV:formats/weightmap.py`), loaded in
the place of enginefarm.formats.weightmap; with `--out`, each run's map is written there and the maps are compared.
Speed is the checkpoint's size over the time (GB/s); peak is the child's maximum resident memory (file pages mapped
from the model and the checkpoint included), and `before` the same just before derive() started.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _tensors(layers: int, width: int, vocab: int):
    """(checkpoint name → array, initializer name → array) of one part of the model at a time."""
    rng = np.random.default_rng(0)
    d = width
    normal = lambda *shape: rng.normal(0, 0.02, shape).astype(np.float32)  # noqa: E731
    embed = normal(vocab, d)
    yield {"embed.weight": embed, "lm_head.weight": embed.copy()}, {"embed.weight": embed, "onnx::MatMul_head": embed.T}
    conv = normal(320, 4, 3, 3)
    yield {"conv_in.weight": conv}, {"onnx::Conv_0": conv}
    for i in range(layers):
        p, kept = f"layers.{i}.", i % 2 == 0
        q, k, v, out = normal(d, d), normal(d, d), normal(d, d), normal(d, d)
        bq, bk, bv = normal(d), normal(d), normal(d)
        ckpt = {
            p + "attn.to_q.weight": q,
            p + "attn.to_k.weight": k,
            p + "attn.to_v.weight": v,
            p + "attn.to_q.bias": bq,
            p + "attn.to_k.bias": bk,
            p + "attn.to_v.bias": bv,
            p + "attn.to_out.weight": out,
            p + "attn.to_out.bias": np.zeros(d, np.float32),
        }
        onnx = {
            f"onnx::MatMul_qkv_{i}": np.concatenate([q.T, k.T, v.T], axis=1),
            f"onnx::Add_qkv_{i}": np.concatenate([bq, bk, bv]),
            f"onnx::MatMul_out_{i}": out.T,
            p + "attn.to_out.bias": np.zeros(d, np.float32),
        }
        yield ckpt, onnx
        for norm in ("norm1", "norm2"):
            ones, zeros = np.ones(d, np.float32), np.zeros(d, np.float32)
            ckpt = {p + norm + ".weight": ones, p + norm + ".bias": zeros}
            names = (
                (p + norm + ".weight", p + norm + ".bias") if kept else (f"onnx::Mul_{i}{norm}", f"onnx::Add_{i}{norm}")
            )
            yield ckpt, {names[0]: ones if kept else ones.reshape(d, 1), names[1]: zeros}
        up, down = normal(4 * d, d), normal(d, 4 * d)
        up_bias, down_bias = normal(4 * d), normal(d)
        yield (
            {
                p + "mlp.up.weight": up,
                p + "mlp.up.bias": up_bias,
                p + "mlp.down.weight": down,
                p + "mlp.down.bias": down_bias,
            },
            {
                f"onnx::MatMul_up_{i}": up.T,
                p + "mlp.up.bias": up_bias,
                f"onnx::MatMul_down_{i}": down.T,
                f"onnx::Add_down_{i}": down_bias,
            },
        )
    yield {"unused.weight": normal(d, d)}, {}


def make(folder: Path, layers: int, width: int, vocab: int) -> tuple[Path, Path]:
    """Write model.safetensors and model.onnx (+ model.onnx.data) into `folder`, a part at a time."""
    import onnx
    from onnx import TensorProto, helper

    folder.mkdir(parents=True, exist_ok=True)
    ckpt_path, onnx_path = folder / "model.safetensors", folder / "model.onnx"
    shapes = {}  # the safetensors header needs every shape first: one pass for shapes, one to write (same seed)
    for ckpt, _ in _tensors(layers, width, vocab):
        shapes.update({name: a.shape for name, a in ckpt.items()})
    header, offset = {}, 0
    for name, shape in [*shapes.items(), ("position_ids", (1, 77))]:
        size = int(np.prod(shape)) * (8 if name == "position_ids" else 4)
        header[name] = {
            "dtype": "I64" if name == "position_ids" else "F32",
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    inits = []
    with open(ckpt_path, "wb") as ck, open(folder / "model.onnx.data", "wb") as data:
        ck.write(struct.pack("<Q", len(raw)) + raw)
        for ckpt, graph in _tensors(layers, width, vocab):
            for array in ckpt.values():
                ck.write(np.ascontiguousarray(array).tobytes())
            for name, array in graph.items():
                start = data.tell()
                data.write(np.ascontiguousarray(array).tobytes())
                tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=array.shape)
                tensor.data_location = TensorProto.EXTERNAL
                for key, value in (("location", "model.onnx.data"), ("offset", start), ("length", data.tell() - start)):
                    tensor.external_data.add(key=key, value=str(value))
                inits.append(tensor)
        ck.write(np.arange(77, dtype=np.int64).tobytes())
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "synthetic",
        [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        inits,
    )
    onnx.save(helper.make_model(graph), str(onnx_path))
    return ckpt_path, onnx_path


def measure(impl: str, checkpoint: str, onnx_path: str, out: str) -> None:
    """In this (child) process: derive() once; one JSON line of what it took."""
    import importlib.util
    import resource

    module = "enginefarm.formats.weightmap"
    if impl:  # another weightmap.py, in the package so its relative imports resolve
        spec = importlib.util.spec_from_file_location("enginefarm.builder._weightmap_timed", impl)
        loaded = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look themselves up
        spec.loader.exec_module(loaded)
    else:
        import importlib

        loaded = importlib.import_module(module)
    import onnx  # noqa: F401

    import enginefarm.formats.onnx_data  # noqa: F401  (imported before the clock starts, as in a build)

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    found = loaded.derive(Path(checkpoint), "bench", Path(onnx_path))
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if out:
        Path(out).write_bytes(found.to_json())
    size = Path(checkpoint).stat().st_size
    row = {"seconds": round(seconds, 2), "gb_per_s": round(size / seconds / 1e9, 3), "peak_gb": round(peak / 2**20, 2)}
    row.update(before_gb=round(before / 2**20, 2), mapped=len(found.mapped), unmatched=len(found.unmatched))
    print(json.dumps(row))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--make", type=Path, help="write the synthetic model into this folder (kept if already there)")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--pair", nargs=2, action="append", default=[], metavar=("SAFETENSORS", "ONNX"))
    p.add_argument("--impl", action="append", default=[], help="a weightmap.py to time (default: the installed one)")
    p.add_argument("--out", type=Path, help="write each map here and compare them")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return measure(*args.child)
    pairs = [tuple(map(Path, pair)) for pair in args.pair]
    if args.make:
        ready = (args.make / "model.safetensors", args.make / "model.onnx")
        pairs.insert(
            0, ready if all(f.exists() for f in ready) else make(args.make, args.layers, args.width, args.vocab)
        )
    impls = args.impl or [""]
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    for checkpoint, onnx_path in pairs:
        maps = []
        for n, impl in enumerate(impls):
            out = str(args.out / f"{checkpoint.stem}-{onnx_path.parent.name}-{n}.json") if args.out else ""
            command = [sys.executable, __file__, "--child", impl, str(checkpoint), str(onnx_path), out]
            child = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
            if child.returncode:
                sys.exit(f"{impl or 'installed'} on {checkpoint} failed:\n{child.stderr[-3000:]}")
            row = json.loads(child.stdout.splitlines()[-1])
            print(f"{checkpoint} ({checkpoint.stat().st_size / 1e9:.2f} GB)  {impl or 'installed'}: {json.dumps(row)}")
            maps.append(out)
        if args.out and len(maps) > 1:
            same = len({Path(m).read_bytes() for m in maps}) == 1
            print(f"  maps {'identical' if same else 'DIFFER'} across {len(maps)} implementations")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
