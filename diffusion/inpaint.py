"""Inpainting, as diffusers' StableDiffusionInpaintPipeline and StableDiffusionXLInpaintPipeline do it.

The mask is float [H, W] in [0, 1] at the image's size, 1 where the image is repainted. As diffusers' mask processor:
binarized at 0.5; at latent size it is the nearest pixel of each f×f block (`interpolate`'s default, which picks the
block's top-left pixel); the masked image is the image with the repainted pixels at 0 in [-1, 1] (mid-gray).

Two ways, by the model:
- an inpainting UNet (9 input channels: `Family.inpainting`) sees the mask and the masked image's latents beside the
  latents at every step (`model_input`);
- any other UNet denoises as usual and, after each step, the known region is replaced by the image's latents noised to
  the next step's level (`blend`), as diffusers' inpaint pipelines do with a 4-channel UNet.

The start is diffusers' `prepare_latents`: at strength 1 pure noise times the scheduler's init sigma, below it the
image's latents noised to the first step. Images are encoded to the VAE posterior's mode (its mean)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from enginefarm.errors import ConfigError
from enginefarm.families import Family

F32 = np.float32
_MASK_HINT = "give mask_image= as float [height, width] in [0, 1] at the image's size (1 = repaint, 0 = keep)"


def default_strength(family: Family, strength: float | None, inpainting: bool) -> float:
    """The call's strength when none is given: diffusers' defaults (img2img 0.8; inpainting 1.0, SDXL's 0.9999)."""
    if strength is not None:
        return strength
    if not inpainting:
        return 0.8
    return 0.9999 if family.time_ids else 1.0


def check_mask(
    family: Family, image: np.ndarray | None, mask_image: np.ndarray | None, height: int, width: int
) -> np.ndarray | None:
    """The binarized mask [H, W] (1 = repaint), or None for a call that does not inpaint; a mistake is a one-line
    ConfigError before any work is done."""
    if mask_image is None:
        if family.inpainting:
            raise ConfigError(
                f"{family.title} is an inpainting model: give image= and mask_image=",
                hint="a mask of ones repaints the whole image; use the base model for text to image",
            )
        return None
    if image is None:
        raise ConfigError("mask_image= needs image= (the picture whose masked part is repainted)", hint=_MASK_HINT)
    if family.denoiser != "unet":
        raise ConfigError(
            f"inpainting is not supported for {family.title} yet", hint="use an SD 1.x, 2.x or SDXL model"
        )
    mask = np.asarray(mask_image, dtype=F32)
    if mask.shape != (height, width):
        raise ConfigError(
            f"mask_image has shape {list(np.shape(mask_image))}, the image is {width}×{height} ([{height}, {width}])",
            hint=_MASK_HINT,
        )
    if not np.isfinite(mask).all():
        raise ConfigError(
            f"mask_image has {int((~np.isfinite(mask)).sum())} values outside [0, 1] (NaN or inf)", hint=_MASK_HINT
        )
    if mask.min() < 0 or mask.max() > 1:
        raise ConfigError(
            f"mask_image has values from {mask.min():g} to {mask.max():g}, outside [0, 1]", hint=_MASK_HINT
        )
    return (mask >= 0.5).astype(F32)


@dataclass
class Inpainting:
    """One call's inpainting state. `mask`: [1, 1, h, w] at latent size; `image_latents`: the image's scaled latents
    (the 4-channel way's known region, and the start below strength 1); `masked_latents`: the masked image's (the
    inpainting UNet's input), None for a 4-channel UNet; `noise`: the start noise, [N, C, h, w]."""

    mask: np.ndarray
    image_latents: np.ndarray | None
    masked_latents: np.ndarray | None
    noise: np.ndarray

    @classmethod
    def prepare(
        cls,
        family: Family,
        encode: Callable[[np.ndarray], np.ndarray],
        image: np.ndarray | None,
        mask: np.ndarray,
        factor: int,
        strength: float,
        noise: np.ndarray,
    ) -> Inpainting:
        """`encode`: an image float [H, W, 3] in [0, 1] → its scaled latents [1, C, h, w]; `mask`: `check_mask`'s."""
        assert image is not None, "check_mask refuses a mask without an image"
        pixels = np.asarray(image, dtype=F32)
        if pixels.ndim == 4:  # [1, 3, H, W], as to_nchw takes it too
            pixels = pixels[0].transpose(1, 2, 0)
        needs_image = not family.inpainting or strength < 1.0
        image_latents = encode(pixels) if needs_image else None
        masked_latents = None
        if family.inpainting:
            # 0.5 in [0, 1] is exactly 0 in the [-1, 1] the VAE sees: diffusers' `image * (mask < 0.5)`.
            masked_latents = encode(np.where(mask[..., None] < 0.5, pixels, F32(0.5)).astype(F32))
        latent_mask = np.ascontiguousarray(mask[::factor, ::factor])[None, None]
        return cls(latent_mask, image_latents, masked_latents, noise)

    def start(self, sched, strength: float) -> np.ndarray:
        """The first latent: pure noise at strength 1, else the image's latents noised to the first step."""
        if strength >= 1.0 or self.image_latents is None:
            return (self.noise * F32(sched.init_noise_sigma)).astype(F32)
        return sched.add_noise(self.image_latents, self.noise, sched.timesteps[0]).astype(F32)

    def model_input(self, x_in: np.ndarray) -> np.ndarray:
        """The UNet's `sample`: an inpainting UNet's takes the mask and the masked image's latents per batch entry."""
        if self.masked_latents is None:
            return x_in
        n, _, h, w = x_in.shape
        mask = np.broadcast_to(self.mask, (n, 1, h, w))
        masked = np.broadcast_to(self.masked_latents, (n, *self.masked_latents.shape[1:]))
        return np.concatenate([x_in, mask, masked], axis=1).astype(F32)

    def blend(self, sched, x: np.ndarray, index: int) -> np.ndarray:
        """After step `index` (from 0): a 4-channel UNet's known region is the image, noised to the next step's
        level (none after the last step)."""
        if self.masked_latents is not None or self.image_latents is None:
            return x
        timesteps = sched.timesteps
        known = self.image_latents
        if index < len(timesteps) - 1:
            known = sched.add_noise(known, self.noise, timesteps[index + 1])
        return ((1 - self.mask) * known + self.mask * x).astype(F32)
