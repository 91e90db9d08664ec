"""What torch will build for each component, known before it builds it: the class model_index.json names, checked to
be a model class of its library, and the model its config describes, built on torch's meta device (no memory) to count
its weights. diffusers builds a model at its config's size before loading the files' weights into it, so a config
that says `block_out_channels [24576, 24576]` beside 3 GB of files would allocate hundreds of GB; sized from the
files alone (export/memory.py), it passed. `enginefarm[export]` brings no accelerate, so nothing else builds it on
the meta device."""

from __future__ import annotations

import inspect
from typing import Any

from enginefarm.errors import ConfigError

from .source import ExportSource

# diffusers' class per folder when model_index.json names none (or a class from elsewhere)
DIFFUSERS_CLASSES = {
    "unet": "UNet2DConditionModel",
    "vae": "AutoencoderKL",
    "controlnet": "ControlNetModel",
    "transformer": "SD3Transformer2DModel",
}


def model_class(source: ExportSource, folder: str) -> Any:
    """The torch model class of `folder`: model_index.json's, if it is a model class of transformers (text encoders)
    or diffusers; a one-line ConfigError for any other attribute (`5`, `__class__`, `pipeline`, `Trainer`)."""
    entry = source.model_index.get(folder)
    library, name = entry if isinstance(entry, list) and len(entry) == 2 else (None, None)
    if folder.startswith("text_encoder"):
        import transformers

        name = name or "CLIPTextModel"
        base, module = transformers.PreTrainedModel, transformers
    else:
        import diffusers

        if library != "diffusers" or not isinstance(name, str) or not hasattr(diffusers, name):
            name = DIFFUSERS_CLASSES[folder]
        base, module = diffusers.ModelMixin, diffusers
    found = getattr(module, name, None) if isinstance(name, str) and not name.startswith("_") else None
    if not (inspect.isclass(found) and issubclass(found, base)):
        usual = "CLIPTextModel" if folder.startswith("text_encoder") else DIFFUSERS_CLASSES.get(folder, "AutoencoderKL")
        raise ConfigError(
            f"model_index.json: {folder}'s class {name!r} is not a {module.__name__} model class",
            hint=f"name the class save_pretrained wrote there, e.g. {usual}",
        )
    return found  # a model class: typed Any, as diffusers' and transformers' classes are not known to mypy here


def config_fp32_bytes(source: ExportSource, folder: str) -> int:
    """The fp32 bytes of the model `folder`'s config describes, built on the meta device; a config torch cannot build
    (a negative width, a string where a number goes) is a one-line ConfigError."""
    import torch

    cls = model_class(source, folder)
    path = source.folder(folder)
    try:
        with torch.device("meta"):
            if hasattr(cls, "load_config"):  # diffusers
                model = cls.from_config(cls.load_config(path))
            else:
                model = cls(cls.config_class.from_pretrained(path, local_files_only=True))
    except Exception as exc:  # any error of the library's, from a config it was handed: the config's fault
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ConfigError(
            f"{path / 'config.json'}: {cls.__name__} cannot be built from it ({type(exc).__name__}: {first})",
            hint="use the config save_pretrained wrote for these weights",
        ) from None
    tensors = [*model.parameters(), *model.buffers()]
    return sum(4 * t.numel() for t in tensors if t.is_floating_point())


PICKLES = (".bin", ".pt", ".pth", ".ckpt")


def check_weight_files(source: ExportSource) -> None:
    """Refuse a component folder whose weights are pickles only, before torch reads them (torch.load's own text,
    three chained tracebacks): an export reads safetensors."""
    for folder in sorted({source.family.component(name).folder for name in source.components}):
        try:
            names = [p.name for p in source.folder(folder).iterdir() if p.is_file()]
        except OSError:
            continue  # read_source named what is missing
        if not any(n.endswith(".safetensors") for n in names) and any(n.endswith(PICKLES) for n in names):
            raise ConfigError(
                f"{folder} holds only pickle weights ({', '.join(sorted(n for n in names if n.endswith(PICKLES)))}): "
                "exports read safetensors",
                hint="save it as safetensors: load it with diffusers or transformers (from_pretrained) and "
                "save_pretrained(FOLDER, safe_serialization=True)",
            )
