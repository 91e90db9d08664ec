"""`Pipeline.set_loras` against a fresh `Pipeline.load` with the same LoRA, per backend, on a built pipeline whose UNet
has a weight map (the real-config SD 1.5 of docs/large-models.md, random weights):

    python recipes/make_real_pipeline.py sd15 --out /tmp/sd15
    enginefarm export /tmp/sd15 --out /tmp/sd15-onnx --name sd15 --precisions fp16 --batch 1,1,1 --latent 16,16,16
    enginefarm build /tmp/sd15-onnx/recipe.toml --store /tmp/sd15-store --precision fp16 --no-bench
    python bench/set_loras.py --export /tmp/sd15-onnx --store /tmp/sd15-store --home /tmp/sd15-home

Each row is a fresh process with the artifacts already cached (an app's second start):
  stock       Pipeline.load(name)
  fresh       Pipeline.load(name, loras=[(A, 0.8)]): A never loaded before in that process
  strength    then, in that process, set_loras([(A, 0.5)]): a strength change
  new LoRA    then set_loras([(A, 0.5), (B, 0.7)]): B read and merged; it touches the same weights as A
and the one-step latent after `strength` is compared with a fresh load of [(A, 0.5)] in another process (it must be
equal). A and B are kohya, rank 8, on every attention projection and feed-forward Linear of the UNet (seeded; see
bench/lora_load.py). Prints medians and the ratios to the fresh load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

_CHILD = """
import json, sys, time
import numpy as np
from enginefarm.diffusion import Pipeline
name, assets, target, a, b, out = sys.argv[1:7]
def load(loras=()):
    start = time.perf_counter()
    pipe = Pipeline.load(name, target=target, precision="fp16", device="cpu", assets=assets, loras=loras)
    return pipe, time.perf_counter() - start
def one_step(pipe):
    start = np.random.default_rng(0).standard_normal((1, 4, 16, 16)).astype(np.float32)
    begin = time.perf_counter()
    latent = pipe("a lighthouse", steps=1, latents=start, width=128, height=128, output_type="latent")
    return latent, time.perf_counter() - begin
found = {}
if a == "-":
    pipe, found["stock"] = load()
    _, found["first_call_stock"] = one_step(pipe)
    _, found["second_call_stock"] = one_step(pipe)
elif b == "-":  # the reference: a fresh load with A at 0.5
    pipe, found["fresh_05"] = load([(a, 0.5)])
    latent, _ = one_step(pipe)
    np.save(out, latent)
else:
    pipe, found["fresh"] = load([(a, 0.8)])
    _, found["first_call_fresh"] = one_step(pipe)
    start = time.perf_counter()
    pipe.set_loras([(a, 0.5)])
    found["strength"] = time.perf_counter() - start
    found["strength_stages"] = {k: v for k, v in pipe.timings.items() if k.startswith("set_loras")}
    latent, found["first_call_after"] = one_step(pipe)
    _, found["second_call_after"] = one_step(pipe)
    np.save(out, latent)
    start = time.perf_counter()
    pipe.set_loras([(a, 0.5), (b, 0.7)])
    found["new_lora"] = time.perf_counter() - start
print(json.dumps(found))
"""


def run(args, name: str, target: str, a: str, b: str, out: Path) -> dict:
    env = dict(os.environ, ENGINEFARM_HOME=str(args.home), ENGINEFARM_STORE=str(args.store))
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, name, str(args.export / "assets"), target, a, b, str(out)],
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        sys.exit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    import numpy as np
    from lora_load import make_lora

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--export", type=Path, required=True, help="the `enginefarm export` folder (recipe, assets)")
    p.add_argument("--store", type=Path, required=True)
    p.add_argument("--home", type=Path, required=True)
    p.add_argument("--targets", default="onnxruntime:cpu,openvino:cpu")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    recipe = tomllib.loads((args.export / "recipe.toml").read_text())
    name = recipe["model"]["name"]
    checkpoint = args.export / recipe["components"]["unet"]["checkpoint"]
    work = Path(tempfile.mkdtemp(prefix="set-loras-"))
    for target in args.targets.split(","):
        rows: dict[str, list[float]] = {}
        stages: list[dict] = []
        equal = []
        run(args, name, target, "-", "-", work / "x.npy")  # the artifacts into the cache
        for i in range(args.repeats):
            a = make_lora(checkpoint, work / f"a-{target}-{i}.safetensors", seed=1000 * i + 1)
            b = make_lora(checkpoint, work / f"b-{target}-{i}.safetensors", seed=1000 * i + 2)
            for key, value in run(args, name, target, "-", "-", work / "x.npy").items():
                rows.setdefault(key, []).append(value)
            found = run(args, name, target, str(a), str(b), work / "set.npy")
            stages.append(found.pop("strength_stages"))
            for key, value in found.items():
                rows.setdefault(key, []).append(value)
            run(args, name, target, str(a), "-", work / "fresh.npy")
            equal.append(float(np.abs(np.load(work / "set.npy") - np.load(work / "fresh.npy")).max()))
        median = {key: statistics.median(values) for key, values in rows.items()}
        fresh = median["fresh"]
        print(f"{name} {target} fp16, medians of {args.repeats}, warm cache (each row a fresh process)")
        for key, label in [
            ("stock", "Pipeline.load, no LoRA"),
            ("fresh", "Pipeline.load, LoRA A"),
            ("strength", "set_loras: A's strength"),
            ("new_lora", "set_loras: + LoRA B"),
            ("first_call_stock", "one step, stock"),
            ("second_call_stock", "again, stock"),
            ("first_call_fresh", "one step after the load"),
            ("first_call_after", "one step after set_loras"),
            ("second_call_after", "again, after set_loras"),
        ]:
            print(f"  {label:28s} {median[key]:7.2f} s   {median[key] / fresh:.3f}x the fresh load")
        print(f"  set_loras stages (last run): {', '.join(f'{k} {v:.2f} s' for k, v in stages[-1].items())}")
        print(f"  latent after set_loras vs a fresh load, max abs: {max(equal):.3g}")


if __name__ == "__main__":
    main()
