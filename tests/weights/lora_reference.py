"""diffusers' own pipeline with LoRA files loaded as adapters at one strength: the reference the LoRA tests compare with."""

from __future__ import annotations

from pathlib import Path


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
