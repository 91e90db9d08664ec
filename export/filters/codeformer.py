"""CodeFormer (`codeformer.pth`: "params_ema"), the face restorer Easy Diffusion offers beside GFPGAN. Exported as one
part, `restorer`: `face` [1, 3, 512, 512] in [-1, 1] and `w` [1], the fidelity weight (0: the codebook's face, the
most restored; 1: closest to the input; CodeFormer's default 0.5) → `restored`, the same range (unclamped). The
runtime (enginefarm.filters.faces.FaceRestorer) runs it like GFPGAN, with `fidelity=` for `w`."""

from __future__ import annotations

from enginefarm.errors import ConfigError

from .gfpgan import DEFAULT_DETECTOR, FACE_SIZE
from .registry import Architecture, Part, Parts, Source

FINGERPRINT = (
    "position_emb",
    "idx_pred_layer.1.weight",
    "quantize.embedding.weight",
    "ft_layers.0.self_attn.in_proj_weight",
    "encoder.blocks.0.weight",
)
DEFAULT_FIDELITY = 0.5


def matches(source: Source) -> bool:
    return all(key in source.state for key in FINGERPRINT)


def build_module(state):
    """The restorer as a torch module (eval, fp32) with the file's weights; ConfigError if the layout is off."""
    import torch

    from .codeformer_net import CodeFormerRestorer

    try:
        with torch.device("meta"):  # no initialisation of weights the file replaces
            module = CodeFormerRestorer(state)
        module.load_state_dict({k: v.float() for k, v in state.items()}, strict=True, assign=True)
    except (KeyError, RuntimeError, ValueError, IndexError) as exc:
        raise ConfigError(
            f"this looks like CodeFormer but not its published layout ({str(exc).splitlines()[0][:200]})",
            hint="codeformer.pth (v0.1.0) is supported",
        ) from None
    return module.eval()


def build(source: Source) -> Parts:
    part = Part(
        module=build_module(source.state),
        inputs={"face": ("batch", 3, FACE_SIZE, FACE_SIZE), "w": ("batch",)},
        outputs={"restored": ("batch", 3, FACE_SIZE, FACE_SIZE)},
        profile={"batch": (1, 1, 1)},  # one face at a time, as CodeFormer's own script runs them
        ranges={"face": (-1.0, 1.0), "w": (0.0, 1.0)},
        # each token takes its nearest codebook entry (an argmin over distances): in fp16 near-ties pick other entries
        # and the face changes (a seeded CodeFormer's fp16 build: cosine 0.988 and 0.995 against fp32, under the gate)
        precisions=("fp32",),
    )
    details = {
        "face_size": FACE_SIZE,
        "input_range": [-1.0, 1.0],
        "fidelity": DEFAULT_FIDELITY,
        "uses": {"detector": DEFAULT_DETECTOR},
    }
    return Parts("CodeFormer", "face_restorer", {"restorer": part}, details)


ARCHITECTURES = [Architecture("CodeFormer", "face_restorer", matches, build)]
