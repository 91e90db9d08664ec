"""Pictures for the build report: one prompt and seed rendered through every backend × precision a model was built
for (the ones this machine runs), side by side with each one's difference from the fp32 reference, so a reviewer
sees what a precision costs in the image, not only in numbers.

A model takes part when its assets are in the store (`[model] assets`, what `enginefarm export` writes): the pipeline
needs its tokenizers and configs. The reference is ONNX Runtime fp32 where it was built, else any fp32."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from enginefarm.cache import precision_table
from enginefarm.cache.index import read_index
from enginefarm.cache.stores.base import Store

log = logging.getLogger(__name__)

DIFF_GAIN = 10.0  # differences are faint: the difference image shows |a - b| × 10, clipped


@dataclass(frozen=True)
class Render:
    target: str
    precision: str
    image: Path
    diff: Path | None  # against the reference (None for the reference itself)
    max_abs: float
    mean_abs: float
    psnr_db: float
    ms_per_step: float


@dataclass
class ModelPictures:
    model: str
    version: str
    prompt: str
    seed: int
    steps: int
    size: int
    reference: str = ""
    renders: list[Render] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # combinations that could not be rendered here, and why
    reference_image: np.ndarray | None = field(default=None, repr=False)


def render_pictures(
    store: Store, out: Path, *, prompt: str, seed: int = 0, steps: int = 8, size: int | None = None, models=None
) -> list[ModelPictures]:
    from enginefarm.backends import targets_for
    from enginefarm.hardware.devices import PROBES, run_probe

    runnable = {t for name in PROBES for d in run_probe(name).devices for t in targets_for(d)}
    found = []
    for model in sorted(models or store.list_models()):
        entries = list(read_index(store, model).entries.values())
        assets = [e for e in entries if e.component == "assets"]
        if not assets:
            continue
        version = max(assets, key=lambda e: e.created or "").model_version
        denoisers = {(e.target, e.precision) for e in entries if e.component == "unet" and e.model_version == version}
        combos = sorted(denoisers, key=lambda tp: (precision_table.tie_order(tp[1]), tp[0] != "onnxruntime:cpu", tp))
        pictures = ModelPictures(model, version, prompt, seed, steps, size or 0)
        for target, precision in combos:
            if target not in runnable:
                pictures.skipped.append(f"{target} {precision}: this machine does not run {target}")
                continue
            try:
                _render(store, out, pictures, target, precision)
            except Exception as exc:  # one combination that fails must not cost the report
                pictures.skipped.append(f"{target} {precision}: {type(exc).__name__}: {exc}")
                log.warning("could not render %s %s %s: %s", model, target, precision, exc)
        found.append(pictures)
    return found


def _render(store: Store, out: Path, pictures: ModelPictures, target: str, precision: str) -> None:
    from enginefarm.diffusion import Pipeline, write_png

    pipe = Pipeline.load(
        pictures.model, store=store.url, precision=precision, target=target, device="cpu", version=pictures.version
    )
    pictures.size = pictures.size or pipe.assets.native_pixels
    side = pictures.size // pipe.vae_scale_factor
    latents = (
        np.random.default_rng(pictures.seed).standard_normal((1, pipe.latent_channels, side, side)).astype(np.float32)
    )
    started = time.perf_counter()
    image = pipe(
        pictures.prompt,
        steps=pictures.steps,
        seed=pictures.seed,
        latents=latents,
        width=pictures.size,
        height=pictures.size,
    )
    ms_per_step = pipe.timings["denoise"] / max(pipe.timings["steps"], 1) * 1000
    log.info("rendered %s %s %s in %.1f s", pictures.model, target, precision, time.perf_counter() - started)
    stem = f"picture-{pictures.model}-{target.replace(':', '-')}-{precision}"
    path = write_png(out / f"{stem}.png", image)
    if pictures.reference_image is None:
        pictures.reference, pictures.reference_image = f"{target} {precision}", image
        pictures.renders.append(Render(target, precision, path, None, 0.0, 0.0, 999.0, ms_per_step))
        return
    error = np.abs(image - pictures.reference_image)
    rms = float(np.sqrt(np.mean(error**2)))
    psnr = 999.0 if rms == 0 else float(20 * np.log10(1.0 / rms))
    diff = write_png(out / f"{stem}-diff.png", np.clip(error * DIFF_GAIN, 0, 1))
    pictures.renders.append(
        Render(target, precision, path, diff, float(error.max()), float(error.mean()), psnr, ms_per_step)
    )
