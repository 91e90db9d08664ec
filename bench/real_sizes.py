"""What each real model's build jobs need, and where `plan --runners` sends them, without downloading or building
anything: every component is built on torch's meta device from its published config (no memory for weights), its
parameters counted, and the build's memory rule (`enginefarm.builder.memory`) and the farm's runners
(`ci/runners.toml`) applied. One table, printed (add --markdown for docs/large-models.md's).

    python bench/real_sizes.py [--runners ci/runners.toml] [--models flux-dev,sd3.5-medium] [--markdown]

Needs the `export` extra (torch, diffusers, transformers). The configs are the published ones' sizes (layers, widths,
heads); what the weights are does not change what a build needs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from enginefarm.builder.catalog_configs import class_config

ROOT = Path(__file__).resolve().parents[1]

# the published configs enginefarm ships (builder/catalog_configs.py)
_CLIP_L = class_config("sd-1.5", "text_encoder/config.json")
_CLIP_G = class_config("sdxl-base-1.0", "text_encoder_2/config.json")
_T5_XXL = dict(
    d_model=4096, d_ff=10240, d_kv=64, num_heads=64, num_layers=24, vocab_size=32128, feed_forward_proj="gated-gelu"
)
_VAE4 = class_config("sd-1.5", "vae/config.json")
_VAE16 = class_config("sd-1.5", "vae/config.json", latent_channels=16)
_SD3_BASE = dict(
    patch_size=2,
    in_channels=16,
    out_channels=16,
    attention_head_dim=64,
    joint_attention_dim=4096,
    pooled_projection_dim=2048,
    sample_size=128,
)
_FLUX = dict(
    patch_size=1,
    in_channels=64,
    num_layers=19,
    num_single_layers=38,
    attention_head_dim=128,
    num_attention_heads=24,
    joint_attention_dim=4096,
    pooled_projection_dim=768,
)
_SDXL_UNET = class_config("sdxl-base-1.0", "unet/config.json")

# model → component → (class, config). The VAE's encoder and decoder are counted separately (separate artifacts).
MODELS: dict[str, dict[str, tuple[str, dict]]] = {
    "sd15": {
        "text_encoder": ("CLIPTextModel", _CLIP_L),
        "unet": ("UNet2DConditionModel", class_config("sd-1.5", "unet/config.json")),
        "vae_decoder": ("AutoencoderKL", _VAE4),
    },
    "sdxl": {
        "text_encoder": ("CLIPTextModel", _CLIP_L),
        "text_encoder_2": ("CLIPTextModelWithProjection", _CLIP_G),
        "unet": ("UNet2DConditionModel", _SDXL_UNET),
        "vae_decoder": ("AutoencoderKL", _VAE4),
    },
    "sd3-medium": {
        "text_encoder_3": ("T5EncoderModel", _T5_XXL),
        "transformer": (
            "SD3Transformer2DModel",
            dict(_SD3_BASE, num_layers=24, num_attention_heads=24, caption_projection_dim=1536, pos_embed_max_size=192),
        ),
        "vae_decoder": ("AutoencoderKL", _VAE16),
    },
    "sd3.5-medium": {
        "transformer": (
            "SD3Transformer2DModel",
            dict(
                _SD3_BASE,
                num_layers=24,
                num_attention_heads=24,
                caption_projection_dim=1536,
                pos_embed_max_size=384,
                qk_norm="rms_norm",
                dual_attention_layers=tuple(range(13)),
            ),
        )
    },
    "sd3.5-large": {
        "transformer": (
            "SD3Transformer2DModel",
            dict(
                _SD3_BASE,
                num_layers=38,
                num_attention_heads=38,
                caption_projection_dim=2432,
                pos_embed_max_size=192,
                qk_norm="rms_norm",
            ),
        )
    },
    "flux-dev": {
        "text_encoder": ("CLIPTextModel", _CLIP_L),
        "text_encoder_2": ("T5EncoderModel", _T5_XXL),
        "transformer": ("FluxTransformer2DModel", dict(_FLUX, guidance_embeds=True)),
        "vae_decoder": ("AutoencoderKL", _VAE16),
    },
    "flux-schnell": {"transformer": ("FluxTransformer2DModel", dict(_FLUX, guidance_embeds=False))},
    "chroma": {
        "transformer": (
            "ChromaTransformer2DModel",
            dict(
                {k: v for k, v in _FLUX.items() if k != "pooled_projection_dim"},
                approximator_num_channels=64,
                approximator_hidden_dim=5120,
                approximator_layers=5,
            ),
        )
    },
}
TARGETS = ("onnxruntime:cpu", "openvino:cpu", "tensorrt-rtx:sm_86")


def parameters(cls_name: str, config: dict, component: str) -> int:
    """Parameters of the component's artifact, counted on the meta device (nothing allocated)."""
    import diffusers
    import torch
    import transformers

    with torch.device("meta"):
        if hasattr(transformers, cls_name):
            config_cls = transformers.T5Config if cls_name.startswith("T5") else transformers.CLIPTextConfig
            model = getattr(transformers, cls_name)(config_cls(**config))
        else:
            model = getattr(diffusers, cls_name)(**config)
    if component == "vae_decoder":  # the decoder artifact holds the decoder and post_quant_conv only
        return sum(p.numel() for n, p in model.named_parameters() if n.startswith(("decoder.", "post_quant_conv.")))
    return sum(p.numel() for p in model.parameters())


def _activations(model: str, component: str, config: dict) -> tuple[float, int]:
    """(host GB, activation bytes) a job adds to its weights at the family's default profile's largest case, by the
    build's rule (builder/memory.py) from the component's own config: a UNet's attention at its highest-resolution
    attention level, a VAE's widest activations and mid-block attention at batch 1, a transformer's joint attention."""
    from enginefarm.builder.memory import PATCH, attention_bytes, image_activation_bytes
    from enginefarm.export.resources import unet_attention, vae_activation_channels
    from enginefarm.families import FAMILIES

    family = FAMILIES[_FAMILY[model]]
    pixels, batch = family.pixel_range[1], family.batch_range[2]
    latent = pixels // 8
    if component.startswith("vae"):
        activations = image_activation_bytes(vae_activation_channels(config), pixels * pixels / 1e6)
        return 0.0, activations + attention_bytes(1, 1, latent * latent)
    if component == "unet":
        heads, downscale = unet_attention(config)
        return 0.0, attention_bytes(heads, batch, (latent // downscale) ** 2)
    if component == "transformer":  # the family's longest text: SD3 77 CLIP + 512 T5 tokens; Flux, Chroma 512
        text = 589 if model.startswith("sd3") else 512
        return 0.0, attention_bytes(config["num_attention_heads"], batch, (latent // PATCH) ** 2 + text)
    return 0.0, 0


_FAMILY = {
    "sd15": "sd1",
    "sdxl": "sdxl",
    "sd3-medium": "sd3",
    "sd3.5-medium": "sd3.5",
    "sd3.5-large": "sd3.5",
    "flux-dev": "flux",
    "flux-schnell": "flux-schnell",
    "chroma": "chroma",
}


def rows(models: list[str], runners_path: Path) -> list[dict]:
    from enginefarm.builder.ci_runners import load_runners, route
    from enginefarm.builder.memory import gb, need_bytes
    from enginefarm.builder.recipe import Resources

    runners = load_runners(runners_path)
    out = []
    for model in models:
        for component, (cls_name, config) in MODELS[model].items():
            count = parameters(cls_name, config, component)
            fp32 = count * 4  # every job's need counts weights at fp32 (see builder/memory.py)
            image_gb, attention = _activations(model, component, config)
            row = {
                "model": model,
                "component": component,
                "params_b": count / 1e9,
                "fp32_gb": fp32 / 1e9,
                "fp16_gb": fp32 / 2e9,
            }
            for target in TARGETS:
                backend = target.split(":")[0]
                needs = [
                    gb(need_bytes(fp32, image_gb, backend=backend, precision=p, activations=attention))
                    for p in ("fp32", "fp16")
                ]
                routes = [route(target, Resources(n, 0.0), runners, on_cpu=True) for n in needs]
                row[target] = (needs, [r.name if r else "none" for r, _ in routes])
                row.setdefault("why", routes[0][1])
            out.append(row)
    return out


def _needs(needs: list[float], runners: list[str]) -> str:
    if runners[0] == runners[1]:
        return f"{needs[0]:g} / {needs[1]:g} → {runners[0]}"
    return f"{needs[0]:g} → {runners[0]}, {needs[1]:g} → {runners[1]}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runners", type=Path, default=ROOT / "ci" / "runners.toml")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of: {', '.join(MODELS)}")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        print(f"error: unknown model {unknown[0]!r}; known: {', '.join(MODELS)}", file=sys.stderr)
        return 2
    table = rows(models, args.runners)
    head = [
        "model",
        "component",
        "params (B)",
        "fp32 GB",
        "fp16 GB",
        *(f"{t}: fp32 / fp16 job need GB → runner" for t in TARGETS),
    ]
    lines = [
        [
            r["model"],
            r["component"],
            f"{r['params_b']:.3f}",
            f"{r['fp32_gb']:.1f}",
            f"{r['fp16_gb']:.1f}",
            *(_needs(*r[t]) for t in TARGETS),
        ]
        for r in table
    ]
    if args.markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        print("\n".join("| " + " | ".join(line) + " |" for line in lines))
    else:
        widths = [max(len(str(x)) for x in col) for col in zip(head, *lines, strict=True)]
        for line in [head, *lines]:
            print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
