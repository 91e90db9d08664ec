"""What is being exported: the folders, their configs, the family they hold and the sizes those configs decide.
Reads JSON only (no torch), so a wrong folder or an unknown family fails before anything heavy is imported."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from enginefarm.errors import ConfigError, SourceError
from enginefarm.families import Family, Sizes, controlnet_residuals, detect_family, with_controlnet
from enginefarm.families.config_bounds import check_configs

CONFIG_FOLDERS = ("text_encoder", "text_encoder_2", "text_encoder_3", "unet", "transformer", "vae", "controlnet")


@dataclass(frozen=True)
class ExportSource:
    """`pipeline`: a diffusers pipeline folder (model_index.json), or None for a standalone ControlNet export;
    `controlnet`: the folder the ControlNet's weights load from (its config.json beside them)."""

    family: Family
    pipeline: Path | None
    controlnet: Path | None
    model_index: dict
    configs: dict[str, dict]  # component folder → its config.json; "scheduler" → scheduler_config.json
    sizes: Sizes
    vae_scaling_factor: float
    prediction_type: str

    @property
    def components(self) -> tuple[str, ...]:
        """What this export writes: the family's components, or only the ControlNet from a standalone folder."""
        if self.pipeline is None:
            return ("controlnet",)
        return tuple(
            c.name
            for c in self.family.components
            if c.name not in self.family.optional or _present(self.model_index.get(c.folder))
        )

    def folder(self, name: str) -> Path:
        """The folder a diffusers component (unet, vae, controlnet…) loads from."""
        if name == "controlnet" and self.controlnet is not None:
            return self.controlnet
        if self.pipeline is None:
            raise ConfigError(f"a standalone ControlNet folder has no {name}", hint="give the pipeline folder as well")
        return self.pipeline / name


def _present(entry: object) -> bool:
    """model_index.json lists a component a model ships without as [null, null]."""
    return isinstance(entry, list) and len(entry) == 2 and entry[0] is not None


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SourceError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise SourceError(f"{path} is not a JSON object")
    return data


def _is_controlnet_folder(folder: Path) -> bool:
    config = folder / "config.json"
    return config.is_file() and _read_json(config).get("_class_name") == "ControlNetModel"


def read_source(source: Path, controlnet: Path | None = None) -> ExportSource:
    """Detect what `source` (and `controlnet`, a ControlNet folder to add to a pipeline) hold."""
    source = Path(source)
    index_path = source / "model_index.json"
    if not index_path.is_file():
        if _is_controlnet_folder(source) and controlnet is None:
            return _standalone_controlnet(source)
        raise SourceError(
            f"{source} is not a diffusers pipeline folder: {index_path} not found",
            hint="give the folder `save_pretrained` wrote (it holds model_index.json), or a ControlNet folder "
            "(config.json)",
        )
    model_index = _read_json(index_path)
    configs = {
        name: _read_json(source / name / "config.json")
        for name in CONFIG_FOLDERS
        if (source / name / "config.json").is_file()
    }
    if (source / "scheduler" / "scheduler_config.json").is_file():
        configs["scheduler"] = _read_json(source / "scheduler" / "scheduler_config.json")
    family = detect_family(model_index, configs)
    cn_folder = source / "controlnet" if family.is_controlnet else None
    if controlnet is not None:
        controlnet = Path(controlnet)
        if family.is_controlnet:
            raise ConfigError(
                f"{source} already holds a ControlNet; --controlnet adds one to a pipeline without",
                hint="leave out --controlnet",
            )
        if not _is_controlnet_folder(controlnet):
            raise SourceError(
                f"{controlnet} is not a ControlNet folder: {controlnet / 'config.json'} with _class_name "
                "ControlNetModel not found"
            )
        configs["controlnet"] = _read_json(controlnet / "config.json")
        cn_family = detect_family(configs["controlnet"], {})
        family = with_controlnet(family)
        if cn_family.id != family.id:
            raise ConfigError(
                f"the ControlNet in {controlnet} is for {cn_family.title}, the pipeline in {source} is {family.title}",
                hint="pair a ControlNet with a pipeline of its base family",
            )
        cn_folder = controlnet
    shipped = [c for c in family.components if c.name not in family.optional or _present(model_index.get(c.folder))]
    missing = [c.folder for c in shipped if not (source / c.folder).is_dir() and c.folder != "controlnet"]
    if cn_folder is not None and not cn_folder.is_dir():
        missing.append(str(cn_folder))
    if missing:
        raise SourceError(f"{source} ({family.title}) lacks component folders: {', '.join(sorted(set(missing)))}")
    return _with_sizes(family, source, cn_folder, model_index, configs)


def _standalone_controlnet(folder: Path) -> ExportSource:
    config = _read_json(folder / "config.json")
    family = detect_family(config, {})
    return _with_sizes(family, None, folder, config, {"controlnet": config})


def _with_sizes(
    family: Family, pipeline: Path | None, controlnet: Path | None, model_index: dict, configs: dict[str, dict]
) -> ExportSource:
    check_configs(configs, family)  # every size torch or the runtime will allocate from, bounded first
    scheduler = configs.get("scheduler", {})
    vae = configs.get("vae", {})
    if vae and 2 ** (len(vae.get("block_out_channels", (0,) * 4)) - 1) != family.vae_scale_factor:
        raise ConfigError(
            f"the VAE scales images by {2 ** (len(vae['block_out_channels']) - 1)}, {family.title} by "
            f"{family.vae_scale_factor}",
            hint="the pixel-space inputs and outputs are written for the family's scale",
        )
    return ExportSource(
        family=family,
        pipeline=pipeline,
        controlnet=controlnet,
        model_index=model_index,
        configs=configs,
        sizes=_sizes(family, configs),
        vae_scaling_factor=family.scaling_factor(vae),
        prediction_type=family.prediction(scheduler),
    )


def _sizes(family: Family, configs: dict[str, dict]) -> Sizes:
    """`read_sizes`, a config lacking a size the family needs (or holding text for one) said in one line."""
    try:
        return read_sizes(family, configs)
    except KeyError as exc:
        raise ConfigError(
            f"a config of this {family.title} model lacks {exc.args[0]!r}, which its export needs",
            hint="use the configs save_pretrained wrote (each component folder's config.json)",
        ) from None
    except (TypeError, ValueError, IndexError) as exc:
        raise ConfigError(
            f"a config of this {family.title} model has a size that is not a number ({exc})",
            hint="use the configs save_pretrained wrote (each component folder's config.json)",
        ) from None


def read_sizes(family: Family, configs: dict[str, dict]) -> Sizes:
    """The sizes the configs decide, checked against each other where two configs say the same thing."""
    if family.denoiser == "transformer":
        from .transformer_sizes import transformer_sizes

        return transformer_sizes(family, configs)
    denoiser = configs.get("unet") or configs["controlnet"]
    encoders = [configs[name] for name in family.text_encoders if name in configs]
    widths = tuple(int(c["hidden_size"]) for c in encoders)
    cross = int(denoiser["cross_attention_dim"])
    if widths and sum(widths) != cross:
        raise ConfigError(f"the text encoders' widths {widths} do not add up to the UNet's cross_attention_dim {cross}")
    pooled = 0
    if family.time_ids:
        added = int(denoiser["projection_class_embeddings_input_dim"]) - family.time_ids * int(
            denoiser["addition_time_embed_dim"]
        )
        pooled = int(encoders[-1].get("projection_dim", added)) if encoders else added
        if pooled != added:
            raise ConfigError(
                f"the UNet expects text_embeds of width {added} with {family.time_ids} time ids, "
                f"the last text encoder's projection is {pooled}"
            )
    residuals: tuple[tuple[int, int], ...] = ()
    mid = (0, 0)
    if family.is_controlnet:
        residuals, mid = controlnet_residuals(denoiser["block_out_channels"], denoiser["layers_per_block"])
        if "controlnet" in configs and "unet" in configs:
            theirs = controlnet_residuals(
                configs["controlnet"]["block_out_channels"], configs["controlnet"]["layers_per_block"]
            )
            if theirs != (residuals, mid):
                raise ConfigError("the ControlNet's down blocks do not match the UNet's: its residuals would not fit")
    return Sizes(
        text_widths=widths,
        cross_attention_dim=cross,
        # An inpainting UNet takes 9 channels (latents, mask, masked-image latents) and predicts the latent's 4.
        latent_channels=int(denoiser.get("out_channels", denoiser.get("in_channels", 4))),
        sample_channels=int(denoiser.get("in_channels", 4)) if family.inpainting else 0,
        pooled_width=pooled,
        residuals=residuals,
        mid_residual=mid,
        vocab_size=int(encoders[0]["vocab_size"]) if encoders else family.sizes.vocab_size,
        # transformers' CLIPTextConfig default when a config leaves it out, as diffusers would load it
        text_layers=tuple(int(c.get("num_hidden_layers", 12)) for c in encoders),
        num_train_timesteps=int(configs.get("scheduler", {}).get("num_train_timesteps", 1000)),
    )
