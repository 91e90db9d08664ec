"""What a pipeline reads besides its engines: the model's family, tokenizers, scheduler config and component configs,
from the `assets/` folder `enginefarm export` writes (and `build` publishes beside the artifacts)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from enginefarm.errors import ConfigError
from enginefarm.families import Family, Sizes, detect_family, family
from enginefarm.families.config_bounds import check_configs, check_sizes


@dataclass(frozen=True)
class ModelAssets:
    folder: Path
    family: Family
    model_index: dict[str, Any] = field(default_factory=dict)
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)  # diffusers subfolder → its config

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelAssets:
        folder = Path(folder)
        index_path = folder / "model_index.json"
        if not folder.exists() and folder.parent.name == "artifacts":
            raise _evicted(folder)
        if not index_path.is_file():
            raise ConfigError(
                f"{folder}: no model_index.json: not a model's assets folder",
                hint="pass the assets/ folder `enginefarm export` wrote, or load the model from a store that has its "
                "assets",
            )
        model_index = _read_json(index_path)
        configs = {
            p.parent.name: _read_json(p)
            for p in sorted(folder.glob("*/*config.json"))
            if p.name in ("config.json", "scheduler_config.json")
        }
        described = folder / "family.json"
        description = _read_json(described) if described.is_file() else None
        if description is not None and not isinstance(description.get("family"), str):
            raise ConfigError(f"{described}: no family named", hint="re-export the model with `enginefarm export`")
        found = family(description["family"]) if description is not None else detect_family(model_index, configs)
        check_configs(configs, found)  # before any size read from them is allocated (families/config_bounds.py)
        if description is not None and "sizes" in description:
            check_sizes(description["sizes"])
            try:
                Sizes.from_json(description["sizes"])
            except TypeError as exc:
                raise ConfigError(
                    f"{described}: sizes: {exc}", hint="re-export the model with `enginefarm export`"
                ) from None
        return cls(folder, found, model_index, configs)

    @cached_property
    def description(self) -> dict[str, Any]:
        """family.json, which `enginefarm export` writes: the family, the components exported, the sizes."""
        path = self.folder / "family.json"
        return _read_json(path) if path.is_file() else {}

    @property
    def sizes(self) -> Sizes:
        """The sizes the model's configs decided (family.json), else the family's real models'."""
        found = self.description.get("sizes")
        return Sizes.from_json(found) if found else self.family.sizes

    @property
    def components(self) -> tuple[str, ...]:
        """The components the model was exported with (SD3 may ship without T5), else all of the family's."""
        return tuple(self.description.get("components") or self.family.component_names)

    @property
    def latent_multiple(self) -> int:
        """What each latent side must be a multiple of: a transformer's patch size; for a UNet, 2 ** its downsampling
        levels (its exported graph concatenates skips at the sizes it was traced with; diffusers' eager UNet passes
        odd sizes through `upsample_size`, an export cannot)."""
        levels = self.configs.get("unet", {}).get("block_out_channels")
        return self.patch_size * (2 ** (len(levels) - 1) if levels and self.family.denoiser != "transformer" else 1)

    @property
    def patch_size(self) -> int:
        """Latent pixels per transformer token side (1 for UNets; Flux and Chroma: 2, their 2x2 packing)."""
        return self.family.traits.patch_size(self.configs.get("transformer"))

    @property
    def scheduler_config(self) -> dict[str, Any]:
        return self.configs.get("scheduler", {})

    @cached_property
    def vae_scaling_factor(self) -> float:
        return float(self.configs.get("vae", {}).get("scaling_factor", self.family.vae_scaling_factor))

    @property
    def vae_shift_factor(self) -> float:
        return self.family.shift_factor(self.configs.get("vae"))

    @property
    def force_zeros_for_empty_prompt(self) -> bool:
        """SDXL: an absent negative prompt is zeros, not the encoded empty prompt (model_index.json says)."""
        return bool(self.model_index.get("force_zeros_for_empty_prompt", self.family.time_ids == 6))

    @property
    def native_pixels(self) -> int:
        """The image size the UNet (or transformer) was trained at: its config's sample_size × the VAE's factor."""
        sample = (self.configs.get("unet") or self.configs.get("transformer") or {}).get("sample_size")
        return int(sample) * self.family.vae_scale_factor if isinstance(sample, int) else self.family.native_pixels

    @property
    def text_widths(self) -> dict[str, int]:
        """Each text encoder → its width (hidden_size: its token embeddings' too), from its config."""
        encoders = self.family.text_encoders
        return {
            n: int(self.configs.get(n, {}).get("hidden_size") or self.family.sizes.text_widths[i])
            for i, n in enumerate(encoders)
        }

    def tokenizer_folder(self, text_encoder: str) -> Path:
        """text_encoder → tokenizer, text_encoder_2 → tokenizer_2, text_encoder_3 → tokenizer_3 (diffusers' pairing)."""
        name = "tokenizer" + text_encoder.removeprefix("text_encoder")
        folder = self.folder / name
        if not self.folder.exists() and self.folder.parent.name == "artifacts":
            raise _evicted(self.folder)
        if not folder.is_dir():
            raise ConfigError(
                f"{self.folder}: the tokenizer folder {name}/ is missing",
                hint="re-export the model with `enginefarm export`",
            )
        return folder


def _evicted(folder: Path) -> ConfigError:
    return ConfigError(
        f"the model's assets ({folder}) were evicted from the device cache while in use (another process's gc)",
        hint="run it again: they are fetched anew (a quota that small evicts what a load needs)",
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{path}: unreadable ({type(exc).__name__})", hint="re-export the model with `enginefarm export`"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a JSON object", hint="re-export the model with `enginefarm export`")
    return data
