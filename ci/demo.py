"""`make demo`: build the tiny SD-style recipe for OpenVINO and ONNX Runtime (fp32, fp16; bf16 on OpenVINO) into a local
store, load every artifact with enginefarm.load from an empty cache, run it, and print one table. Then the whole path a
user takes with a model family: a tiny random-weight Stable Diffusion 1.x saved by diffusers → `enginefarm export` →
`enginefarm build` → `enginefarm generate` writes an image, checked against diffusers' own pipeline on the same weights
and starting noise.

Everything lives under .enginefarm/ in the repository, so the demo never touches your real cache or store.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".enginefarm"
RECIPE = ROOT / "recipes" / "tiny_sd.toml"


def main() -> int:
    shutil.rmtree(WORK, ignore_errors=True)
    os.environ["ENGINEFARM_HOME"] = str(WORK / "home")
    os.environ["ENGINEFARM_STORE"] = str(WORK / "store")
    subprocess.run([sys.executable, str(ROOT / "recipes" / "make_tiny_sd.py")], check=True)
    cli = [sys.executable, "-m", "enginefarm.cli"]
    subprocess.run(cli + ["plan", str(RECIPE)], check=True)
    built = subprocess.run(cli + ["build", str(RECIPE), "-j", "2"])
    if built.returncode != 0:
        return built.returncode

    import numpy as np
    from rich.console import Console
    from rich.table import Table

    import enginefarm

    latent = np.random.default_rng(0).uniform(-3, 3, (1, 4, 16, 16)).astype(np.float32)
    table = Table(title="tiny-sd/decoder: every artifact, loaded from an empty cache")
    for column in (
        "artifact",
        "backend",
        "precision",
        "computes in",
        "min cosine",
        "min PSNR dB",
        "p50 ms (build)",
        "first inference ms",
        "output",
    ):
        table.add_column(column)
    for target, precisions in (("openvino:cpu", ("fp32", "fp16", "bf16")), ("onnxruntime:cpu", ("fp32", "fp16"))):
        for precision in precisions:
            start = time.perf_counter()
            try:
                session = enginefarm.load("tiny-sd/decoder", precision=precision, device="cpu", target=target)
            except enginefarm.EnginefarmError as exc:  # bf16 is built only where the CPU computes it
                table.add_row("-", target, precision, "-", "-", "-", "-", "-", f"not built here: {str(exc)[:60]}")
                continue
            out = session.run({"latent": latent})["sample"]
            ttfi = (time.perf_counter() - start) * 1000
            m = session.artifact
            table.add_row(
                m.build_key[:12],
                target,
                precision,
                session.compute_precision,
                f"{m.validation['min_cosine']:.8f}",
                f"{m.validation['min_psnr']:.1f}",
                f"{m.benchmarks[0]['p50_ms']:.3f}",
                f"{ttfi:.0f}",
                f"{list(out.shape)} std {out.std():.3f}",
            )
    console = Console(width=160)
    console.print(table)
    session = enginefarm.load("tiny-sd/decoder", device="cpu")
    console.print("\nenginefarm.load('tiny-sd/decoder') picks:\n" + session.explain(), markup=False)
    return family_demo(cli, console)


def family_demo(cli: list[str], console) -> int:
    """diffusers folder → export → build → generate, and the image against diffusers'."""
    import numpy as np

    if str(ROOT) not in sys.path:  # the tiny pipelines import their siblings as `tests.…`
        sys.path.insert(0, str(ROOT))
    import tests.tiny_pipelines as tiny

    base = WORK / "tiny-sd1"
    console.print("\n[bold]A model family, from a diffusers folder to an image[/]")
    source = tiny.make_tiny_pipeline("sd1", base / "diffusers")
    steps = [
        (
            "export",
            [
                *cli,
                "export",
                str(source),
                "--out",
                str(base / "export"),
                "--name",
                "tiny-sd1",
                "--latent",
                "8,8,16",
                "--batch",
                "1,2,2",
                "--targets",
                "openvino:cpu",
                "--precisions",
                "fp32",
            ],
        ),
        ("build", [*cli, "build", str(base / "export" / "recipe.toml"), "-j", "2", "--no-bench"]),
        (
            "generate",
            [
                *cli,
                "generate",
                "tiny-sd1",
                "a lighthouse at dawn",
                "--assets",
                str(base / "export" / "assets"),
                "--steps",
                "8",
                "--seed",
                "7",
                "--scheduler",
                "euler",
                "--out",
                str(WORK / "tiny-sd1.png"),
            ],
        ),
    ]
    for what, command in steps:
        start = time.perf_counter()
        if subprocess.run(command).returncode != 0:
            console.print(f"[red]{what} failed[/]")
            return 1
        console.print(f"[dim]{what}: {time.perf_counter() - start:.1f} s[/]")

    import diffusers
    import torch

    from enginefarm.diffusion import Pipeline, read_png

    ours = Pipeline.load("tiny-sd1", assets=base / "export" / "assets", device="cpu")
    side = ours.assets.native_pixels // ours.vae_scale_factor
    latents = np.random.default_rng(7).standard_normal((1, ours.latent_channels, side, side)).astype(np.float32)
    image = ours("a lighthouse at dawn", steps=8, latents=latents, scheduler="euler")
    theirs = diffusers.StableDiffusionPipeline.from_pretrained(source)
    theirs.scheduler = diffusers.EulerDiscreteScheduler.from_config(theirs.scheduler.config)
    theirs.set_progress_bar_config(disable=True)
    reference = theirs(
        "a lighthouse at dawn", num_inference_steps=8, latents=torch.from_numpy(latents), output_type="np"
    ).images[0]
    written = read_png(WORK / "tiny-sd1.png")
    console.print(
        f"wrote {WORK / 'tiny-sd1.png'} {written.shape[1]}×{written.shape[0]}; enginefarm (OpenVINO fp32) vs "
        f"diffusers on the same weights and noise: max abs difference {np.abs(image - reference).max():.2e} (image in "
        "[0, 1])"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
