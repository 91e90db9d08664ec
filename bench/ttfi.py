"""Warm-cache time to first inference: `enginefarm.load` vs bare OpenVINO on the SD VAE decoder (CPU).

  bare        ov.Core().read_model(original ONNX) + compile_model(model, "CPU",
              {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}) + first infer
  enginefarm  enginefarm.load(ref, precision="fp32", device="cpu", target="openvino:cpu") + first .run
              (the artifact is fetched into the local cache before anything is timed: a warm cache)

Every measurement runs in a fresh Python subprocess. The clock starts in the child after numpy is
imported and the input is read, *before* `import openvino` / `import enginefarm`: import time counts in
both. It stops when the first inference returns. The two kinds alternate, --repeats times each (default
3), after one untimed warm-up of each (so the OS file cache is warm for both). All use one seeded latent
at the profile's opt shape. Reports medians, the ratio enginefarm / bare, and each child's peak RSS.
A benchmark, not a test: it prints numbers and never fails on them.

    .venv/bin/python bench/ttfi.py [--repeats 3] [--store DIR] [--home DIR] [--recipe R]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import _common

TARGET_RATIO = 1.10
KINDS = ("bare", "enginefarm")


def child(kind: str, ref: str, onnx: str, feeds_path: str, out_path: str) -> None:
    import resource

    latent = np.load(feeds_path)
    t0 = time.perf_counter()
    if kind == "bare":
        import openvino as ov

        core = ov.Core()
        compiled = core.compile_model(core.read_model(onnx), "CPU", {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"})
        request = compiled.create_infer_request()
        t1 = time.perf_counter()
        sample = np.array(request.infer({"latent": latent})[compiled.outputs[0]])
    else:
        import enginefarm

        session = enginefarm.load(ref, precision="fp32", device="cpu", target="openvino:cpu")
        t1 = time.perf_counter()
        sample = next(iter(session.run({"latent": latent}).values()))
    t2 = time.perf_counter()
    np.save(out_path, sample)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"ready_ms": (t1 - t0) * 1000, "first_ms": (t2 - t1) * 1000, "ttfi_ms": (t2 - t0) * 1000, "rss_mb": rss_mb}))


def spawn(kind: str, args, onnx: Path, feeds: Path, out: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--ref", args.ref, "--onnx", str(onnx), "--feeds", str(feeds), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"error: {kind} child exited {proc.returncode}:\n{proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = _common.parser(__doc__)
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each kind (default 3)")
    for hidden in ("--child", "--onnx", "--feeds", "--out"):  # the child's own options
        p.add_argument(hidden, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child, args.ref, args.onnx, args.feeds, args.out)
    _common.setup(args)
    onnx = _common.source_onnx(args.recipe, args.ref.partition("/")[2])
    _common.ensure_built(args, "--target", "openvino:cpu", "--precision", "fp32")
    started = time.perf_counter()

    from enginefarm.runner.load import fetch

    manifest, _, _ = fetch(args.ref, precision="fp32", device="cpu", store=str(args.store), target="openvino:cpu")  # warms the cache
    blob = any(f.role == "engine" for f in manifest.files)
    tmp = Path(tempfile.mkdtemp(prefix="ttfi-"))
    feeds = tmp / "latent.npy"
    np.save(feeds, _common.opt_feeds(manifest)["latent"])
    print(f"{args.ref} fp32 openvino:cpu [{manifest.build_key[:12]}] ({'ships a compiled blob' if blob else 'IR only'}), "
          f"latent {list(np.load(feeds).shape)}, {args.repeats} repeats + 1 untimed warm-up per kind", flush=True)

    results: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    for r in range(args.repeats + 1):
        for kind in KINDS:
            got = spawn(kind, args, onnx, feeds, tmp / f"{kind}.npy")
            print(f"  {'warm-up' if r == 0 else f'repeat {r}':<8} {kind:<11} ttfi {got['ttfi_ms']:8.0f} ms  peak RSS {got['rss_mb']:6.0f} MB", flush=True)
            if r:
                results[kind].append(got)
    diff = float(np.max(np.abs(np.load(tmp / "bare.npy") - np.load(tmp / "enginefarm.npy"))))

    med = {kind: {f: statistics.median(x[f] for x in rows) for f in ("ready_ms", "first_ms", "ttfi_ms", "rss_mb")} for kind, rows in results.items()}
    print(f"\n{'medians':<12}{'load ms':>10}{'1st run ms':>12}{'TTFI ms':>10}{'peak RSS MB':>13}")
    for kind in KINDS:
        m = med[kind]
        print(f"{kind:<12}{m['ready_ms']:>10.0f}{m['first_ms']:>12.0f}{m['ttfi_ms']:>10.0f}{m['rss_mb']:>13.0f}")
    print("(load = import + read/compile or enginefarm.load; TTFI = load + first inference; import time counted in both)")
    print(f"outputs agree: max |bare - enginefarm| = {diff:.2e}")
    print(f"\nTTFI ratio (enginefarm / bare): {med['enginefarm']['ttfi_ms'] / med['bare']['ttfi_ms']:.2f} (target <= {TARGET_RATIO:.2f})")
    print(f"peak RSS ratio (enginefarm / bare): {med['enginefarm']['rss_mb'] / med['bare']['rss_mb']:.2f}")
    print(f"measured in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
