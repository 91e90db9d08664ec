"""What the LoRA tests share: random LoRA layers as trainers write them, and diffusers' own pipeline with LoRA files
loaded as adapters at one strength (the reference they compare with)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def lora_pair(
    rng,
    prefix: str,
    out: int,
    inner: int,
    rank: int,
    *,
    scale: float,
    alpha=None,
    kernel=(),
    down: str = "lora_down.weight",
    up: str = "lora_up.weight",
) -> dict[str, np.ndarray]:
    """One layer's down [rank, inner, *kernel] and up [out, rank, 1, …] matrices (normal, std `scale`; drawn down
    first), and its alpha when given."""
    tensors = {
        f"{prefix}.{down}": rng.normal(0, scale, (rank, inner, *kernel)).astype(np.float32),
        f"{prefix}.{up}": rng.normal(0, scale, (out, rank, *[1] * len(kernel))).astype(np.float32),
    }
    if alpha is not None:
        tensors[f"{prefix}.alpha"] = np.array(alpha, np.float32)
    return tensors


def diffusers_with_loras(pipeline_class, folder, loras: tuple[Path, ...], strength: float, merge=None):
    """`merge(pipe)`, when given, edits the weights by hand (under no_grad) for what diffusers does not read."""
    import torch

    pipe = pipeline_class.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    for i, lora in enumerate(loras):
        pipe.load_lora_weights(str(lora.parent), weight_name=lora.name, adapter_name=f"x{i}")
    if loras:
        pipe.set_adapters([f"x{i}" for i in range(len(loras))], adapter_weights=[strength] * len(loras))
    if merge is not None:
        with torch.no_grad():
            merge(pipe)
    return pipe
