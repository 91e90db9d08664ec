"""`enginefarm export model.safetensors --base DIR`: a single-file checkpoint (or a VAE file) as a diffusers folder.

The base model's diffusers folder gives what the file lacks: configs, tokenizers, scheduler, and the tensor names
(and shapes) each component has. The staged folder links everything of the base and writes, per component the file
has a part for, its weights converted by `enginefarm.weights` (tensors the file lacks keep the base's values)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from enginefarm.errors import SourceError
from enginefarm.formats.safetensors_io import SafeTensors, write_safetensors
from enginefarm.weights.single_file import component_part, open_file

# diffusers folder → the components of the layout it gathers, and the weights file name its class loads
_FOLDERS = {
    "unet": (("unet",), "diffusion_pytorch_model.safetensors"),
    "vae": (("vae_decoder", "vae_encoder"), "diffusion_pytorch_model.safetensors"),
    "text_encoder": (("text_encoder",), "model.safetensors"),
    "text_encoder_2": (("text_encoder_2",), "model.safetensors"),
    "text_encoder_3": (("text_encoder_3",), "model.safetensors"),  # SD3's T5 in an all-in-one file
    "transformer": (("transformer",), "diffusion_pytorch_model.safetensors"),
}
_WEIGHTS = (".safetensors", ".bin", ".safetensors.index.json", ".bin.index.json", ".ckpt", ".pt")


def _base_tensors(folder: Path) -> dict[str, tuple[SafeTensors | None, tuple[int, ...]]]:
    files = sorted(p for p in folder.glob("*.safetensors") if ".fp16." not in p.name) or sorted(
        folder.glob("*.safetensors")
    )
    if not files and (folder / "config.json").is_file() and (folder.parent / "model_index.json").is_file():
        return {name: (None, shape) for name, shape in _config_shapes(folder).items()}
    if not files:
        raise SourceError(
            f"{folder} holds no .safetensors weights: the base folder gives each component's tensor names",
            hint="use the base model's full diffusers folder (as `save_pretrained` or a model hub download writes it)",
        )
    out: dict[str, tuple[SafeTensors | None, tuple[int, ...]]] = {}
    for path in files:
        st = SafeTensors(path)
        out.update({name: (st, st.entries[name].shape) for name in st.names})
    return out


def _config_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """A component folder with its config but no weights (a catalog recipe's shipped configs): the tensor names and
    shapes of its class built from the config on torch's meta device (nothing allocated). The checkpoint must then
    hold every tensor; none has a base value to keep."""
    import importlib
    import json

    import torch

    library, class_name = json.loads((folder.parent / "model_index.json").read_text())[folder.name]
    cls = getattr(importlib.import_module(library), class_name)
    config = json.loads((folder / "config.json").read_text())
    with torch.device("meta"):
        if library == "transformers":
            model = cls(cls.config_class(**config))
        else:
            model = cls.from_config(config)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def stage(checkpoint: Path, base: Path, into: Path) -> Path:
    """A diffusers folder at `into` holding `checkpoint`'s weights over `base`. Returns `into`."""
    opened = open_file(checkpoint)
    if opened.layout is None:
        raise SourceError(
            f"{checkpoint}: not a single-file checkpoint or VAE file (its keys match no known layout)",
            hint="export a diffusers folder, or a single file in the original (LDM) or SGM layout with --base",
        )
    if not (base / "model_index.json").is_file():
        raise SourceError(
            f"--base {base} is not a diffusers pipeline folder (model_index.json not found)",
            hint="give the base model's diffusers folder: configs, tokenizers and scheduler come from it",
        )
    parts = set(opened.components())
    into.mkdir(parents=True)
    for entry in base.iterdir():
        gathers = _FOLDERS.get(entry.name)
        if gathers is None or not parts & set(gathers[0]) or not entry.is_dir():
            os.symlink(entry.resolve(), into / entry.name)
            continue
        (into / entry.name).mkdir()
        for item in entry.iterdir():
            if not item.name.endswith(_WEIGHTS):
                os.symlink(item.resolve(), into / entry.name / item.name)
        base_tensors = _base_tensors(entry)
        names = {n: shape for n, (_, shape) in base_tensors.items()}
        values = {n: st.array(n) for n, (st, _) in base_tensors.items() if st is not None}
        for component in gathers[0]:
            if component not in parts:
                continue
            half = {"vae_decoder": ("decoder.", "post_quant_conv."), "vae_encoder": ("encoder.", "quant_conv.")}.get(
                component
            )
            own = {n: s for n, s in names.items() if half is None or n.startswith(half)}
            view = component_part(checkpoint, component, f"{base.name}/{entry.name}", own, own)
            assert view is not None, component  # listed in `parts`: the checkpoint holds it
            values.update({n: view.array(n) for n in view.names})
        write_safetensors(into / entry.name / gathers[1], {n: np.asarray(v, np.float32) for n, v in values.items()})
    return into
