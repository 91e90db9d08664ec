"""Files as model sites ship them, written from the tests' tiny diffusers pipelines: single-file checkpoints in the
original LDM / SGM layouts and VAEs in the original layout. The names come from `enginefarm.weights.layouts` run
backwards (fused q/k/v concatenated, the text projection transposed, VAE attention as 1×1 convolutions); diffusers'
own `from_single_file` reading them back is what checks the layouts."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import numpy as np

from enginefarm.weights import layouts
from enginefarm.weights.single_file import LAYOUTS, Section


def diffusers_tensors(folder: Path, subfolder: str) -> dict[str, np.ndarray]:
    """A saved component's tensors (float32) by its state-dict names."""
    from safetensors.numpy import load_file

    files = sorted((Path(folder) / subfolder).glob("*.safetensors"))
    assert len(files) == 1, files
    return {k: v.astype(np.float32) for k, v in load_file(str(files[0])).items()}


def to_original(section: Section, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A part's diffusers tensors in the original layout, under the section's prefix."""
    grouped: dict[str, list] = {}
    for name, source in layouts.sources(section.part, tensors).items():
        grouped.setdefault(source.key, []).append((source, tensors[name]))
    out = {}
    for key, items in grouped.items():
        source, value = items[0]
        if source.take is not None:  # q, k, v (and Flux's MLP) into one tensor, in the order of their units
            ordered = sorted(items, key=lambda item: item[0].take[0])
            units = [s.take for s, _ in ordered]
            assert (
                units[0][0] == 0 and units[-1][1] == units[-1][2] and all(a[1] == b[0] for a, b in pairwise(units))
            ), key
            value = np.concatenate([v for _, v in ordered])
        if source.swap:  # diffusers' (scale, shift) back to the original's (shift, scale)
            value = np.concatenate([value[value.shape[0] // 2 :], value[: value.shape[0] // 2]])
        if source.transpose:
            value = value.T
        if source.squeeze:
            value = value.reshape(*value.shape, 1, 1)
        out[section.prefix + key] = np.ascontiguousarray(value)
    return out


# component → the subfolder of a diffusers pipeline holding its weights
SUBFOLDERS = {
    "text_encoder": "text_encoder",
    "text_encoder_2": "text_encoder_2",
    "text_encoder_3": "text_encoder_3",
    "unet": "unet",
    "vae_decoder": "vae",
    "vae_encoder": "vae",
    "transformer": "transformer",
}


def original_tensors(
    folder: Path, layout: str, extra: dict[str, np.ndarray] | None = None, only: tuple[str, ...] | None = None
) -> dict[str, np.ndarray]:
    """The parts of the tiny pipeline at `folder` in `layout` (an id of LAYOUTS): every one its folder has, or those
    of the components in `only`; plus `extra` keys."""
    out: dict[str, np.ndarray] = {}
    for component, section in LAYOUTS[layout].components.items():
        if component == "unet_controlnet" or (only is not None and component not in only):
            continue
        if not (Path(folder) / SUBFOLDERS[component]).is_dir():
            continue
        tensors = diffusers_tensors(folder, SUBFOLDERS[component])
        if section.part == "diffusers":
            out.update({section.prefix + k: v for k, v in tensors.items() if k.startswith(section.owns)})
            continue
        tensors = {
            k: v
            for k, v in tensors.items()
            if component not in ("vae_decoder", "vae_encoder") or k.startswith(section.owns)
        }
        out.update(to_original(section, tensors))
    out.update(extra or {})
    return out


def write_file(path: Path, tensors: dict[str, np.ndarray], dtype: str = "fp32") -> Path:
    """With torch's writer, so bf16 files are written as trainers write them."""
    import torch
    from safetensors.torch import save_file

    kind = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    save_file({k: torch.from_numpy(np.array(v)).to(kind).clone() for k, v in tensors.items()}, str(path))
    return path
