"""Per model family, on its tiny random-weight model: export time and size, jobs built, how far enginefarm's pipeline is
from diffusers' (fp32: final latent, max abs over its range; fp16: image, max abs in [0, 1]) per backend, and the
pipeline's time per denoising step. One table, printed; everything under a scratch folder.

    python bench/families.py [--families sd1,sd2-v,sdxl,sd3,sd3.5] [--steps 4] [--out /tmp/ef-families]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("onnxruntime:cpu", "openvino:cpu")
PROMPT = "a lighthouse on a cliff at dawn"


def _tiny_pipelines():
    if str(ROOT) not in sys.path:  # tiny_pipelines imports its siblings as tests.*
        sys.path.insert(0, str(ROOT))
    spec = importlib.util.spec_from_file_location("tiny_pipelines", ROOT / "tests" / "tiny_pipelines.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cli(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "enginefarm.cli", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"enginefarm {' '.join(args)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc


PACKED = ("flux", "flux-schnell", "chroma")  # diffusers takes and gives their latents in 2x2 patches


def pixels_for(family: str, ours) -> int:
    """The model's native size; the tiny Flux and Chroma transformers have no sample_size (the family's is 1024)."""
    return 64 if family in PACKED else ours.assets.native_pixels


def _theirs_latents(family: str, latents: np.ndarray):
    import torch
    from diffusers import FluxPipeline

    tensor = torch.from_numpy(latents)
    return FluxPipeline._pack_latents(tensor, *latents.shape) if family in PACKED else tensor


def _unpacked(family: str, reference, pixels: int) -> np.ndarray:
    from diffusers import FluxPipeline

    return (FluxPipeline._unpack_latents(reference, pixels, pixels, 8) if family in PACKED else reference).numpy()


def measure(family: str, root: Path, steps: int) -> list[dict]:
    import diffusers

    from enginefarm.diffusion import Pipeline

    source = _tiny_pipelines().make_tiny_pipeline(family, root / "diffusers")
    started = time.perf_counter()
    _cli("export", str(source), "--out", str(root / "export"), "--latent", "8,8,16", "--batch", "1,2,2")
    export_s = time.perf_counter() - started
    export_mb = sum(p.stat().st_size for p in (root / "export").glob("*.onnx*")) / 1e6
    built = _cli(
        "build", str(root / "export" / "recipe.toml"), "--store", str(root / "store"), "--no-bench", "-j", "2"
    ).stdout
    jobs = sum(line.lstrip().startswith("built") for line in built.splitlines())
    name = tomllib.loads((root / "export" / "recipe.toml").read_text())["model"]["name"]
    theirs = diffusers.DiffusionPipeline.from_pretrained(source)
    theirs.set_progress_bar_config(disable=True)
    rows = []
    for target in BACKENDS:
        for precision in ("fp32", "fp16"):
            ours = Pipeline.load(name, store=str(root / "store"), precision=precision, target=target, device="cpu")
            pixels = pixels_for(family, ours)
            side = pixels // ours.vae_scale_factor
            latents = np.random.default_rng(0).standard_normal((1, ours.latent_channels, side, side)).astype(np.float32)
            kind = "latent" if precision == "fp32" else "np"
            got = ours(
                PROMPT, steps=steps, latents=latents, output_type=kind, height=pixels, width=pixels, guidance_scale=6.0
            )
            ms_step = ours.timings["denoise"] / ours.timings["steps"] * 1000
            reference = theirs(
                PROMPT,
                num_inference_steps=steps,
                latents=_theirs_latents(family, latents),
                output_type=kind,
                height=pixels,
                width=pixels,
                guidance_scale=6.0,
            ).images
            reference = _unpacked(family, reference, pixels) if precision == "fp32" else reference[0]
            error = np.abs(got - reference).max() / (
                (reference.max() - reference.min()) if precision == "fp32" else 1.0
            )
            rows.append(
                {
                    "family": family,
                    "export s": f"{export_s:.1f}",
                    "ONNX MB": f"{export_mb:.1f}",
                    "jobs": jobs,
                    "target": target,
                    "precision": precision,
                    "vs diffusers": f"{error:.1e} ({'latent' if precision == 'fp32' else 'image'})",
                    "ms/step": f"{ms_step:.0f}",
                    "size": f"{pixels}²",
                }
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default="sd1,sd2-v,sdxl")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("/tmp/ef-families"))
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    os.environ.setdefault("ENGINEFARM_HOME", str(args.out / "home"))
    os.environ["ENGINEFARM_MEASURE"] = "off"
    rows = [row for family in args.families.split(",") for row in measure(family, args.out / family, args.steps)]
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in columns) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
