"""The families, as data. Sizes are the real models' (from their published configs); an exported model's own
configs decide its actual sizes (`Sizes`), so fine-tunes and the tests' tiny models use the same entries.

Transformer families (SD3, SD3.5; Flux and Chroma plug in the same way) have a `transformer` component, text
encoders whose token counts differ (`Sizes.text_lengths`), and a `JointText` saying how the prompt is assembled."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from . import traits
from .spec import TOKENS, Component, Family, JointText, Sizes, Tensor, controlnet_residuals

F32, I64 = "float32", "int64"
ADDED_EMBEDS = "added_embeds"  # the text encoders' rows for added tokens (textual inversion)
LATENT = ("batch", "latent_channels", "height", "width")
# An inpainting UNet's sample: the latents, the mask and the masked image's latents on the channel axis.
INPAINT_SAMPLE = ("batch", "sample_channels", "height", "width")
IMAGE = ("batch", 3, "image_height", "image_width")

# Validation ranges shared by the denoisers: scaled latents of unit spread, any training timestep, text states.
_DENOISER_RANGES = (
    ("sample", -3.0, 3.0),
    ("timestep", 0, "last_timestep"),
    ("encoder_hidden_states", -2.0, 2.0),
    ("text_embeds", -2.0, 2.0),
    ("time_ids", 0, "native_pixels"),
)


def _text_encoder(name: str, index: int, outputs: tuple[Tensor, ...]) -> Component:
    """`added_embeds`: the token embedding of each position whose id is past the vocabulary (ids from vocab_size on:
    textual-inversion tokens the pipeline added), ignored at every other position; zeros when no token was added."""
    inputs = (Tensor("input_ids", I64, ("batch", TOKENS)), Tensor(ADDED_EMBEDS, F32, ("batch", TOKENS, "text_width")))
    return Component(
        name,
        "text_encoder",
        name,
        inputs,
        outputs,
        text_index=index,
        value_ranges=(("input_ids", 0, "last_token"), (ADDED_EMBEDS, -0.1, 0.1)),
    )


# The UNet families' CLIP encoders also give every layer's states for clip_skip (`layer_states`: [batch, layers + 1,
# 77, width], the embeddings first; SD 1.x/2.x's through the final layer norm, as diffusers' clip_skip reads them,
# SDXL's raw) and take compel's `attention_mask` (1: attend; compel masks down-weighted words out).
LAYER_STATES = "layer_states"


def _weighted_clip(component: Component) -> Component:
    return replace(
        component,
        inputs=component.inputs + (Tensor("attention_mask", I64, ("batch", TOKENS)),),
        outputs=component.outputs + (Tensor(LAYER_STATES, F32, ("batch", "text_layers", TOKENS, "text_width")),),
        value_ranges=component.value_ranges + (("attention_mask", 1, 1),),
    )


def _clip(name: str = "text_encoder") -> Component:
    """SD 1.x / 2.x: the pipeline reads the final layer (after its layer norm), `text_encoder(ids)[0]`."""
    plain = _text_encoder(name, 0, (Tensor("last_hidden_state", F32, ("batch", TOKENS, "text_width")),))
    return _weighted_clip(plain)


def _clip_penultimate(name: str, index: int, pooled: bool) -> Component:
    """SDXL: the pipeline reads the penultimate layer's hidden states (no final layer norm), and the second
    encoder's pooled projection."""
    outputs: tuple[Tensor, ...] = (Tensor("hidden_states", F32, ("batch", TOKENS, "text_width")),)
    if pooled:
        outputs += (Tensor("text_embeds", F32, ("batch", "pooled_width")),)
    return _weighted_clip(_text_encoder(name, index, outputs))


def _denoiser_inputs(time_ids: int, sample: tuple[str, ...] = LATENT) -> tuple[Tensor, ...]:
    inputs: tuple[Tensor, ...] = (
        Tensor("sample", F32, sample),
        Tensor("timestep", F32, ("batch",)),
        # a long prompt is several chunks of CLIP's 77 tokens (spec.PROMPT_TOKENS)
        Tensor("encoder_hidden_states", F32, ("batch", "prompt_tokens", "cross_attention_dim")),
    )
    if time_ids:
        inputs += (Tensor("text_embeds", F32, ("batch", "pooled_width")), Tensor("time_ids", F32, ("batch", time_ids)))
    return inputs


def _unet(time_ids: int, *, controlnet: bool = False, inpaint: bool = False) -> Component:
    """`unet_controlnet` is the same UNet taking the ControlNet's residuals: a second export, so the plain UNet
    stays as fast as a model without ControlNet. `inpaint`: the sample has the inpainting UNet's 9 channels."""
    return Component(
        "unet_controlnet" if controlnet else "unet",
        "unet_controlnet" if controlnet else "unet",
        "unet",
        _denoiser_inputs(time_ids, INPAINT_SAMPLE if inpaint else LATENT),
        (Tensor("out_sample", F32, LATENT),),
        residuals="inputs" if controlnet else None,
        value_ranges=_DENOISER_RANGES,
    )


def _controlnet(time_ids: int) -> Component:
    """The conditioning image is in [0, 1] at the image's size; conditioning_scale is the pipeline's to apply."""
    inputs = _denoiser_inputs(time_ids)
    inputs = inputs[:3] + (Tensor("controlnet_cond", F32, IMAGE),) + inputs[3:]
    return Component(
        "controlnet",
        "controlnet",
        "controlnet",
        inputs,
        (),
        residuals="outputs",
        value_ranges=_DENOISER_RANGES + (("controlnet_cond", 0.0, 1.0),),
    )


# -- transformer families

_TRANSFORMER_RANGES = (
    ("hidden_states", -3.0, 3.0),
    ("timestep", 0, "last_timestep"),
    ("encoder_hidden_states", -2.0, 2.0),
    ("pooled_projections", -2.0, 2.0),
)


def _t5(name: str, index: int) -> Component:
    """T5's encoder: the pipelines read its last hidden state, at the pipeline's token count (`text_length`, dynamic:
    diffusers' max_sequence_length; the transformer's `context_tokens` follow it). Trained T5 (v1.1, XXL) overflows fp16
    in its feed-forward outputs, which random weights cannot show: fp32 (or bf16 where a backend computes it) until a
    keep-list is proven on the real weights."""
    return Component(
        name,
        "text_encoder",
        name,
        (Tensor("input_ids", I64, ("batch", "text_length")),),
        (Tensor("last_hidden_state", F32, ("batch", "text_length", "text_width")),),
        text_index=index,
        tokenizer="t5",
        value_ranges=(("input_ids", 0, "last_token"),),
        precisions=("fp32", "bf16"),
        precisions_reason="trained T5 overflows fp16 (feed-forward outputs past 65504)",
    )


def _clip_with_projection(name: str, index: int) -> Component:
    """SD3: the penultimate hidden states and the pooled projection of each CLIP, whose widths are its own."""
    outputs = (
        Tensor("hidden_states", F32, ("batch", TOKENS, "text_width")),
        Tensor("text_embeds", F32, ("batch", "projection_width")),
    )
    return _text_encoder(name, index, outputs)


# The sinusoidal timestep embedding multiplies timesteps up to 1000 by frequencies up to 1: in fp16 (spacing 0.5 at
# 1000) the sin/cos arguments are off by up to 0.25 radians. Kept fp32, the tiny SD3's fp16 image on ONNX Runtime went
# from 5.8e-3 to 5.0e-3 of diffusers' (OpenVINO compresses weights itself; keep-lists do not apply there). The names
# are diffusers' module paths, the same in the real models.
# `input:timestep` (formats/fp16_rules.input_path; OpenVINO's fp16 builds only) keeps what the timestep goes through
# before the first weights, the embedding's input included (computed in f16 on this CPU otherwise: the tiny SD3
# transformer 1.8e-3 off fp32, 4.3e-4 kept).
_SD3_TIMESTEP_EMBEDDING = tuple(
    f"/model/time_text_embed/time_proj/{op}" for op in ("Unsqueeze", "Cast", "Mul", "Sin", "Cos")
) + ("input:timestep",)


def _sd3_transformer() -> Component:
    """SD3Transformer2DModel: unpatched latents in and out (it patches and unpatches them itself)."""
    inputs = (
        Tensor("hidden_states", F32, LATENT),
        Tensor("timestep", F32, ("batch",)),
        Tensor("encoder_hidden_states", F32, ("batch", "context_tokens", "cross_attention_dim")),
        Tensor("pooled_projections", F32, ("batch", "pooled_width")),
    )
    return Component(
        "transformer",
        "transformer",
        "transformer",
        inputs,
        (Tensor("out_sample", F32, LATENT),),
        value_ranges=_TRANSFORMER_RANGES,
        fp16_keep_fp32=_SD3_TIMESTEP_EMBEDDING,
    )


def _vae(fp32_only: bool = False) -> tuple[Component, Component]:
    """The decoder takes latents already divided by the scaling factor; the encoder gives the latent
    distribution's parameters (mean and log-variance), so the pipeline takes the mean or samples with its own noise."""
    limit: dict[str, Any] = (
        dict(precisions=("fp32",), precisions_reason="this VAE overflows fp16; a fp16-fix VAE can add fp16")
        if fp32_only
        else {}
    )
    decoder = Component(
        "vae_decoder",
        "vae_decoder",
        "vae",
        (Tensor("latent_sample", F32, LATENT),),
        (Tensor("sample", F32, IMAGE),),
        value_ranges=(("latent_sample", "-unscaled_latent", "unscaled_latent"),),
        **limit,
    )
    encoder = Component(
        "vae_encoder",
        "vae_encoder",
        "vae",
        (Tensor("sample", F32, IMAGE),),
        (Tensor("latent_parameters", F32, ("batch", "latent_moments", "height", "width")),),
        value_ranges=(("sample", -1.0, 1.0),),
        **limit,
    )
    return decoder, encoder


_SD1_RESIDUALS = controlnet_residuals((320, 640, 1280, 1280), 2)
_SDXL_RESIDUALS = controlnet_residuals((320, 640, 1280), 2)

SD1 = Family(
    id="sd1",
    title="Stable Diffusion 1.x",
    pipelines=("StableDiffusionPipeline", "StableDiffusionImg2ImgPipeline"),
    components=(_clip(), _unet(0), *_vae()),
    sizes=Sizes(
        text_widths=(768,),
        cross_attention_dim=768,
        residuals=_SD1_RESIDUALS[0],
        mid_residual=_SD1_RESIDUALS[1],
        text_layers=(12,),
    ),
    native_pixels=512,
    pixel_range=(256, 768),
    default_scheduler="PNDMScheduler",
    controlnet="controlnet-sd1",
)

SD2 = Family(
    id="sd2",
    title="Stable Diffusion 2.x (512 px, epsilon)",
    pipelines=SD1.pipelines,
    components=SD1.components,
    sizes=Sizes(text_widths=(1024,), cross_attention_dim=1024, text_layers=(23,)),
    native_pixels=512,
    pixel_range=(256, 768),
    default_scheduler="PNDMScheduler",
)

SD2_V = Family(
    id="sd2-v",
    title="Stable Diffusion 2.x (768 px, v-prediction)",
    pipelines=SD1.pipelines,
    components=SD1.components,
    sizes=SD2.sizes,
    native_pixels=768,
    pixel_range=(512, 768),
    default_scheduler="DDIMScheduler",
    prediction_type="v_prediction",
)

# SDXL's VAE overflows fp16 (NaN images) unless it is the "fp16-fix" one: fp32 only, edit the recipe for a fixed VAE.
SDXL = Family(
    id="sdxl",
    title="Stable Diffusion XL (base)",
    pipelines=("StableDiffusionXLPipeline", "StableDiffusionXLImg2ImgPipeline"),
    components=(
        _clip_penultimate("text_encoder", 0, pooled=False),
        _clip_penultimate("text_encoder_2", 1, pooled=True),
        _unet(6),
        *_vae(fp32_only=True),
    ),
    sizes=Sizes(
        text_widths=(768, 1280),
        cross_attention_dim=2048,
        pooled_width=1280,
        text_layers=(12, 32),
        residuals=_SDXL_RESIDUALS[0],
        mid_residual=_SDXL_RESIDUALS[1],
    ),
    native_pixels=1024,
    pixel_range=(512, 1024),
    vae_scaling_factor=0.13025,
    default_scheduler="EulerDiscreteScheduler",
    text_encoders=("text_encoder", "text_encoder_2"),
    prompt_output="hidden_states",
    pooled_output="text_embeds",
    time_ids=6,
    controlnet="controlnet-sdxl",
)

SDXL_REFINER = Family(
    id="sdxl-refiner",
    title="Stable Diffusion XL refiner",
    pipelines=("StableDiffusionXLImg2ImgPipeline",),
    components=(_clip_penultimate("text_encoder_2", 0, pooled=True), _unet(5), *_vae(fp32_only=True)),
    sizes=Sizes(text_widths=(1280,), cross_attention_dim=1280, pooled_width=1280, text_layers=(32,)),
    native_pixels=1024,
    pixel_range=(512, 1024),
    vae_scaling_factor=0.13025,
    default_scheduler="EulerDiscreteScheduler",
    text_encoders=("text_encoder_2",),
    prompt_output="hidden_states",
    pooled_output="text_embeds",
    time_ids=5,
    aesthetic_score=True,
)

CONTROLNET_SD1 = Family(
    id="controlnet-sd1",
    title="Stable Diffusion 1.x with ControlNet",
    pipelines=("StableDiffusionControlNetPipeline", "StableDiffusionControlNetImg2ImgPipeline"),
    components=(*SD1.components[:2], _unet(0, controlnet=True), _controlnet(0), *SD1.components[2:]),
    sizes=SD1.sizes,
    native_pixels=SD1.native_pixels,
    pixel_range=SD1.pixel_range,
    default_scheduler=SD1.default_scheduler,
    controlnet="sd1",
)

CONTROLNET_SDXL = Family(
    id="controlnet-sdxl",
    title="Stable Diffusion XL with ControlNet",
    pipelines=("StableDiffusionXLControlNetPipeline", "StableDiffusionXLControlNetImg2ImgPipeline"),
    components=(*SDXL.components[:3], _unet(6, controlnet=True), _controlnet(6), *SDXL.components[3:]),
    sizes=SDXL.sizes,
    native_pixels=SDXL.native_pixels,
    pixel_range=SDXL.pixel_range,
    vae_scaling_factor=SDXL.vae_scaling_factor,
    default_scheduler=SDXL.default_scheduler,
    text_encoders=SDXL.text_encoders,
    prompt_output=SDXL.prompt_output,
    pooled_output=SDXL.pooled_output,
    time_ids=6,
    controlnet="sdxl",
)

# Inpainting models (SD 1.5, SD 2 and SDXL inpainting): the base family's UNet with 9 input channels (the latents,
# the mask at latent size and the masked image's latents), saved as the inpaint pipelines or, by some fine-tunes, as
# the plain ones (detect.py tells them apart by the UNet's in_channels). The VAE encoder is part of every call.
_INPAINT_CHANNELS = 9


def _inpainting(base: Family, family_id: str, title: str, pipeline: str) -> Family:
    components = tuple(_unet(base.time_ids, inpaint=True) if c.kind == "unet" else c for c in base.components)
    return replace(
        base,
        id=family_id,
        title=title,
        pipelines=(pipeline,),
        components=components,
        sizes=replace(base.sizes, sample_channels=_INPAINT_CHANNELS, residuals=(), mid_residual=(0, 0)),
        controlnet=None,
    )


SD1_INPAINT = _inpainting(SD1, "sd1-inpaint", "Stable Diffusion 1.x inpainting", "StableDiffusionInpaintPipeline")
SD2_INPAINT = _inpainting(SD2, "sd2-inpaint", "Stable Diffusion 2.x inpainting", "StableDiffusionInpaintPipeline")
SDXL_INPAINT = _inpainting(SDXL, "sdxl-inpaint", "Stable Diffusion XL inpainting", "StableDiffusionXLInpaintPipeline")

# SD3 and SD3.5 share the pipeline class and the transformer class; 3.5 adds RMS-normalized attention (qk_norm) and,
# in Medium, dual attention layers. Their ONNX contracts are the same: two entries so a model says what it is.
_SD3_TEXT = JointText(
    width=("text_encoder", "text_encoder_2"), tokens=("text_encoder_3",), pooled=("text_encoder", "text_encoder_2")
)
_SD3_T5_TOKENS = 256  # the pipeline's max_sequence_length default

SD3 = Family(
    id="sd3",
    title="Stable Diffusion 3 (Medium)",
    pipelines=("StableDiffusion3Pipeline", "StableDiffusion3Img2ImgPipeline"),
    components=(
        _clip_with_projection("text_encoder", 0),
        _clip_with_projection("text_encoder_2", 1),
        _t5("text_encoder_3", 2),
        _sd3_transformer(),
        *_vae(),
    ),
    sizes=Sizes(
        text_widths=(768, 1280, 4096),
        cross_attention_dim=4096,
        latent_channels=16,
        pooled_width=2048,
        text_lengths=(TOKENS, TOKENS, _SD3_T5_TOKENS),
        vocab_sizes=(49408, 49408, 32128),
        projection_widths=(768, 1280, 0),
        context_tokens=TOKENS + _SD3_T5_TOKENS,
    ),
    native_pixels=1024,
    pixel_range=(512, 1024),
    vae_scaling_factor=1.5305,
    vae_shift_factor=0.0609,
    default_scheduler="FlowMatchEulerDiscreteScheduler",
    prediction_type="flow",
    text_encoders=("text_encoder", "text_encoder_2", "text_encoder_3"),
    prompt_output="hidden_states",
    joint_text=_SD3_TEXT,
    optional=("text_encoder_3",),
    guidance_scale=7.0,
    traits=traits.MMDIT,
)

SD3_5 = Family(
    id="sd3.5",
    title="Stable Diffusion 3.5 (Large, Medium)",
    pipelines=SD3.pipelines,
    components=SD3.components,
    sizes=SD3.sizes,
    native_pixels=1024,
    pixel_range=(512, 1024),
    vae_scaling_factor=1.5305,
    vae_shift_factor=0.0609,
    default_scheduler=SD3.default_scheduler,
    prediction_type="flow",
    text_encoders=SD3.text_encoders,
    prompt_output="hidden_states",
    joint_text=_SD3_TEXT,
    optional=SD3.optional,
    guidance_scale=3.5,
    traits=SD3.traits,
)

# Flux.1 and Chroma: the transformer takes unpacked latents like SD3's; the export packs them into 2x2-patch
# tokens and builds the position ids inside the graph (export/flux.py), so every dynamic dim is batch/height/width.
# fp16: the sinusoidal timestep (and guidance) embeddings multiply t · 1000 by frequencies kept as fp16 constants,
# which moves sin/cos by up to a radian; those scopes stay fp32 (Flux dev's tiny transformer: 1.0e-2 → 1.1e-3).
# The default T5 token counts (the profiles' opt; any count in the profile's range can be asked for per call): dev
# and Chroma 512, diffusers' max_sequence_length default; schnell 256, what it was trained with and its model card
# uses (BFL's reference sampler too), where diffusers' FluxPipeline defaults to 512 for both.
_FLUX_T5_TOKENS, _SCHNELL_T5_TOKENS = 512, 256
_TIME_SCOPES = ("/model/time_text_embed/time_proj/",)
# ... and on OpenVINO the timestep's (and guidance's) way there: the export feeds t / 1000, the model multiplies it
# back, both in f16 otherwise (the tiny Chroma transformer 1.3e-2 off fp32 at f16, 4.1e-4 with these kept).
_TIME_PATH = ("input:timestep",)


def _flux_transformer(guidance: bool) -> Component:
    inputs: tuple[Tensor, ...] = (
        Tensor("hidden_states", F32, LATENT),
        Tensor("timestep", F32, ("batch",)),
        Tensor("encoder_hidden_states", F32, ("batch", "context_tokens", "cross_attention_dim")),
        Tensor("pooled_projections", F32, ("batch", "pooled_width")),
    )
    ranges: tuple[tuple[str, object, object], ...] = _TRANSFORMER_RANGES
    if guidance:  # dev's distilled guidance: the scale is an input, embedded like the timestep
        inputs += (Tensor("guidance", F32, ("batch",)),)
        ranges += (("guidance", 1.0, 10.0),)
    keep = (
        _TIME_SCOPES
        + (("/model/time_text_embed/time_proj_1/",) if guidance else ())
        + _TIME_PATH
        + (("input:guidance",) if guidance else ())
    )
    return Component(
        "transformer",
        "transformer",
        "transformer",
        inputs,
        (Tensor("out_sample", F32, LATENT),),
        value_ranges=ranges,
        fp16_keep_fp32=keep,
    )


def _chroma_transformer() -> Component:
    """Chroma: T5 alone, no pooled text; `attention_mask` over the text tokens (the image tokens are appended
    attended)."""
    inputs = (
        Tensor("hidden_states", F32, LATENT),
        Tensor("timestep", F32, ("batch",)),
        Tensor("encoder_hidden_states", F32, ("batch", "context_tokens", "cross_attention_dim")),
        Tensor("attention_mask", F32, ("batch", "context_tokens")),
    )
    return Component(
        "transformer",
        "transformer",
        "transformer",
        inputs,
        (Tensor("out_sample", F32, LATENT),),
        value_ranges=_TRANSFORMER_RANGES + (("attention_mask", 0.0, 1.0),),
        fp16_keep_fp32=_TIME_SCOPES + ("/model/time_text_embed/guidance_proj/",) + _TIME_PATH,
    )


def _t5_masked(name: str, index: int) -> Component:
    """Chroma's T5 reads the tokenizer's attention mask (Flux's and SD3's do not)."""
    plain = _t5(name, index)
    return Component(
        name,
        "text_encoder",
        name,
        plain.inputs + (Tensor("attention_mask", I64, ("batch", "text_length")),),
        plain.outputs,
        text_index=index,
        tokenizer="t5",
        value_ranges=plain.value_ranges + (("attention_mask", 0, 1),),
        precisions=plain.precisions,
        precisions_reason=plain.precisions_reason,
    )


_FLUX_CLIP = _text_encoder("text_encoder", 0, (Tensor("pooler_output", F32, ("batch", "text_width")),))
_FLUX_SIZES = Sizes(
    text_widths=(768, 4096),
    cross_attention_dim=4096,
    latent_channels=16,
    pooled_width=768,
    text_lengths=(TOKENS, _FLUX_T5_TOKENS),
    vocab_sizes=(49408, 32128),
    projection_widths=(768, 0),
    context_tokens=_FLUX_T5_TOKENS,
)
_FLUX_COMMON: dict[str, Any] = dict(
    native_pixels=1024,
    pixel_range=(512, 1024),
    vae_scaling_factor=0.3611,
    vae_shift_factor=0.1159,
    default_scheduler="FlowMatchEulerDiscreteScheduler",
    prediction_type="flow",
)

FLUX = Family(
    id="flux",
    title="Flux.1 dev",
    pipelines=("FluxPipeline", "FluxImg2ImgPipeline"),
    components=(_FLUX_CLIP, _t5("text_encoder_2", 1), _flux_transformer(guidance=True), *_vae()),
    sizes=_FLUX_SIZES,
    **_FLUX_COMMON,
    text_encoders=("text_encoder", "text_encoder_2"),
    prompt_output="last_hidden_state",
    joint_text=JointText(tokens=("text_encoder_2",), pooled=("text_encoder",)),
    guidance_scale=3.5,
    traits=traits.FLUX_DEV,
    batch_range=(1, 1, 2),
)

FLUX_SCHNELL = Family(
    id="flux-schnell",
    title="Flux.1 schnell",
    pipelines=FLUX.pipelines,
    components=(_FLUX_CLIP, _t5("text_encoder_2", 1), _flux_transformer(guidance=False), *_vae()),
    sizes=replace(_FLUX_SIZES, text_lengths=(TOKENS, _SCHNELL_T5_TOKENS), context_tokens=_SCHNELL_T5_TOKENS),
    **_FLUX_COMMON,
    text_encoders=FLUX.text_encoders,
    prompt_output="last_hidden_state",
    joint_text=FLUX.joint_text,
    guidance_scale=0.0,
    traits=traits.FLUX_SCHNELL,
    batch_range=(1, 1, 2),
    default_steps=4,  # timestep-distilled: its model card samples 4 steps
)

CHROMA = Family(
    id="chroma",
    title="Chroma",
    pipelines=("ChromaPipeline", "ChromaImg2ImgPipeline"),
    components=(_t5_masked("text_encoder", 0), _chroma_transformer(), *_vae()),
    sizes=Sizes(
        text_widths=(4096,),
        cross_attention_dim=4096,
        latent_channels=16,
        text_lengths=(_FLUX_T5_TOKENS,),
        vocab_sizes=(32128,),
        projection_widths=(0,),
        context_tokens=_FLUX_T5_TOKENS,
    ),
    **_FLUX_COMMON,
    text_encoders=("text_encoder",),
    prompt_output="last_hidden_state",
    joint_text=JointText(tokens=("text_encoder",)),
    guidance_scale=5.0,
    traits=traits.CHROMA,
)

FAMILIES: dict[str, Family] = {
    f.id: f
    for f in (
        SD1,
        SD2,
        SD2_V,
        SDXL,
        SDXL_REFINER,
        CONTROLNET_SD1,
        CONTROLNET_SDXL,
        SD1_INPAINT,
        SD2_INPAINT,
        SDXL_INPAINT,
        SD3,
        SD3_5,
        FLUX,
        FLUX_SCHNELL,
        CHROMA,
    )
}
