"""GFPGAN v1.3 / v1.4 (`GFPGANv1.4.pth`: "params_ema" of GFPGANv1Clean): a U-Net that reads a 512² aligned face
into a style code and per-resolution spatial conditions, and a StyleGAN2 decoder (the "clean" one, no custom CUDA
ops) that the conditions steer (SFT). Exported as one part, `restorer`: `face` [batch, 3, 512, 512] in [-1, 1] →
`restored`, the same range (unclamped).

Built from the file's own shapes (channel widths, style size, resolution), so narrowed variants load too. Two choices
differ from GFPGAN's inference script: the decoder's noise is the file's stored noise (GFPGANer draws new noise on
every call, so two of its runs differ; an exported engine is deterministic), and each modulated convolution scales its
input by the style instead of its weight (the same sum, with weights that stay constants, so any batch size works)."""

from __future__ import annotations

from typing import Any

from enginefarm.errors import ConfigError

from .registry import Architecture, Part, Parts, Source

FACE_SIZE = 512
# keys no inference path reads: the U-Net's intermediate RGB heads (training losses) and the decoder's mapping MLP
# (GFPGAN feeds the U-Net's code in as the latent directly)
UNUSED_PREFIXES = ("toRGB.", "stylegan_decoder.style_mlp.")
FINGERPRINT = (
    "conv_body_first.weight",
    "final_linear.weight",
    "condition_scale.0.0.weight",
    "stylegan_decoder.constant_input.weight",
    "stylegan_decoder.style_conv1.modulated_conv.weight",
)


def matches(source: Source) -> bool:
    return all(key in source.state for key in FINGERPRINT)


def build_module(state: dict[str, Any]):
    """The restorer as a torch module (eval, fp32) with the file's weights; ConfigError if the layout is off."""
    import torch

    from .gfpgan_net import GFPGANRestorer

    kept = {k: v for k, v in state.items() if not k.startswith(UNUSED_PREFIXES)}
    try:
        style_size = int(state["stylegan_decoder.style_conv1.modulated_conv.modulation.weight"].shape[1])
        with torch.device("meta"):  # no initialisation of weights the file replaces
            module = GFPGANRestorer(kept, style_size)
        renamed = {_buffer_name(k): v.float() for k, v in kept.items()}
        module.load_state_dict(renamed, strict=True, assign=True)
    except (KeyError, RuntimeError, ValueError, IndexError) as exc:
        raise ConfigError(
            f"this looks like GFPGAN but not the clean v1.3/v1.4 layout ({str(exc).splitlines()[0][:200]})",
            hint="GFPGANv1.3.pth and GFPGANv1.4.pth are supported; GFPGAN v1 (with custom CUDA ops) is not",
        ) from None
    levels = len(module.conv_body_up)
    if 2 ** (levels + 2) != FACE_SIZE:
        raise ConfigError(
            f"this GFPGAN restores {2 ** (levels + 2)}² faces; enginefarm aligns faces at {FACE_SIZE}²",
            hint="use GFPGANv1.3.pth or GFPGANv1.4.pth",
        )
    return module.eval()


def _buffer_name(key: str) -> str:
    """The file keeps the decoder's noise in `noises.noiseN`; each style conv here holds its own."""
    prefix = "stylegan_decoder.noises.noise"
    if not key.startswith(prefix):
        return key
    index = int(key[len(prefix) :])
    return "stylegan_decoder.style_conv1.noise" if index == 0 else f"stylegan_decoder.style_convs.{index - 1}.noise"


def build(source: Source) -> Parts:
    module = build_module(source.state)
    part = Part(
        module=module,
        inputs={"face": ("batch", 3, FACE_SIZE, FACE_SIZE)},
        outputs={"restored": ("batch", 3, FACE_SIZE, FACE_SIZE)},
        profile={"batch": (1, 1, 1)},  # the runtime restores one face at a time, as GFPGANer does
        ranges={"face": (-1.0, 1.0)},
    )
    details = {"face_size": FACE_SIZE, "input_range": [-1.0, 1.0], "uses": {"detector": DEFAULT_DETECTOR}}
    return Parts("GFPGAN", "face_restorer", {"restorer": part}, details)


# the face detector filter a restorer loads unless its export is told another (`details["uses"]["detector"]`)
DEFAULT_DETECTOR = "retinaface-resnet50"

ARCHITECTURES = [Architecture("GFPGAN v1.3/v1.4 (GFPGANv1Clean)", "face_restorer", matches, build)]
