"""The families, as data. Sizes are the real models' (from their published configs); an exported model's own
configs decide its actual sizes (`Sizes`), so fine-tunes and the tests' tiny models use the same entries.

Room is left for transformer families (SD3, Flux, Chroma): a new `kind` of component and a new entry here."""

from __future__ import annotations

from .spec import TOKENS, Component, Family, Sizes, Tensor, controlnet_residuals

F32, I64 = "float32", "int64"
ADDED_EMBEDS = "added_embeds"  # the text encoders' rows for added tokens (textual inversion)
LATENT = ("batch", "latent_channels", "height", "width")
IMAGE = ("batch", 3, "image_height", "image_width")

# Validation ranges shared by the denoisers: scaled latents of unit spread, any training timestep, text states.
_DENOISER_RANGES = (("sample", -3.0, 3.0), ("timestep", 0, "last_timestep"), ("encoder_hidden_states", -2.0, 2.0),
                    ("text_embeds", -2.0, 2.0), ("time_ids", 0, "native_pixels"))


def _text_encoder(name: str, index: int, outputs: tuple[Tensor, ...]) -> Component:
    """`added_embeds`: the token embedding of each position whose id is past the vocabulary (ids from vocab_size on:
    textual-inversion tokens the pipeline added), ignored at every other position; zeros when no token was added."""
    inputs = (Tensor("input_ids", I64, ("batch", TOKENS)), Tensor(ADDED_EMBEDS, F32, ("batch", TOKENS, "text_width")))
    return Component(name, "text_encoder", name, inputs, outputs, text_index=index,
                     value_ranges=(("input_ids", 0, "last_token"), (ADDED_EMBEDS, -0.1, 0.1)))


def _clip(name: str = "text_encoder") -> Component:
    """SD 1.x / 2.x: the pipeline reads the final layer (after its layer norm), `text_encoder(ids)[0]`."""
    return _text_encoder(name, 0, (Tensor("last_hidden_state", F32, ("batch", TOKENS, "text_width")),))


def _clip_penultimate(name: str, index: int, pooled: bool) -> Component:
    """SDXL: the pipeline reads the penultimate layer's hidden states (no final layer norm), and the second
    encoder's pooled projection."""
    outputs = (Tensor("hidden_states", F32, ("batch", TOKENS, "text_width")),)
    if pooled:
        outputs += (Tensor("text_embeds", F32, ("batch", "pooled_width")),)
    return _text_encoder(name, index, outputs)


def _denoiser_inputs(time_ids: int) -> tuple[Tensor, ...]:
    inputs = (Tensor("sample", F32, LATENT), Tensor("timestep", F32, ("batch",)),
              Tensor("encoder_hidden_states", F32, ("batch", TOKENS, "cross_attention_dim")))
    if time_ids:
        inputs += (Tensor("text_embeds", F32, ("batch", "pooled_width")), Tensor("time_ids", F32, ("batch", time_ids)))
    return inputs


def _unet(time_ids: int, *, controlnet: bool = False) -> Component:
    """`unet_controlnet` is the same UNet taking the ControlNet's residuals: a second export, so the plain UNet
    stays as fast as a model without ControlNet."""
    return Component("unet_controlnet" if controlnet else "unet", "unet_controlnet" if controlnet else "unet", "unet",
                     _denoiser_inputs(time_ids), (Tensor("out_sample", F32, LATENT),), residuals="inputs" if controlnet else None,
                     value_ranges=_DENOISER_RANGES)


def _controlnet(time_ids: int) -> Component:
    """The conditioning image is in [0, 1] at the image's size; conditioning_scale is the pipeline's to apply."""
    inputs = _denoiser_inputs(time_ids)
    inputs = inputs[:3] + (Tensor("controlnet_cond", F32, IMAGE),) + inputs[3:]
    return Component("controlnet", "controlnet", "controlnet", inputs, (), residuals="outputs",
                     value_ranges=_DENOISER_RANGES + (("controlnet_cond", 0.0, 1.0),))


def _vae(fp32_only: bool = False) -> tuple[Component, Component]:
    """The decoder takes latents already divided by the scaling factor; the encoder gives the latent
    distribution's parameters (mean and log-variance), so the pipeline takes the mean or samples with its own noise."""
    limit = dict(precisions=("fp32",), precisions_reason="this VAE overflows fp16; a fp16-fix VAE can add fp16") if fp32_only else {}
    decoder = Component("vae_decoder", "vae_decoder", "vae", (Tensor("latent_sample", F32, LATENT),), (Tensor("sample", F32, IMAGE),),
                        value_ranges=(("latent_sample", "-unscaled_latent", "unscaled_latent"),), **limit)
    encoder = Component("vae_encoder", "vae_encoder", "vae", (Tensor("sample", F32, IMAGE),),
                        (Tensor("latent_parameters", F32, ("batch", "latent_moments", "height", "width")),),
                        value_ranges=(("sample", -1.0, 1.0),), **limit)
    return decoder, encoder


_SD1_RESIDUALS = controlnet_residuals((320, 640, 1280, 1280), 2)
_SDXL_RESIDUALS = controlnet_residuals((320, 640, 1280), 2)

SD1 = Family(
    id="sd1", title="Stable Diffusion 1.x", pipelines=("StableDiffusionPipeline", "StableDiffusionImg2ImgPipeline"),
    components=(_clip(), _unet(0), *_vae()),
    sizes=Sizes(text_widths=(768,), cross_attention_dim=768, residuals=_SD1_RESIDUALS[0], mid_residual=_SD1_RESIDUALS[1]),
    native_pixels=512, pixel_range=(256, 1024), default_scheduler="PNDMScheduler", controlnet="controlnet-sd1",
)

SD2 = Family(
    id="sd2", title="Stable Diffusion 2.x (512 px, epsilon)", pipelines=SD1.pipelines, components=SD1.components,
    sizes=Sizes(text_widths=(1024,), cross_attention_dim=1024), native_pixels=512, pixel_range=(256, 1024),
    default_scheduler="PNDMScheduler",
)

SD2_V = Family(
    id="sd2-v", title="Stable Diffusion 2.x (768 px, v-prediction)", pipelines=SD1.pipelines, components=SD1.components,
    sizes=SD2.sizes, native_pixels=768, pixel_range=(512, 1024), default_scheduler="DDIMScheduler", prediction_type="v_prediction",
)

# SDXL's VAE overflows fp16 (NaN images) unless it is the "fp16-fix" one: fp32 only, edit the recipe for a fixed VAE.
SDXL = Family(
    id="sdxl", title="Stable Diffusion XL (base)",
    pipelines=("StableDiffusionXLPipeline", "StableDiffusionXLImg2ImgPipeline"),
    components=(_clip_penultimate("text_encoder", 0, pooled=False), _clip_penultimate("text_encoder_2", 1, pooled=True), _unet(6),
                *_vae(fp32_only=True)),
    sizes=Sizes(text_widths=(768, 1280), cross_attention_dim=2048, pooled_width=1280, residuals=_SDXL_RESIDUALS[0],
                mid_residual=_SDXL_RESIDUALS[1]),
    native_pixels=1024, pixel_range=(512, 1536), vae_scaling_factor=0.13025, default_scheduler="EulerDiscreteScheduler",
    text_encoders=("text_encoder", "text_encoder_2"), prompt_output="hidden_states", pooled_output="text_embeds", time_ids=6,
    controlnet="controlnet-sdxl",
)

SDXL_REFINER = Family(
    id="sdxl-refiner", title="Stable Diffusion XL refiner", pipelines=("StableDiffusionXLImg2ImgPipeline",),
    components=(_clip_penultimate("text_encoder_2", 0, pooled=True), _unet(5), *_vae(fp32_only=True)),
    sizes=Sizes(text_widths=(1280,), cross_attention_dim=1280, pooled_width=1280),
    native_pixels=1024, pixel_range=(512, 1536), vae_scaling_factor=0.13025, default_scheduler="EulerDiscreteScheduler",
    text_encoders=("text_encoder_2",), prompt_output="hidden_states", pooled_output="text_embeds", time_ids=5, aesthetic_score=True,
)

CONTROLNET_SD1 = Family(
    id="controlnet-sd1", title="Stable Diffusion 1.x with ControlNet",
    pipelines=("StableDiffusionControlNetPipeline", "StableDiffusionControlNetImg2ImgPipeline"),
    components=(*SD1.components[:2], _unet(0, controlnet=True), _controlnet(0), *SD1.components[2:]),
    sizes=SD1.sizes, native_pixels=SD1.native_pixels, pixel_range=SD1.pixel_range, default_scheduler=SD1.default_scheduler,
    controlnet="sd1",
)

CONTROLNET_SDXL = Family(
    id="controlnet-sdxl", title="Stable Diffusion XL with ControlNet",
    pipelines=("StableDiffusionXLControlNetPipeline", "StableDiffusionXLControlNetImg2ImgPipeline"),
    components=(*SDXL.components[:3], _unet(6, controlnet=True), _controlnet(6), *SDXL.components[3:]),
    sizes=SDXL.sizes, native_pixels=SDXL.native_pixels, pixel_range=SDXL.pixel_range, vae_scaling_factor=SDXL.vae_scaling_factor,
    default_scheduler=SDXL.default_scheduler, text_encoders=SDXL.text_encoders, prompt_output=SDXL.prompt_output,
    pooled_output=SDXL.pooled_output, time_ids=6, controlnet="sdxl",
)

FAMILIES: dict[str, Family] = {f.id: f for f in (SD1, SD2, SD2_V, SDXL, SDXL_REFINER, CONTROLNET_SD1, CONTROLNET_SDXL)}
