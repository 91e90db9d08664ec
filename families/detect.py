"""Which family a diffusers folder holds, from its model_index.json and its components' configs alone."""

from __future__ import annotations

from enginefarm.errors import ConfigError

from .spec import Family
from .table import FAMILIES

_HINT = f"known families: {', '.join(FAMILIES)}"
# SD 1.x and 2.x share a pipeline class; their UNets differ in the text width they attend to, and 2.x's 768-pixel
# model predicts v (its scheduler config says): (width, prediction type) → family, any other prediction as epsilon.
_SD_BY_TEXT_WIDTH = {(768, "epsilon"): "sd1", (1024, "epsilon"): "sd2", (1024, "v_prediction"): "sd2-v"}
# Their inpainting families (a 9-channel UNet saved as either pipeline; the v model's inpainting is SD 2.x's).
_SD_INPAINTING = {"sd1": "sd1-inpaint", "sd2": "sd2-inpaint", "sd2-v": "sd2-inpaint"}
_SD_PIPELINES = ("StableDiffusionPipeline", "StableDiffusionImg2ImgPipeline", "StableDiffusionInpaintPipeline")
_INPAINT_CHANNELS = 9  # latents, mask, masked-image latents


def family(family_id: str) -> Family:
    try:
        return FAMILIES[family_id]
    except KeyError:
        raise ConfigError(f"unknown model family {family_id!r}", hint=_HINT) from None


def with_controlnet(base: Family) -> Family:
    """The ControlNet variant of `base` (sd1 → controlnet-sd1); a ControlNet family is its own."""
    if base.is_controlnet:
        return base
    if base.controlnet is None:
        raise ConfigError(
            f"there is no ControlNet family for {base.id} ({base.title})",
            hint="ControlNet is supported for: "
            f"{', '.join(f.controlnet for f in FAMILIES.values() if f.is_controlnet and f.controlnet)}",
        )
    return FAMILIES[base.controlnet]


def detect_family(model_index: dict, configs: dict[str, dict]) -> Family:
    """The family of a diffusers folder. `model_index` is its model_index.json, `configs` the config of each
    component folder by name (unet, scheduler, controlnet…; missing ones are simply absent). A standalone
    ControlNet folder passes its config.json as `model_index` (its `_class_name` is ControlNetModel)."""
    cls = model_index.get("_class_name")
    if cls == "ControlNetModel":
        return with_controlnet(_controlnet_base(model_index))
    unet = configs.get("unet", {})
    channels = unet.get("in_channels", 4)
    if channels == _INPAINT_CHANNELS:
        return _inpainting(cls, unet, configs.get("scheduler", {}))
    if channels != 4:
        raise ConfigError(
            f"{cls} with a {channels}-channel UNet (a depth or other image-conditioned model) is not a supported "
            "family yet",
            hint=f"{_HINT}; UNets with 4 channels, or 9 (inpainting)",
        )
    if cls in _SD_PIPELINES:
        return _sd(unet, configs.get("scheduler", {}))
    if cls in ("StableDiffusionXLPipeline", "StableDiffusionXLInpaintPipeline"):
        return FAMILIES["sdxl"]
    if cls == "StableDiffusionXLImg2ImgPipeline":
        # The refiner is saved as the img2img pipeline without the first text encoder, conditioned on aesthetics.
        no_first_encoder = not _present(model_index.get("text_encoder"))
        return FAMILIES["sdxl-refiner" if no_first_encoder or model_index.get("requires_aesthetics_score") else "sdxl"]
    if cls in FAMILIES["controlnet-sd1"].pipelines:
        base = _sd(unet, configs.get("scheduler", {}))
        return with_controlnet(base)
    if cls in FAMILIES["controlnet-sdxl"].pipelines:
        return FAMILIES["controlnet-sdxl"]
    if cls in FAMILIES["sd3"].pipelines:
        # SD3.5 normalizes attention queries and keys (qk_norm); Medium also has dual attention layers.
        transformer = configs.get("transformer", {})
        return FAMILIES["sd3.5" if transformer.get("qk_norm") or transformer.get("dual_attention_layers") else "sd3"]
    if cls in FAMILIES["flux"].pipelines:
        # dev is guidance-distilled (the scale is a transformer input); schnell is timestep-distilled, without one.
        return FAMILIES["flux" if configs.get("transformer", {}).get("guidance_embeds") else "flux-schnell"]
    if cls in FAMILIES["chroma"].pipelines:
        return FAMILIES["chroma"]
    raise ConfigError(
        f"unknown model family: model_index.json's _class_name is {cls!r}",
        hint=f"supported pipelines: {', '.join(sorted({p for f in FAMILIES.values() for p in f.pipelines}))}",
    )


def _inpainting(cls: str | None, unet: dict, scheduler: dict) -> Family:
    """The inpainting family of a 9-channel UNet, saved as an inpaint pipeline or (some fine-tunes) a plain one."""
    if cls in _SD_PIPELINES:
        return FAMILIES[_SD_INPAINTING[_sd(unet, scheduler).id]]
    if cls in ("StableDiffusionXLPipeline", "StableDiffusionXLInpaintPipeline"):
        return FAMILIES["sdxl-inpaint"]
    raise ConfigError(
        f"{cls} with a 9-channel (inpainting) UNet is not a supported family",
        hint="an inpainting UNet is supported in StableDiffusion(XL)InpaintPipeline or StableDiffusion(XL)Pipeline",
    )


def _present(entry: object) -> bool:
    """model_index.json lists a missing component as [null, null]."""
    return isinstance(entry, list) and len(entry) == 2 and entry[0] is not None


def _sd(unet: dict, scheduler: dict) -> Family:
    width = unet.get("cross_attention_dim")  # one number, or (in some configs) a list of one per block
    prediction = scheduler.get("prediction_type")
    prediction = prediction if isinstance(prediction, str) else "epsilon"
    found = (
        _SD_BY_TEXT_WIDTH.get((width, prediction)) or _SD_BY_TEXT_WIDTH.get((width, "epsilon"))
        if isinstance(width, int)
        else None
    )
    if found is None:
        raise ConfigError(
            f"unknown model family: a Stable Diffusion UNet with cross_attention_dim {width!r} (SD 1.x has 768, SD "
            "2.x 1024)",
            hint=_HINT,
        )
    return FAMILIES[found]


def _controlnet_base(config: dict) -> Family:
    if config.get("addition_embed_type") == "text_time":
        return FAMILIES["sdxl"]
    width = config.get("cross_attention_dim")
    if width == 768:
        return FAMILIES["sd1"]
    raise ConfigError(
        f"unknown model family: a ControlNet with cross_attention_dim {width!r} and no SDXL conditioning",
        hint="ControlNets for SD 1.x (768) and SDXL (addition_embed_type text_time) are supported",
    )
