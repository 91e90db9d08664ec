"""A user's filter file or folder → `registry.Source`, without running code from it: safetensors as they are, torch
pickles (.pth/.pt/.ckpt/.bin) through `torch.load(weights_only=True)`, whose unpickler builds tensors and plain
containers only and refuses any other global. Then `recognise` asks each known architecture whether the keys are its."""

from __future__ import annotations

import json
import pickle
import re
import warnings
from pathlib import Path
from typing import Any

from enginefarm.errors import ConfigError

from .registry import Architecture, Source, architectures

PICKLE_SUFFIXES = (".pth", ".pt", ".ckpt", ".bin")
SAFETENSORS_SUFFIXES = (".safetensors",)
# The weights file of a diffusers/transformers folder, in the order to prefer them (safetensors first: no pickle).
FOLDER_WEIGHTS = (
    "diffusion_pytorch_model.safetensors",
    "model.safetensors",
    "diffusion_pytorch_model.bin",
    "pytorch_model.bin",
)
# The keys training code nests the weights under; the EMA weights are what its authors publish as the model.
NESTING_KEYS = ("params_ema", "params-ema", "params", "model_state_dict", "state_dict", "model", "net")
# Prefixes a wrapper (DataParallel, a GAN trainer's generator) puts on every key.
WRAPPER_PREFIXES = ("module.", "netG.")

NEEDS_CODE = "this file needs code to unpickle; enginefarm reads weights only"


def read_filter_source(path: str | Path) -> Source:
    """The weights (and a folder's config.json) of the filter at `path`, unwrapped to one flat
    name → tensor dict. ConfigError for a missing, unreadable or code-carrying file."""
    path = Path(path)
    if path.is_dir():
        return _read_folder(path)
    if not path.is_file():
        raise ConfigError(f"{path} does not exist", hint="give the filter's file (.pth, .safetensors…) or folder")
    return Source(path, unwrap(_read_file(path)))


def _read_folder(folder: Path) -> Source:
    config_path = folder / "config.json"
    weights = next((folder / name for name in FOLDER_WEIGHTS if (folder / name).is_file()), None)
    if not config_path.is_file() or weights is None:
        raise ConfigError(
            f"{folder} is not a model folder: it needs config.json and one of {', '.join(FOLDER_WEIGHTS)}",
            hint="give the folder save_pretrained wrote, or the filter's single file",
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{config_path} is not JSON ({exc})", hint="re-download the model folder") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{config_path} is not a JSON object", hint="re-download the model folder")
    return Source(folder, unwrap(_read_file(weights)), config)


def _read_file(path: Path) -> dict[str, Any]:
    suffix = path.suffix.lower()
    if suffix in SAFETENSORS_SUFFIXES:
        return _read_safetensors(path)
    if suffix in PICKLE_SUFFIXES:
        return _read_pickle(path)
    raise ConfigError(
        f"{path}: enginefarm reads filters from {', '.join(SAFETENSORS_SUFFIXES + PICKLE_SUFFIXES)} files",
        hint="give the file as its authors publish it (e.g. RealESRGAN_x4plus.pth)",
    )


def _read_safetensors(path: Path) -> dict[str, Any]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not a readable safetensors file ({exc})", hint="re-download it") from None


def _read_pickle(path: Path) -> dict[str, Any]:
    import torch

    try:
        # weights_only: the unpickler makes tensors, numbers, strings and containers, and refuses every other global
        # (os.system, a trainer's class) before calling it. mmap: a large file is not read into memory twice.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "detected pickle protocol 4": plain pickles of tensors load fine
            loaded = torch.load(str(path), map_location="cpu", weights_only=True, mmap=_is_zip(path))
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL:? ([\w.]+)", str(exc))
        what = f" (it names {found.group(1)})" if found else ""
        raise ConfigError(
            f"{path}: {NEEDS_CODE}{what}",
            hint="get the weights as .safetensors, or as the plain state dict its authors publish",
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise ConfigError(
            f"{path} is not a torch weights file ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})",
            hint="re-download it; a file cut short or of another format cannot be read",
        ) from None
    if not isinstance(loaded, dict):
        raise ConfigError(
            f"{path} holds a {type(loaded).__name__}, not a dict of weights",
            hint="export the file its authors publish (a state dict), not a whole pickled model",
        )
    return loaded


def _is_zip(path: Path) -> bool:
    with path.open("rb") as file:
        return file.read(4) == b"PK\x03\x04"


def unwrap(loaded: dict[str, Any]) -> dict[str, Any]:
    """The flat name → tensor dict inside what a training script saved: under params_ema (preferred) / params /
    state_dict / model…, or a lone nested dict, with a wrapper's `module.` prefix taken off every key. Entries that
    are not tensors (an epoch, an optimizer's numbers) are left out."""
    import torch

    state = loaded
    for key in NESTING_KEYS:
        if isinstance(state.get(key), dict):
            state = state[key]
            break
    if len(state) == 1 and isinstance(next(iter(state.values())), dict):
        state = next(iter(state.values()))
    for prefix in WRAPPER_PREFIXES:
        if state and all(isinstance(k, str) and k.startswith(prefix) for k in state):
            state = {k[len(prefix) :]: v for k, v in state.items()}
    return {k: v for k, v in state.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}


# What a file that is not a filter looks like, from its keys: (key test, what to tell the user)
_NOT_FILTERS: tuple[tuple[Any, str], ...] = (
    (
        lambda keys: any(k.startswith(("model.diffusion_model.", "conditioner.embedders.")) for k in keys),
        "a Stable Diffusion checkpoint: export it as a model, `enginefarm export FILE --base BASE_FOLDER --out DIR`",
    ),
    (
        lambda keys: any(k.startswith(("lora_unet_", "lora_te")) or ".lora_A." in k or ".lora_up." in k for k in keys),
        "a LoRA: it is applied to a pipeline's weights, not exported on its own",
    ),
    (
        lambda keys: any(k.startswith(("first_stage_model.", "decoder.up.0.", "encoder.down.0.")) for k in keys),
        "a Stable Diffusion VAE: export it with its model, `enginefarm export FILE --base BASE_FOLDER --out DIR`",
    ),
    (
        lambda keys: any(".residual_group.blocks." in k or "layers.0.residual_group" in k for k in keys),
        "a SwinIR-class transformer upscaler that is not SwinIR or HAT (Swin2SR's layout: a patch-embedding conv and "
        "continuous position bias), which enginefarm does not export",
    ),
)


def recognise(source: Source) -> Architecture:
    """The first architecture whose keys `source` has, or ConfigError naming what the file looks like."""
    for architecture in architectures():
        if architecture.matches(source):
            return architecture
    raise ConfigError(f"{source.path}: {describe(source)}", hint=_known_hint())


def describe(source: Source) -> str:
    """What a file no filter architecture matched looks like, in one line."""
    keys = list(source.state)
    if not keys:
        return "holds no tensors"
    for test, what in _NOT_FILTERS:
        if test(keys):
            return what
    if source.config and "_class_name" in source.config:
        return f"a diffusers {source.config['_class_name']}, which is not a filter enginefarm knows"
    if source.config and source.config.get("architectures"):
        return f"a transformers {source.config['architectures'][0]}, which is not a filter enginefarm knows"
    shown = ", ".join(sorted(keys)[:3])
    return f"not a filter enginefarm knows (keys like {shown}{', …' if len(keys) > 3 else ''})"


def _known_hint() -> str:
    names = sorted({a.name for a in architectures()})
    return f"enginefarm exports {', '.join(names)}" if names else "this enginefarm knows no filter architectures"
