"""First load with a new LoRA against a stock load, and the device cache's growth per LoRA combination, on a built
component with a weight map (the real-size SD 1.5 UNet: docs/large-models.md, "Stable Diffusion 1.5").

Every load runs in a fresh process with the base artifact already cached (a warm start, as an app's second run):
  stock     enginefarm.load(ref) + the first run
  new LoRA  enginefarm.load(ref, loras=[(a LoRA never loaded before, 0.8)]) + the first run: read, merge, apply
  again     the same LoRA once more (what a second run of the app pays)
Each LoRA is kohya-named, rank 8, on every attention projection and feed-forward Linear of the checkpoint (seeded;
a new seed is a new combination). Prints medians, ratios to the stock load and the cache's growth per combination.

    python bench/lora_load.py --store /work/big/sd15/store --home /tmp/lora-home --ref sd15/unet \\
        --checkpoint /work/big/sd15/onnx/unet.safetensors --target openvino:cpu --precision fp16 [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LINEARS = (
    ".to_q.weight",
    ".to_k.weight",
    ".to_v.weight",
    ".to_out.0.weight",
    ".ff.net.0.proj.weight",
    ".ff.net.2.weight",
)

_CHILD = """
import json, sys, time
start = time.perf_counter()
import numpy as np
import enginefarm
ref, target, precision, lora = sys.argv[1:5]
loras = [(lora, 0.8)] if lora != "-" else ()
session = enginefarm.load(ref, target=target, precision=precision, device="cpu", loras=loras)
loaded = time.perf_counter() - start
# floats: cast as needed
session.run({name: np.zeros(shapes["min"], np.float32) for name, shapes in session.artifact.profile.items()})
print(json.dumps({"load_s": loaded, "first_s": time.perf_counter() - start}))
"""


def make_lora(checkpoint: Path, out: Path, seed: int) -> Path:
    from safetensors import safe_open

    from tests.models import lora_file, lora_pair

    with safe_open(str(checkpoint), "np") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys() if k.endswith(LINEARS)}
    layers = {
        name[: -len(".weight")]: (*lora_pair(shape, 8, seed + i), 4.0)
        for i, (name, shape) in enumerate(sorted(shapes.items()))
    }
    return lora_file(out, layers, "kohya")


def run(args, lora: str) -> dict:
    env = dict(os.environ, ENGINEFARM_HOME=str(args.home), ENGINEFARM_STORE=str(args.store))
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, args.ref, args.target, args.precision, lora],
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        sys.exit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cache_bytes(home: Path) -> int:
    return sum(p.stat().st_size for p in (home / "artifacts").rglob("*") if p.is_file())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", type=Path, required=True)
    p.add_argument("--home", type=Path, required=True)
    p.add_argument("--ref", default="sd15/unet")
    p.add_argument(
        "--checkpoint", type=Path, required=True, help="the component's checkpoint: the LoRAs' layer names and shapes"
    )
    p.add_argument("--target", default="openvino:cpu")
    p.add_argument("--precision", default="fp16")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    run(args, "-")  # the base artifact into the cache
    work = Path(tempfile.mkdtemp(prefix="lora-load-"))
    stock, new, again, growth = [], [], [], []
    for i in range(args.repeats):
        lora = make_lora(args.checkpoint, work / f"lora-{i}.safetensors", seed=1000 * i)
        stock.append(run(args, "-")["first_s"])
        before = cache_bytes(args.home)
        new.append(run(args, str(lora))["first_s"])
        growth.append(cache_bytes(args.home) - before)
        again.append(run(args, str(lora))["first_s"])
    base = statistics.median(stock)
    size = os.path.getsize(work / "lora-0.safetensors")
    print(
        f"{args.ref} {args.target} {args.precision}: LoRA of {size / 2**20:.0f} MB (rank 8, kohya), medians of "
        f"{args.repeats}, warm cache"
    )
    print(f"  stock load + first run   {base:7.2f} s")
    print(f"  new LoRA                 {statistics.median(new):7.2f} s   {statistics.median(new) / base:.2f}x stock")
    print(
        f"  the same LoRA again      {statistics.median(again):7.2f} s   {statistics.median(again) / base:.2f}x stock"
    )
    print(f"  cache growth per combination: {', '.join(f'{g / 2**20:.1f} MB' for g in growth)}")


if __name__ == "__main__":
    main()
