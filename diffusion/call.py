"""One `Pipeline.__call__`: its arguments as given (`Asked`) and what they resolve to (`Call`), the one record that
the call's stages (planning, text, start latents, the denoising loop, decoding) take instead of a dozen arguments."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from enginefarm.families.spec import Family

    from .inpaint import Inpainting
    from .prompts import TextConditioning
    from .schedulers import Scheduler

StepCallback = Callable[[int, int], None]  # (steps done, steps in all)
PreviewCallback = Callable[[int, np.ndarray], None]  # (steps done, the predicted image(s): see Pipeline.__call__)


@dataclass(frozen=True)
class Asked:
    """`Pipeline.__call__`'s arguments as the caller gave them (its `tiling` aside: `seamless.tiling_call` takes it);
    each means what that method's docstring says."""

    prompt: str
    negative_prompt: str | None = None
    steps: int | None = None
    guidance_scale: float | None = None
    width: int | None = None
    height: int | None = None
    seed: int = 0
    latents: np.ndarray | None = None
    scheduler: str | None = None
    image: np.ndarray | None = None
    mask_image: np.ndarray | None = None
    strength: float | None = None
    control_image: np.ndarray | None = None
    controlnet_conditioning_scale: float = 1.0
    original_size: tuple[int, int] | None = None
    crops_coords_top_left: tuple[int, int] = (0, 0)
    target_size: tuple[int, int] | None = None
    aesthetic_score: float = 6.0
    negative_aesthetic_score: float = 2.5
    output_type: str = "np"
    on_step: StepCallback | None = None
    step_noise: list[np.ndarray] | None = None
    max_sequence_length: int | None = None
    num_images_per_prompt: int = 1
    on_preview: PreviewCallback | None = None
    prompt_syntax: str = "a1111"
    clip_skip: int | None = None


@dataclass
class Call:
    """One call's settings, resolved and checked, and what its stages hand the denoising loop."""

    asked: Asked
    height: int
    width: int
    steps: int
    count: int  # images
    rng: np.random.Generator
    sched: Scheduler
    guidance: float
    use_guidance: bool
    mask: np.ndarray | None
    strength: float
    painter: Inpainting | None = None
    control: np.ndarray | None = None
    text: TextConditioning | None = None
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def controlnet_scale(self) -> float:
        return self.asked.controlnet_conditioning_scale

    @property
    def step_noise(self) -> list[np.ndarray] | None:
        return self.asked.step_noise

    @property
    def on_step(self) -> StepCallback | None:
        return self.asked.on_step

    @property
    def on_preview(self) -> PreviewCallback | None:
        return self.asked.on_preview

    def resolved(self) -> dict[str, object]:
        """What the call's defaults resolved to, for an image's stored parameters (`Pipeline.last_settings`)."""
        return {
            "steps": self.steps,
            "guidance_scale": self.guidance,
            "scheduler": self.asked.scheduler or type(self.sched).__name__,
            "width": self.width,
            "height": self.height,
            **({"strength": self.strength} if self.asked.image is not None else {}),
        }


def added_conditioning(family: Family, call: Call, text: TextConditioning) -> dict[str, np.ndarray]:
    """SDXL's pooled text and micro-conditioning time ids ([negative, positive] under guidance); {} for a family
    without them."""
    if not family.time_ids:
        return {}
    asked, size = call.asked, (call.height, call.width)
    original, crops = tuple(asked.original_size or size), asked.crops_coords_top_left
    if family.aesthetic_score:
        ids = [[*original, *crops, asked.negative_aesthetic_score], [*original, *crops, asked.aesthetic_score]]
    else:
        ids = [[*original, *crops, *(asked.target_size or size)]] * 2
    time_ids = np.array(ids if call.use_guidance else ids[1:], np.float32)
    assert text.pooled is not None, "SDXL's second text encoder gives a pooled state"
    return {"text_embeds": text.pooled.astype(np.float32), "time_ids": time_ids}
