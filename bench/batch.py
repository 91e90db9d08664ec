"""Images per call: N images in one `Pipeline` call (`num_images_per_prompt=N`, the denoiser's 2N rows in calls of
the profile's max batch) against N one-image calls, and the live preview's cost per step (`on_preview`, the linear
latent-to-RGB map), on a tiny SD 1.x pipeline (tests/tiny_pipelines.py) exported with a batch profile up to 2N and
built for each backend at fp32 (`--unet-width W`: its UNet swapped for SD 1.5's layout at channels W..4W, so a step
costs more than the per-call overhead). Medians of REPEATS; the first call of each kind is a warm-up. A benchmark,
not a test: it never fails on numbers.

    .venv/bin/python bench/batch.py [--images 4] [--latent 32] [--steps 4] [--repeats 3] [--unet-width 64] [--work DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np

from families import _cli, _tiny_pipelines  # bench/families.py: the tiny pipelines and the CLI, as its runs use them

BACKENDS = ("onnxruntime:cpu", "openvino:cpu")
PROMPT = "a lighthouse on a cliff at dawn"


def build(work: Path, latent: int, rows: int, width: int | None) -> tuple[Path, Path, str]:
    """The tiny SD 1.x exported with latent side `latent` and batch up to `rows`, built for both backends at fp32;
    `width`: its UNet replaced by SD 1.5's layout (4 levels, 2 layers each, attention on the first 3) with
    channels (w, 2w, 4w, 4w) (SD 1.5: w = 320), random weights."""
    out, store = work / "export", work / "store"
    if not (out / "recipe.toml").is_file():  # a --work folder measured before: its build is reused
        export(work, out, store, latent, rows, width)
    return out, store, tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]


def export(work: Path, out: Path, store: Path, latent: int, rows: int, width: int | None) -> None:
    source = _tiny_pipelines().make_tiny_pipeline("sd1", work / "source")
    if width is not None:
        sd15_layout_unet(width).save_pretrained(source / "unet")
    _cli(
        "export",
        str(source),
        "--out",
        str(out),
        "--latent",
        f"{latent},{latent},{latent}",
        "--batch",
        f"1,{rows},{rows}",
    )
    _cli("build", str(out / "recipe.toml"), "--store", str(store), "--no-bench", "-j", "2", "--precision", "fp32")


def sd15_layout_unet(width: int):
    import torch
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    return UNet2DConditionModel(
        sample_size=64,
        layers_per_block=2,
        block_out_channels=(width, 2 * width, 4 * width, 4 * width),
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
        cross_attention_dim=768,
        attention_head_dim=8,
    ).eval()


def measure(pipe, size: int, args) -> dict[str, float]:
    """Medians over REPEATS, batch and singles interleaved so both see the same machine: seconds of one call of N
    images and of N one-image calls, each whole and its denoising alone, and the preview's seconds per step."""
    n, kwargs = args.images, dict(steps=args.steps, width=size, height=size)
    pipe(PROMPT, seed=0, num_images_per_prompt=n, **kwargs)  # warm-up: the first run of a shape pays set-up
    pipe(PROMPT, seed=0, **kwargs)
    runs: dict[str, list[float]] = {"batch": [], "batch denoise": [], "singles": [], "singles denoise": []}
    previews = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        pipe(PROMPT, seed=0, num_images_per_prompt=n, **kwargs)
        runs["batch"].append(time.perf_counter() - start)
        runs["batch denoise"].append(pipe.timings["denoise"])
        start, denoise = time.perf_counter(), 0.0
        for seed in range(n):
            pipe(PROMPT, seed=seed, **kwargs)
            denoise += pipe.timings["denoise"]
        runs["singles"].append(time.perf_counter() - start)
        runs["singles denoise"].append(denoise)
        pipe(PROMPT, seed=0, on_preview=lambda step, image: None, **kwargs)
        previews.append(pipe.timings["preview"] / args.steps)
    result = {name: statistics.median(times) for name, times in runs.items()}
    result["preview"] = statistics.median(previews)
    result["step"] = result["singles denoise"] / n / args.steps
    return result


def preview_cost(repeats: int = 50) -> list[tuple[str, float]]:
    """The linear preview's milliseconds per step at real latent sizes (one image), median of `repeats`."""
    from enginefarm.diffusion.preview import latent_rgb, linear_preview

    rows = []
    for label, factor, channels, side in (
        ("SD 1.5 512 px", 0.18215, 4, 64),
        ("SDXL 1024 px", 0.13025, 4, 128),
        ("Flux 1024 px", 0.3611, 16, 128),
    ):
        factors, bias = latent_rgb(factor, channels)
        latent = np.random.default_rng(0).standard_normal((1, channels, side, side)).astype(np.float32)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            linear_preview(latent, factors, bias)
            times.append(time.perf_counter() - start)
        rows.append((label, statistics.median(times) * 1e3))
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=4)
    p.add_argument("--latent", type=int, default=32, help="latent side (image side / 8)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--unet-width",
        type=int,
        default=None,
        help="SD 1.5's UNet layout at this first width, a multiple of 32 (320: real)",
    )
    p.add_argument("--work", type=Path, default=None, help="folder to build in (default: a temporary one)")
    args = p.parse_args()
    for label, ms in preview_cost():
        print(f"linear preview, {label}: {ms:.3f} ms per step")
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-batch-"))
    unet = "tiny UNet" if args.unet_width is None else f"SD 1.5-layout UNet of width {args.unet_width}"
    print(f"building the tiny SD 1.x, {unet} (latent {args.latent}, batch to {2 * args.images}) in {work}", flush=True)
    out, store, name = build(work, args.latent, 2 * args.images, args.unet_width)

    from enginefarm.diffusion import Pipeline

    size, n = args.latent * 8, args.images
    print(f"\n{n} images of {size}x{size}, {args.steps} steps, guidance on (UNet rows per call: up to {2 * n} vs 2)")
    print(
        f"{'backend':16} {'1 call':>8} {f'{n} calls':>8} {'speed-up':>8} {'denoise':>8} {f'x{n}':>8} {'speed-up':>8}"
        f" {'step':>9} {'preview/step':>12}"
    )
    for target in BACKENDS:
        assets = out / "assets"
        pipe = Pipeline.load(name, store=str(store), target=target, precision="fp32", device="cpu", assets=assets)
        r = measure(pipe, size, args)
        pipe.close()
        print(
            f"{target:16} {r['batch']:7.2f}s {r['singles']:7.2f}s {r['singles'] / r['batch']:7.2f}x"
            f" {r['batch denoise']:7.2f}s {r['singles denoise']:7.2f}s"
            f" {r['singles denoise'] / r['batch denoise']:7.2f}x"
            f" {r['step'] * 1e3:6.1f} ms {r['preview'] * 1e3:9.3f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
