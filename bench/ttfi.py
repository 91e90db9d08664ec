"""Time to first inference: `enginefarm.load` vs bare OpenVINO on the same files (CPU), warm and cold.

  bare        ov.Core().read_model(the artifact's model.xml, in the local cache) + compile_model(model, "CPU",
              the config enginefarm uses: INFERENCE_PRECISION_HINT f32 (fp32) or f16 (fp16), PERFORMANCE_HINT LATENCY)
              + first infer. With --bare-reads source: the original ONNX instead (what a user without enginefarm has).
  enginefarm  enginefarm.load(ref, precision=P, device="cpu", target="openvino:cpu") + first .run
    warm      the artifact is already in the local cache (fetched before anything is timed)
    cold      (--cold) an empty local cache each time: the fetch from the store (a local folder here) is timed too

Every measurement runs in a fresh Python subprocess. The clock starts in the child after numpy is imported and the
inputs are read, *before* `import openvino` / `import enginefarm`: import time counts in both. It stops when the
first inference returns. The kinds alternate, --repeats times each (default 3), after one untimed warm-up of each
(so the OS file cache is warm for all). Inputs are seeded, at the profile's opt shape. Reports medians, the ratio
enginefarm / bare, and each child's peak RSS (its own VmHWM). A benchmark, not a test: it never fails on numbers.

    .venv/bin/python bench/ttfi.py [--ref sd15/unet --recipe recipes/models/sd15/recipe.toml]
                                   [--precision fp16] [--cold] [--repeats 3] [--store DIR] [--home DIR]
                                   [--bare-reads artifact|source]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common
import numpy as np

TARGET_RATIO = 1.10


def child(kind: str, ref: str, precision: str, model: str, feeds_path: str, out_path: str) -> None:
    with np.load(feeds_path) as data:
        feeds = {name: data[name] for name in data.files}
    t0 = time.perf_counter()
    if kind == "bare":
        import openvino as ov

        core = ov.Core()
        hint = (
            "f16" if precision == "fp16" and "FP16" in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES") else "f32"
        )
        compiled = core.compile_model(
            core.read_model(model), "CPU", {"INFERENCE_PRECISION_HINT": hint, "PERFORMANCE_HINT": "LATENCY"}
        )
        request = compiled.create_infer_request()
        t1 = time.perf_counter()
        sample = np.array(request.infer(feeds)[compiled.outputs[0]])
    else:
        import enginefarm

        session = enginefarm.load(ref, precision=precision, device="cpu", target="openvino:cpu")
        t1 = time.perf_counter()
        sample = next(iter(session.run(feeds).values()))
    t2 = time.perf_counter()
    np.save(out_path, sample)
    print(
        json.dumps(
            {
                "ready_ms": (t1 - t0) * 1000,
                "first_ms": (t2 - t1) * 1000,
                "ttfi_ms": (t2 - t0) * 1000,
                "rss_mb": _peak_mb(),
            }
        )
    )


def _peak_mb() -> float:
    """This process's own peak RSS (VmHWM; ru_maxrss where there is no /proc): read here, not through enginefarm, so
    the bench also measures older enginefarm versions."""
    try:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM:"))
        return int(line.split()[1]) / 1024
    except (OSError, StopIteration):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def spawn(kind: str, args, model: Path, feeds: Path, out: Path, home: Path) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        kind.split()[0],
        "--ref",
        args.ref,
        "--precision",
        args.precision,
        "--model",
        str(model),
        "--feeds",
        str(feeds),
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "ENGINEFARM_HOME": str(home)})
    if proc.returncode != 0:
        sys.exit(f"error: {kind} child exited {proc.returncode}:\n{proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = _common.parser(__doc__)
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each kind (default 3)")
    p.add_argument("--precision", choices=["fp32", "fp16"], default="fp32")
    p.add_argument(
        "--cold", action="store_true", help="also time enginefarm with an empty local cache (fetch included)"
    )
    p.add_argument(
        "--bare-reads",
        choices=["artifact", "source"],
        default="artifact",
        help="what bare OpenVINO reads: the artifact's IR in the cache (the same files; default) or the original ONNX",
    )
    for hidden in ("--child", "--model", "--feeds", "--out"):  # the child's own options
        p.add_argument(hidden, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child, args.ref, args.precision, args.model, args.feeds, args.out)
    _common.setup(args)
    onnx = _common.source_onnx(args.recipe, args.ref.partition("/")[2])
    _common.ensure_built(args, "--target", "openvino:cpu", "--precision", args.precision)
    started = time.perf_counter()

    from enginefarm.runner.load import fetch
    from enginefarm.runner.request import Request

    asked = Request(args.ref, precision=args.precision, device="cpu", store=str(args.store), target="openvino:cpu")
    manifest, folder, _ = fetch(asked)  # warms the cache
    blob = any(f.role == "engine" for f in manifest.files)
    model = onnx if args.bare_reads == "source" else folder / next(f.path for f in manifest.files if f.role == "ir")
    tmp = Path(tempfile.mkdtemp(prefix="ttfi-"))
    feeds = tmp / "feeds.npz"
    np.savez(feeds, **_common.opt_feeds(manifest))
    size = sum(f.size for f in manifest.files)
    print(
        f"{args.ref} {args.precision} openvino:cpu [{manifest.build_key[:12]}] "
        f"({'ships a compiled blob' if blob else 'IR only'}, {size / 2**20:.0f} MiB), inputs "
        f"{[list(v.shape) for v in np.load(feeds).values()]}; bare reads {model}; {args.repeats} repeats + 1 untimed "
        "warm-up per kind",
        flush=True,
    )

    kinds = ["bare", "enginefarm warm"] + (["enginefarm cold"] if args.cold else [])
    results: dict[str, list[dict]] = {kind: [] for kind in kinds}
    for r in range(args.repeats + 1):
        for kind in kinds:
            home = args.home
            if kind == "enginefarm cold":
                home = tmp / "cold-home"
                shutil.rmtree(home, ignore_errors=True)
            got = spawn(kind, args, model, feeds, tmp / f"{kind.split()[0]}.npy", home)
            print(
                f"  {'warm-up' if r == 0 else f'repeat {r}':<8} {kind:<16} ttfi {got['ttfi_ms']:8.0f} ms  peak RSS "
                f"{got['rss_mb']:6.0f} MB",
                flush=True,
            )
            if r:
                results[kind].append(got)
    diff = float(np.max(np.abs(np.load(tmp / "bare.npy") - np.load(tmp / "enginefarm.npy"))))
    shutil.rmtree(tmp, ignore_errors=True)

    med = {
        kind: {f: statistics.median(x[f] for x in rows) for f in ("ready_ms", "first_ms", "ttfi_ms", "rss_mb")}
        for kind, rows in results.items()
    }
    print(f"\n{'medians':<18}{'load ms':>10}{'1st run ms':>12}{'TTFI ms':>10}{'peak RSS MB':>13}")
    for kind in kinds:
        m = med[kind]
        print(f"{kind:<18}{m['ready_ms']:>10.0f}{m['first_ms']:>12.0f}{m['ttfi_ms']:>10.0f}{m['rss_mb']:>13.0f}")
    print(
        "(load = import + read/compile or enginefarm.load; TTFI = load + first inference; import time counted in both)"
    )
    print(f"outputs agree: max |bare - enginefarm| = {diff:.2e}")
    print(
        f"\nwarm TTFI ratio (enginefarm / bare): {med['enginefarm warm']['ttfi_ms'] / med['bare']['ttfi_ms']:.2f} "
        f"(target <= {TARGET_RATIO:.2f})"
    )
    if args.cold:
        print(
            "cold TTFI ratio (enginefarm with an empty cache, fetch included / bare): "
            f"{med['enginefarm cold']['ttfi_ms'] / med['bare']['ttfi_ms']:.2f}"
        )
    print(f"peak RSS ratio (enginefarm warm / bare): {med['enginefarm warm']['rss_mb'] / med['bare']['rss_mb']:.2f}")
    print(f"measured in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
