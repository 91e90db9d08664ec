"""Preview decoders (TAESD-class): a denoising step's latent → a full-size image, for `on_preview`, at a small
fraction of the VAE's cost.

    taesd = enginefarm.filters.load("taesd", store=STORE)
    image = taesd(latent)  # model-space latent [1, C, h, w] (as the pipeline holds it) → float [8h, 8w, 3] in [0, 1]
    pipe = Pipeline.load("my-sd15", store=STORE, preview="taesd")  # on_preview then gets these images

The exported graph (`export/filters/taesd.py`) holds the whole decode of a diffusers pipeline whose `vae` is this
AutoencoderTiny: its own scaling and shift, the decoder, and the image processor's `(x / 2 + 0.5).clamp(0, 1)`.
Exported from a diffusers folder, it also has the encoder: `taesd.encode(image)` → the model-space latent."""

from __future__ import annotations

import numpy as np

from enginefarm.errors import ConfigError

from .base import Filter


class PreviewDecoder(Filter):
    """`f(latent)` → image. `latent_channels`: the latent space's channels (4: SD 1.x/2.x/XL; 16: SD3, Flux);
    `upscale`: image pixels per latent pixel; `latent_scaling_factor`: the family VAE's scaling factor when the
    export could tell which latent space the decoder was trained on (from madebyollin's names), else None."""

    kind = "preview_decoder"

    @property
    def latent_channels(self) -> int:
        return int(self.info.details["latent_channels"])

    @property
    def upscale(self) -> int:
        return int(self.info.details.get("upscale", 8))

    @property
    def latent_scaling_factor(self) -> float | None:
        value = self.info.details.get("latent_scaling_factor")
        return None if value is None else float(value)

    def check_fits(self, channels: int, scaling_factor: float, model: str) -> None:
        """One line when this decoder cannot decode the latents of a model with `channels` latent channels and that
        VAE scaling factor (`model` names it in the message)."""
        if channels != self.latent_channels:
            raise ConfigError(
                f"{self.name} decodes {self.latent_channels}-channel latents; {model} has {channels}-channel latents",
                hint="use TAESD or TAESDXL for SD 1.x/2.x/XL (4 channels), TAESD3 for SD3, TAEF1 for Flux (16)",
            )
        known = self.latent_scaling_factor
        if known is not None and abs(known - scaling_factor) > 1e-6:
            raise ConfigError(
                f"{self.name} was trained on another latent space than {model}'s (VAE scaling factor {known}, "
                f"not {scaling_factor})",
                hint="TAESD is for SD 1.x/2.x, TAESDXL for SDXL, TAESD3 for SD3, TAEF1 for Flux",
            )

    def decode(self, latents: np.ndarray) -> np.ndarray:
        """Model-space latents [N, C, h, w] → images float32 [N, h·upscale, w·upscale, 3] in [0, 1], one engine run
        per image."""
        latents = np.asarray(latents, dtype=np.float32)
        if latents.ndim != 4 or latents.shape[1] != self.latent_channels:
            raise ConfigError(
                f"{self.name} takes latents [N, {self.latent_channels}, h, w], got {list(latents.shape)}",
                hint="give the latent as the pipeline holds it (model space, before the VAE's scaling is undone)",
            )
        session = self.sessions["decoder"]
        images = [session.run({"latent": one})["image"] for one in np.split(latents, latents.shape[0])]
        return np.ascontiguousarray(np.concatenate(images).transpose(0, 2, 3, 1), dtype=np.float32)

    @property
    def has_encoder(self) -> bool:
        """Whether it was exported with its encoder (from a diffusers AutoencoderTiny folder)."""
        return "encoder" in self.sessions

    def encode(self, image: np.ndarray) -> np.ndarray:
        """Images float [H, W, 3] (or [N, H, W, 3]) in [0, 1], sides multiples of `upscale` → model-space latents
        float32 [N, C, H / upscale, W / upscale]: what a diffusers img2img pipeline with this VAE makes of them
        (`(encode(2 x - 1).latents - shift_factor) * scaling_factor`), one engine run per image."""
        if not self.has_encoder:
            raise ConfigError(
                f"{self.name} has no encoder: it was exported from a decoder file",
                hint="export the diffusers AutoencoderTiny folder (e.g. madebyollin/taesd) to get both",
            )
        images = np.asarray(image, dtype=np.float32)
        images = images[None] if images.ndim == 3 else images
        side = self.upscale
        if images.ndim != 4 or images.shape[3] != 3 or images.shape[1] % side or images.shape[2] % side:
            raise ConfigError(
                f"{self.name} encodes images [N, H, W, 3] with sides multiples of {side}, got {list(images.shape)}",
                hint="float images in [0, 1] as the pipeline returns them; crop or resize to a multiple of 8",
            )
        session = self.sessions["encoder"]
        feeds = [np.ascontiguousarray(one.transpose(2, 0, 1)[None]) for one in images]
        return np.concatenate([session.run({"image": feed})["latent"] for feed in feeds]).astype(np.float32)

    def __call__(self, latent: np.ndarray) -> np.ndarray:
        """A latent [1, C, h, w] (or [C, h, w]) → image float32 [H, W, 3] in [0, 1]; [N, C, h, w] → [N, H, W, 3]."""
        latent = np.asarray(latent, dtype=np.float32)
        if latent.ndim == 3:
            return self.decode(latent[None])[0]
        images = self.decode(latent)
        return images[0] if images.shape[0] == 1 else images
