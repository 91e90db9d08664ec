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
WIDTH = 120  # a terminal's usual width: every table of the demo fits it
COLUMNS = (
    "artifact",
    "target",
    "precision",
    "computes in",
    "min cosine",
    "PSNR dB",
    "p50 ms",
    "TTFI ms",
    "output std",
)


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

    import enginefarm

    latent = np.random.default_rng(0).uniform(-3, 3, (1, 4, 16, 16)).astype(np.float32)
    rows, missing, shape = [], [], "-"
    for target, precisions in (("openvino:cpu", ("fp32", "fp16", "bf16")), ("onnxruntime:cpu", ("fp32", "fp16"))):
        for precision in precisions:
            start = time.perf_counter()
            try:
                session = enginefarm.load("tiny-sd/decoder", precision=precision, device="cpu", target=target)
            except enginefarm.EnginefarmError as exc:  # bf16 is built only where the CPU computes it
                missing.append(f"{target} {precision}: not built here ({exc})")
                continue
            out = session.run({"latent": latent})["sample"]
            m, shape = session.artifact, str(list(out.shape))
            rows.append(
                {
                    "artifact": m.build_key[:12],
                    "target": target,
                    "precision": precision,
                    "computes in": session.compute_precision,
                    "min cosine": f"{m.validation['min_cosine']:.8f}",
                    "PSNR dB": f"{m.validation['min_psnr']:.1f}",
                    "p50 ms": f"{m.benchmarks[0]['p50_ms']:.3f}",
                    "TTFI ms": f"{(time.perf_counter() - start) * 1000:.0f}",
                    "output std": f"{out.std():.3f}",
                }
            )
    console = Console(width=WIDTH)
    console.print(artifact_table(rows, f"each output {shape}; p50 measured at build, TTFI: load + first run"))
    for line in missing:
        console.print(line, markup=False)
    session = enginefarm.load("tiny-sd/decoder", device="cpu")
    console.print("\nenginefarm.load('tiny-sd/decoder') picks:\n" + session.explain(), markup=False)
    return family_demo(cli, console)


def artifact_table(rows: list[dict[str, str]], caption: str):
    """One row per artifact, in WIDTH columns: what a user needs to read locally (no CI runner labels)."""
    from rich.table import Table

    table = Table(title="tiny-sd/decoder: every artifact, loaded from an empty cache", caption=caption)
    for column in COLUMNS:
        table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(*(row[column] for column in COLUMNS))
    return table


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
