"""How a family's denoiser is driven, as data: what the runtime pipeline, the exporter and custom weights read
instead of asking which family a model is. A family that shares another's traits takes the same paths whatever
its id (tests/families/test_traits.py holds that; no product module compares family ids)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# How the guidance scale reaches the denoiser:
# - "cfg": classifier-free guidance, a negative and a positive pass per step mixed by the scale (SD, SD3, Chroma);
# - "embedded": guidance-distilled, the scale is a transformer input and one pass runs per step (Flux.1 dev);
# - "none": neither, one pass and no scale (Flux.1 schnell, timestep-distilled).
Guidance = Literal["cfg", "embedded", "none"]
# How a flow-matching pipeline spaces its sigmas before the scheduler shifts them (the shift itself, a static
# `shift` or the resolution-dependent `mu`, is the scheduler config's `use_dynamic_shifting`):
# - "scheduler": the scheduler's own, evenly between its shifted sigma_max and sigma_min (diffusers' SD3 pipeline);
# - "unit": linspace(1, 1/steps), which diffusers' Flux and Chroma pipelines pass as `sigmas`.
SigmaSpacing = Literal["scheduler", "unit"]
# The denoiser's block layout, which tells a LoRA's (or a single file's) target apart: a UNet's down/mid/up blocks,
# SD3's MMDiT joint blocks, or Flux's double- and single-stream blocks (Flux.1 and Chroma).
Blocks = Literal["unet", "mmdit", "double-single"]


@dataclass(frozen=True)
class Traits:
    """The family's denoising traits (defaults: a UNet family with classifier-free guidance)."""

    # Latent pixels per token side that the exported transformer graph packs (Flux, Chroma: 2, their 2x2 patches,
    # packed in the graph by export/flux.py); the token grid is this times the transformer config's `patch_size`.
    latent_packing: int = 1
    guidance: Guidance = "cfg"
    sigma_spacing: SigmaSpacing = "scheduler"
    blocks: Blocks = "unet"

    def patch_size(self, transformer_config: dict | None) -> int:
        """Latent pixels per transformer token side: the config's `patch_size` (SD3: 2) times the packing
        (Flux, Chroma: 1 x 2); 1 for a UNet (no transformer config)."""
        return int((transformer_config or {}).get("patch_size") or 1) * self.latent_packing

    @property
    def true_cfg(self) -> bool:
        """Two passes per step under a scale above 1 (negative and positive prompt)."""
        return self.guidance == "cfg"


# The transformer families' traits (the UNet families take the defaults).
MMDIT = Traits(blocks="mmdit")
FLUX_DEV = Traits(latent_packing=2, guidance="embedded", sigma_spacing="unit", blocks="double-single")
FLUX_SCHNELL = Traits(latent_packing=2, guidance="none", sigma_spacing="unit", blocks="double-single")
CHROMA = Traits(latent_packing=2, guidance="cfg", sigma_spacing="unit", blocks="double-single")
