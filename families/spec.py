"""The shapes of family knowledge: tensors, components, families, and the sizes a model's configs fill in.

A tensor's shape is written once per family with three kinds of dims:
- an int: fixed (77 text tokens);
- a dynamic dim name (`batch`, latent `height`/`width`, pixel `image_height`/`image_width`, `height_div2`… for
  ControlNet residuals at lower resolutions, and the transformer families' T5 token count `text_length` with the
  transformer's `context_tokens` it decides): the ONNX file names it, the recipe ranges it;
- a size name (`text_width`, `cross_attention_dim`…): a number the model's configs decide, fixed in the ONNX file.
  `Sizes` holds them; each family's `sizes` are its real models', and the exporter reads the actual ones.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from .traits import Traits

TOKENS = 77  # CLIP's context: every prompt is padded or cut to it, so CLIP's text length is never dynamic
# T5's token count is the pipeline's choice (diffusers' `max_sequence_length`, at most 512 there): dynamic, from
# TEXT_LENGTH_MIN (below it nearly every prompt would be cut) to TEXT_LENGTH_MAX, the family's default as the opt.
TEXT_DIMS = ("text_length", "context_tokens")
TEXT_LENGTH_MIN, TEXT_LENGTH_MAX = 16, 512
# The UNet's text tokens: one prompt chunk of CLIP's 77, or several for a long prompt (diffusion/weighted_text.py).
# The profile's opt is one chunk (the default path's speed); its max 4 chunks, 300 words' worth.
PROMPT_TOKENS = "prompt_tokens"
PROMPT_CHUNKS_MAX = 4

LATENT_DIMS = ("height", "width")
IMAGE_DIMS = ("image_height", "image_width")


def downscaled(dim: str, factor: int) -> str:
    """The name of a latent dim divided by `factor` (ControlNet residuals below the top resolution)."""
    return dim if factor == 1 else f"{dim}_div{factor}"


def is_dynamic(dim: int | str) -> bool:
    return isinstance(dim, str) and (
        dim in ("batch", *LATENT_DIMS, *IMAGE_DIMS, *TEXT_DIMS, PROMPT_TOKENS)
        or dim.split("_div")[0] in LATENT_DIMS
        and "_div" in dim
    )


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str  # as numpy and onnx.helper spell it: "float32", "int64"
    shape: tuple[int | str, ...]


@dataclass(frozen=True)
class Sizes:
    """What a model's configs decide. `text_widths`: each text encoder's hidden size, in the family's encoder
    order; `pooled_width`: the last encoder's projection (SDXL's text_embeds); `residuals`: (channels, downscale)
    of each ControlNet down-block residual, then the mid-block's."""

    text_widths: tuple[int, ...]
    cross_attention_dim: int
    latent_channels: int = 4
    # The UNet's `sample` channels where they differ from the latent's (inpainting: latents, mask and masked-image
    # latents, 4 + 1 + 4 = 9); 0: the latent's.
    sample_channels: int = 0
    pooled_width: int = 0
    residuals: tuple[tuple[int, int], ...] = ()
    mid_residual: tuple[int, int] = (0, 0)
    vocab_size: int = 49408
    num_train_timesteps: int = 1000
    # Transformer families: each text encoder's token count (T5's is the pipeline's default choice, the profile's
    # opt: SD3 256, Flux dev 512; empty: all CLIP's 77), each encoder's vocabulary, and the tokens of the
    # transformer's text input at those counts (`context_for` gives them at another T5 count).
    text_lengths: tuple[int, ...] = ()
    vocab_sizes: tuple[int, ...] = ()
    projection_widths: tuple[int, ...] = ()  # each encoder's pooled output (SD3: CLIP-L 768, CLIP-G 1280; 0: none)
    context_tokens: int = TOKENS
    text_layers: tuple[int, ...] = ()  # each CLIP encoder's num_hidden_layers (its layer_states hold one more)

    @classmethod
    def from_json(cls, data: dict) -> Sizes:
        """From `dataclasses.asdict` written as JSON (an export's assets/family.json): lists back to tuples."""

        def tupled(v: Any) -> Any:
            return tuple(tupled(x) for x in v) if isinstance(v, list) else v

        return cls(**{k: tupled(v) for k, v in data.items()})

    def value(self, name: str, component: Component) -> int:
        if name == "text_width":
            return self.text_widths[component.text_index]
        if name == "text_length":
            return self.text_lengths[component.text_index] if self.text_lengths else TOKENS
        if name == "projection_width":
            return self.projection_widths[component.text_index]
        if name == "text_layers":
            return self.text_layers[component.text_index] + 1
        if name == "latent_moments":  # the VAE encoder's mean and log-variance, stacked on the channel axis
            return 2 * self.latent_channels
        if name == "sample_channels":
            return self.sample_channels or self.latent_channels
        return getattr(self, name)

    def text_length(self, component: Component) -> int:
        """The encoder's default token count (T5's: the pipeline's default max_sequence_length)."""
        return self.text_lengths[component.text_index] if self.text_lengths else TOKENS

    def context_for(self, family: Family, text_length: int) -> int:
        """The transformer's text tokens when the T5 encoder(s) appended on the token axis read `text_length` tokens
        (SD3: CLIP's 77 + T5's; Flux, Chroma: T5's)."""
        appended = family.joint_text.tokens if family.joint_text else ()
        defaults = sum(self.text_length(family.component(name)) for name in appended)
        return self.context_tokens - defaults + text_length * len(appended)


def controlnet_residuals(
    block_out_channels: tuple[int, ...] | list[int], layers_per_block: int | tuple[int, ...] | list[int]
) -> tuple[tuple[tuple[int, int], ...], tuple[int, int]]:
    """(down residuals, mid residual) as (channels, downscale), from a UNet's or ControlNet's config: conv_in's
    output, then each down block's resnets and (all but the last) its downsampler; the mid block at the bottom."""
    layers = (
        [layers_per_block] * len(block_out_channels) if isinstance(layers_per_block, int) else list(layers_per_block)
    )
    down, factor = [(block_out_channels[0], 1)], 1
    for index, (channels, count) in enumerate(zip(block_out_channels, layers, strict=True)):
        down += [(channels, factor)] * count
        if index < len(block_out_channels) - 1:
            factor *= 2
            down.append((channels, factor))
    return tuple(down), (block_out_channels[-1], factor)


@dataclass(frozen=True)
class Component:
    """One ONNX model of a family. `name` is its file (`<name>.onnx`), recipe component and artifact name;
    `folder` the diffusers subfolder its weights come from; `kind` what it is (text_encoder, unet, unet_controlnet,
    controlnet, transformer, vae_decoder, vae_encoder). `tokenizer`: for a text encoder, which tokenizer feeds it
    ("clip": CLIP BPE from vocab.json/merges.txt or tokenizer.json; "t5": T5 unigram from tokenizer.json)."""

    name: str
    kind: str
    folder: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    # The ControlNet residuals, added from Sizes.residuals: "inputs" (the UNet that takes them) or "outputs".
    residuals: str | None = None
    text_index: int = 0  # which text encoder (its width in Sizes.text_widths)
    tokenizer: str = "clip"
    precisions: tuple[str, ...] | None = None  # None: whatever the export asks for
    precisions_reason: str = ""  # why `precisions` is limited, for the recipe's comment
    fp16_keep_fp32: tuple[str, ...] = ()
    # Validation input ranges: input name → (low, high), as numbers or size names ("vocab_size" → its last id).
    value_ranges: tuple[tuple[str, object, object], ...] = ()

    def io(self, sizes: Sizes) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
        """The inputs and outputs with every size filled in from `sizes` (dynamic dims stay names)."""

        def resolve(t: Tensor) -> Tensor:
            return replace(
                t, shape=tuple(d if isinstance(d, int) or is_dynamic(d) else self._size(sizes, d) for d in t.shape)
            )

        inputs, outputs = tuple(map(resolve, self.inputs)), tuple(map(resolve, self.outputs))
        if self.residuals == "inputs":
            inputs += residual_tensors(sizes, "down_block_additional_residual_{}", "mid_block_additional_residual")
        elif self.residuals == "outputs":
            outputs += residual_tensors(sizes, "down_block_res_sample_{}", "mid_block_res_sample")
        return inputs, outputs

    def _size(self, sizes: Sizes, name: str) -> int:
        return sizes.value(name, self)

    def dynamic_dims(self, sizes: Sizes) -> tuple[str, ...]:
        """The dynamic dim names of the inputs, in first-seen order: what a recipe profile must range."""
        seen: dict[str, None] = {}
        for tensor in self.io(sizes)[0]:
            seen.update((d, None) for d in tensor.shape if isinstance(d, str))
        return tuple(seen)


def residual_tensors(sizes: Sizes, down: str, mid: str) -> tuple[Tensor, ...]:
    def one(name: str, channels: int, factor: int) -> Tensor:
        return Tensor(name, "float32", ("batch", channels, downscaled("height", factor), downscaled("width", factor)))

    return (*(one(down.format(i), c, f) for i, (c, f) in enumerate(sizes.residuals)), one(mid, *sizes.mid_residual))


@dataclass(frozen=True)
class JointText:
    """How a transformer family's text conditioning is assembled from its encoders' outputs (each encoder's
    3-dim output is its hidden states, its 2-dim one its pooled embedding):
    - `width`: hidden states side by side on the feature axis, zero-padded to the transformer's text width (SD3's
      CLIP-L and CLIP-G);
    - `tokens`: hidden states appended on the token axis after those (SD3's T5; Flux's and Chroma's T5 alone);
    - `pooled`: pooled embeddings side by side (SD3: both CLIPs; Flux: CLIP-L).
    An encoder a model ships without (SD3 without T5) gives zeros of its shape, as diffusers does."""

    width: tuple[str, ...] = ()
    tokens: tuple[str, ...] = ()
    pooled: tuple[str, ...] = ()


@dataclass(frozen=True)
class Family:
    """Everything the exporter, custom weights and the runtime pipelines need to know about one model family."""

    id: str
    title: str
    pipelines: tuple[str, ...]  # diffusers pipeline classes (model_index.json `_class_name`) it is saved as
    components: tuple[Component, ...]
    sizes: Sizes  # its real models'
    native_pixels: int  # the resolution it was trained at
    pixel_range: tuple[int, int]  # the image sizes its recipe profiles cover (min, max)
    vae_scale_factor: int = 8  # image pixels per latent pixel
    vae_scaling_factor: float = 0.18215  # the default; a model's vae/config.json `scaling_factor` wins
    default_scheduler: str = "PNDMScheduler"
    prediction_type: str = "epsilon"  # the default; the scheduler config's `prediction_type` wins
    text_encoders: tuple[str, ...] = ("text_encoder",)  # the components a prompt goes through, in order
    prompt_output: str = "last_hidden_state"  # read from each text encoder, concatenated on the last axis
    pooled_output: str | None = None  # read from the last text encoder, fed to the UNet as text_embeds
    time_ids: int = 0  # the UNet's time_ids width: 0 (none), 6 (SDXL), 5 (refiner: aesthetic score)
    aesthetic_score: bool = False
    controlnet: str | None = None  # the id of this family with ControlNet, or (for a ControlNet family) its base
    # The default profiles (`enginefarm export --batch/--latent` widen them): what a farm runner and a consumer GPU
    # build and hold. Text and denoising batch: opt 2 is classifier-free guidance, so max 2 is one image per pass
    # (more images run in chunks; --batch 1,2,4 makes two a pass). The VAE decodes a batch an image at a time.
    batch_range: tuple[int, int, int] = (1, 2, 2)
    vae_batch_range: tuple[int, int, int] = (1, 1, 1)
    notes: tuple[str, ...] = field(default=())
    # Transformer families (a `transformer` component instead of a `unet`):
    joint_text: JointText | None = None  # how the prompt becomes the transformer's text inputs
    vae_shift_factor: float = 0.0  # the default; a model's vae/config.json `shift_factor` wins
    optional: tuple[str, ...] = ()  # components a model may ship without (SD3's T5): exported when present
    guidance_scale: float = 7.5  # the pipeline's default classifier-free guidance
    default_steps: int = 25  # the pipeline's default step count (schnell is distilled to a few steps)
    # How its denoiser is driven (guidance, latent packing, sigma spacing, block layout): read instead of its id
    traits: Traits = Traits()

    def scaling_factor(self, vae_config: dict | None) -> float:
        """The VAE scaling factor: the model's vae/config.json `scaling_factor` when it has one, else the family's."""
        return float((vae_config or {}).get("scaling_factor", self.vae_scaling_factor))

    def shift_factor(self, vae_config: dict | None) -> float:
        """The VAE shift factor (latents are (x - shift) * scale): the model's vae/config.json when it says, else the
        family's."""
        value = (vae_config or {}).get("shift_factor")
        return float(self.vae_shift_factor if value is None else value)

    @property
    def true_cfg(self) -> bool:
        """Classifier-free guidance: a negative and a positive pass per step (not Flux's one pass)."""
        return self.traits.true_cfg

    @property
    def denoiser(self) -> str:
        """The kind of the denoising component: "transformer" (SD3, Flux, Chroma) or "unet"."""
        return "transformer" if any(c.kind == "transformer" for c in self.components) else "unet"

    def prediction(self, scheduler_config: dict | None) -> str:
        """What the UNet predicts: the scheduler config's `prediction_type` when it says, else the family's."""
        return str((scheduler_config or {}).get("prediction_type", self.prediction_type))

    def component(self, name: str) -> Component:
        for component in self.components:
            if component.name == name:
                return component
        raise KeyError(f"{self.id} has no component {name!r}; it has {', '.join(self.component_names)}")

    @property
    def component_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.components)

    @property
    def latent_range(self) -> tuple[int, int, int]:
        """(min, opt, max) latent pixels of the recipe profiles: the pixel range and the native size, over 8."""
        low, high = self.pixel_range
        return low // self.vae_scale_factor, self.native_pixels // self.vae_scale_factor, high // self.vae_scale_factor

    @property
    def inpainting(self) -> bool:
        """An inpainting family: its UNet takes the mask and the masked image's latents beside the latents."""
        return any(c.kind == "unet" and c.inputs[0].shape[1] == "sample_channels" for c in self.components)

    @property
    def is_controlnet(self) -> bool:
        return any(c.kind == "controlnet" for c in self.components)


def profile_dims(
    family: Family,
    component: Component,
    sizes: Sizes,
    *,
    batch: tuple[int, int, int] | None = None,
    latent: tuple[int, int, int] | None = None,
    text_length: tuple[int, int, int] | None = None,
) -> dict[str, tuple[int, int, int]]:
    """(min, opt, max) of each dynamic dim of `component`'s inputs: a recipe profile in its shorthand form.
    `batch`, `latent` and `text_length` override the family's ranges (latent pixels; pixel dims follow at the VAE's
    scale; the transformer's context tokens follow the T5 token count). A VAE keeps its own batch range: the runtime
    decodes and encodes a batch an image at a time, so a wider batch would only raise its build's memory."""
    if component.kind.startswith("vae"):
        batch = family.vae_batch_range
    elif batch is None:
        batch = family.batch_range
    latent = latent or family.latent_range
    ranges: dict[str, tuple[int, int, int]] = {}
    for dim in component.dynamic_dims(sizes):
        if dim == "batch":
            ranges[dim] = _triple(batch)
        elif dim in IMAGE_DIMS:
            ranges[dim] = _triple(n * family.vae_scale_factor for n in latent)
        elif dim == PROMPT_TOKENS:
            ranges[dim] = (TOKENS, TOKENS, TOKENS * PROMPT_CHUNKS_MAX)
        elif dim in TEXT_DIMS:
            lengths = text_length or text_length_range(family, sizes)
            ranges[dim] = lengths if dim == "text_length" else _triple(sizes.context_for(family, n) for n in lengths)
        else:  # height, width, height_div2…
            factor = int(dim.partition("_div")[2] or 1)
            ranges[dim] = _triple(n // factor for n in latent)
    return ranges


def _triple(values: Iterable[int]) -> tuple[int, int, int]:
    low, opt, high = values
    return low, opt, high


def text_length_range(family: Family, sizes: Sizes) -> tuple[int, int, int]:
    """(min, opt, max) T5 token count of the family's profiles: the default count as the opt."""
    t5 = [c for c in family.components if c.tokenizer == "t5"]
    default = sizes.text_length(t5[0]) if t5 else TOKENS
    return min(TEXT_LENGTH_MIN, default), default, max(TEXT_LENGTH_MAX, default)


def input_ranges(
    family: Family, component: Component, sizes: Sizes, scaling_factor: float
) -> dict[str, tuple[float, float]]:
    """The value range of each input that validation should feed, in the units the pipeline feeds it.

    Symbolic bounds: "last_token" (vocab_size - 1), "last_timestep" (num_train_timesteps - 1), "native_pixels",
    "unscaled_latent" (±√3 / scaling_factor: latents of unit spread, as the pipeline divides them for the decoder)."""
    vocab = (
        sizes.vocab_sizes[component.text_index]
        if sizes.vocab_sizes and component.kind == "text_encoder"
        else sizes.vocab_size
    )
    symbols = {
        "last_token": vocab - 1,
        "last_timestep": sizes.num_train_timesteps - 1,
        "native_pixels": family.native_pixels,
        "unscaled_latent": round(3**0.5 / scaling_factor, 2),
    }

    def value(v: object) -> float:
        if isinstance(v, str):
            return -symbols[v[1:]] if v.startswith("-") else symbols[v]
        assert isinstance(v, int | float), v  # value_ranges hold numbers or symbol names
        return v

    names = {t.name for t in component.io(sizes)[0]}
    return {name: (value(low), value(high)) for name, low, high in component.value_ranges if name in names}
