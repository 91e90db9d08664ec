"""What `Pipeline.close()` gives back: RSS before the load, after it (and one image), after close, per backend, and
the RSS after each of CYCLES load → image → close cycles in one process, with its slope per cycle.

The model is the tiny SD 1.x (tests/tiny_pipelines.py), exported with latent 8..16 (or `--latent`) and batch 1..2,
built for ONNX Runtime and OpenVINO at PRECISION. `--unet-width W` swaps its UNet for SD 1.5's layout at channels
W..4W (160: 0.22 G parameters); `--full-size` also swaps in SD 1.5's text encoder and VAE architectures (random
weights, no download). Each backend runs in a fresh process of its own, which measures its own RSS (/proc/self):
"before" after importing enginefarm.diffusion, "SDK" after importing the backend's SDK (its libraries stay loaded,
whatever happens to the sessions), "kept" is closed minus SDK after the first cycle. Each backend runs cold (an empty
cache: the first load fetches) and warm (the same cache, a new process). A benchmark, not a test: it never fails on
numbers.

    .venv/bin/python bench/close_memory.py [--unet-width 160 --full-size] [--cycles 20] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from families import _cli, _tiny_pipelines  # bench/families.py: the tiny pipelines and the CLI

BACKENDS = ("onnxruntime:cpu", "openvino:cpu")

_CHILD = """
import importlib, json, sys
from enginefarm.hardware.rss import current_bytes
from enginefarm.diffusion import Pipeline
name, store, assets, target, precision, cycles, size = sys.argv[1:8]
size = int(size)
def mb():
    return current_bytes() / 2**20
before = mb()
importlib.import_module(target.split(":")[0])  # the SDK's libraries: they stay, whatever happens to the sessions
sdk = mb()
def cycle():
    pipe = Pipeline.load(name, store=store, assets=assets, target=target, precision=precision, device="cpu")
    pipe("a lighthouse at dawn", steps=2, width=size, height=size, seed=0)
    loaded = mb()
    pipe.close()
    return loaded
loaded = cycle()
closed = [mb()]
for _ in range(int(cycles) - 1):
    cycle()
    closed.append(mb())
print(json.dumps({"before": before, "sdk": sdk, "loaded": loaded, "closed": closed}))
"""


def build(work: Path, unet_width: int | None, full_size: bool, latent: int, precision: str) -> tuple[Path, Path]:
    """The export folder and the store, built once per --work folder."""
    out, store = work / "export", work / "store"
    if (out / "recipe.toml").is_file():
        return out, store
    source = _tiny_pipelines().make_tiny_pipeline("sd1", work / "source")
    if unet_width is not None:
        from batch import sd15_layout_unet  # bench/batch.py

        sd15_layout_unet(unet_width).save_pretrained(source / "unet")
    if full_size:
        _full_size_text_and_vae(source)
    _cli("export", str(source), "--out", str(out), "--latent", f"8,{latent},{latent}", "--batch", "1,2,2")
    # random weights at SD 1.5's depth: OpenVINO's fp32 UNet lands 0.7% of the output's range from ONNX's
    recipe = out / "recipe.toml"
    table = "[components.unet.validate]\n"
    recipe.write_text(recipe.read_text().replace(table, table + "max_abs_rel = 0.02\n"))
    _cli("build", str(out / "recipe.toml"), "--store", str(store), "--no-bench", "-j", "2", "--precision", precision)
    return out, store


def _full_size_text_and_vae(source: Path) -> None:
    """SD 1.5's CLIP text encoder (12 layers, 768 wide; the tiny tokenizer's vocabulary) and VAE, random weights."""
    import torch
    from diffusers import AutoencoderKL
    from transformers import CLIPTextConfig, CLIPTextModel

    from enginefarm.builder.catalog_configs import class_config

    torch.manual_seed(0)
    tiny = CLIPTextConfig.from_pretrained(source / "text_encoder")
    ids = {k: getattr(tiny, k) for k in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")}
    config = CLIPTextConfig(**class_config("sd-1.5", "text_encoder/config.json", **ids))
    CLIPTextModel(config).eval().save_pretrained(source / "text_encoder")
    AutoencoderKL(**class_config("sd-1.5", "vae/config.json")).eval().save_pretrained(source / "vae")


def measure(out: Path, store: Path, home: Path, target: str, precision: str, cycles: int, size: int) -> dict:
    name = tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]
    args = [name, str(store), str(out / "assets"), target, precision, str(cycles), str(size)]
    env = dict(os.environ, ENGINEFARM_HOME=str(home))
    proc = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"{target}: failed\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def slope(values: list[float]) -> float:
    """Least-squares MB per cycle."""
    n = len(values)
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    den = sum((x - mean_x) ** 2 for x in range(n))
    return sum((x - mean_x) * (y - mean_y) for x, y in enumerate(values)) / den if den else 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--unet-width", type=int, default=None, help="SD 1.5's UNet layout at this width (320: real)")
    p.add_argument("--full-size", action="store_true", help="SD 1.5's text encoder and VAE architectures too")
    p.add_argument("--latent", type=int, default=16, help="the profile's largest latent side (image side / 8)")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--cycles", type=int, default=20)
    p.add_argument("--work", type=Path, default=None, help="folder to build in (default: a temporary one)")
    args = p.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-close-"))
    print(f"building in {work}", flush=True)
    out, store = build(work, args.unet_width, args.full_size, args.latent, args.precision)
    size = args.latent * 8
    print(f"{args.cycles} cycles of load → one {size} px image (2 steps) → close, {args.precision}; MB of RSS")
    print("cold: one cycle whose load fetches into an empty cache; warm: the same cache again, in a new process")
    print(
        f"{'backend':16} {'cache':5} {'before':>7} {'SDK':>7} {'loaded':>7} {'closed':>7} {'kept':>6} {'last':>7}"
        f" {'slope 5..':>10}"
    )
    for target in BACKENDS:
        home = Path(tempfile.mkdtemp(prefix="home-", dir=work))
        for cache in ("cold", "warm"):
            r = measure(out, store, home, target, args.precision, 1 if cache == "cold" else args.cycles, size)
            closed = r["closed"]
            tail = slope(closed[4:]) if len(closed) > 5 else float("nan")
            print(
                f"{target:16} {cache:5} {r['before']:7.1f} {r['sdk']:7.1f} {r['loaded']:7.1f} {closed[0]:7.1f}"
                f" {closed[0] - r['sdk']:6.1f} {closed[-1]:7.1f} {tail:8.2f}/c",
                flush=True,
            )
        shutil.rmtree(home, ignore_errors=True)  # a full copy of the artifacts
    return 0


if __name__ == "__main__":
    sys.exit(main())
