#!/usr/bin/env python3
"""Export the Stable Diffusion 1.5 VAE decoder architecture to ONNX, with random weights.

The architecture is the real one from ``diffusers.AutoencoderKL`` built from SD 1.5's VAE
config; no weights are downloaded (nothing but PyPI is reachable). The weights come from a
seeded, deterministic re-initialisation chosen so that the decoder's output is finite,
varies with the latent and has a sane spread (std around 0.5 for latents in [-3, 3]), which
makes the model usable as a realistic build/validation workload for the farm.

Graph:
    latent  float32 [batch, 4, height, width]
 -> sample  float32 [batch, 3, out_height, out_width]   (out_* = 8 * height / width)

Usage:
    pip install torch==2.13.0 diffusers onnx
    python recipes/make_sd_vae_decoder.py [--out recipes/models/sd_vae_decoder.onnx] [--force] [--checkpoint PATH]

--checkpoint also writes the same weights in diffusers' own names (decoder.*, post_quant_conv.*) as .safetensors:
the base checkpoint a recipe's `checkpoint =` points at, for custom weights and LoRAs.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent / "models" / "sd_vae_decoder.onnx"
OPSET = 17
MAX_IR_VERSION = 10  # onnx 1.23 writes IR 14; onnxruntime 1.31 reads at most 13
SEED = 0

# Stable Diffusion 1.5 VAE (runwayml/stable-diffusion-v1-5, subfolder "vae").
SD15_VAE_CONFIG = dict(
    in_channels=3,
    out_channels=3,
    latent_channels=4,
    block_out_channels=[128, 256, 512, 512],
    layers_per_block=2,
    down_block_types=["DownEncoderBlock2D"] * 4,
    up_block_types=["UpDecoderBlock2D"] * 4,
    norm_num_groups=32,
    act_fn="silu",
    sample_size=512,
    scaling_factor=0.18215,
)

# Gains for the re-initialisation: weight std = gain / sqrt(fan_in).
GAIN_DEFAULT = 1.0  # convs/linears that follow GroupNorm+SiLU (or the raw latent)
GAIN_RESIDUAL = 0.5  # last layer of a residual branch (resnet conv2, attention out)
GAIN_OUTPUT = 0.8  # decoder.conv_out: puts the image output at std ~0.5


def _reinit_(vae, torch) -> None:
    """Deterministic fan-in scaled normal init; biases zero; norms identity."""
    nn = torch.nn
    decoder = vae.decoder
    residual_tails = set()
    for module in decoder.modules():
        if type(module).__name__ == "ResnetBlock2D":
            residual_tails.add(id(module.conv2))
        if type(module).__name__ == "Attention":
            residual_tails.add(id(module.to_out[0]))

    for module in vae.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            fan_in = module.weight[0].numel()
            if module is decoder.conv_out:
                gain = GAIN_OUTPUT
            elif id(module) in residual_tails:
                gain = GAIN_RESIDUAL
            else:
                gain = GAIN_DEFAULT
            with torch.no_grad():
                module.weight.normal_(0.0, gain / math.sqrt(fan_in))
                if module.bias is not None:
                    module.bias.zero_()
        elif isinstance(module, (nn.GroupNorm, nn.LayerNorm)) and module.weight is not None:
            with torch.no_grad():
                module.weight.fill_(1.0)
                module.bias.zero_()


def build_decoder(torch, diffusers):
    """Return (wrapper module, vae) for SD 1.5's VAE with seeded, re-initialised weights."""
    torch.manual_seed(SEED)
    vae = diffusers.AutoencoderKL(**SD15_VAE_CONFIG)
    _reinit_(vae, torch)
    vae.eval()

    class VaeDecoder(torch.nn.Module):
        def __init__(self, vae):
            super().__init__()
            self.vae = vae

        def forward(self, latent):
            return self.vae.decode(latent, return_dict=False)[0]

    return VaeDecoder(vae).eval(), vae


def export(out: Path, checkpoint: Path | None = None) -> None:
    import diffusers
    import onnx
    import torch

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    model, vae = build_decoder(torch, diffusers)
    if checkpoint is not None:
        from safetensors.torch import save_file

        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        state = {
            k: v.detach().contiguous()
            for k, v in vae.state_dict().items()
            if k.startswith(("decoder.", "post_quant_conv."))
        }
        save_file(state, str(checkpoint))
    example = torch.zeros(1, 4, 32, 32, dtype=torch.float32)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarnings and the legacy-exporter deprecation
        with torch.no_grad():
            torch.onnx.export(
                model,
                (example,),
                str(tmp),
                input_names=["latent"],
                output_names=["sample"],
                dynamic_axes={
                    "latent": {0: "batch", 2: "height", 3: "width"},
                    "sample": {0: "batch", 2: "out_height", 3: "out_width"},
                },
                opset_version=OPSET,
                do_constant_folding=True,
                dynamo=False,
            )

    proto = onnx.load(str(tmp))
    if proto.ir_version > MAX_IR_VERSION:
        proto.ir_version = MAX_IR_VERSION
    large = proto.ByteSize() > 2_000_000_000  # never for this model (~200 MB), kept for safety
    onnx.save_model(
        proto,
        str(tmp),
        save_as_external_data=large,
        all_tensors_to_one_file=True,
        location=out.name + ".data" if large else None,
    )
    os.replace(tmp, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output .onnx (default: {DEFAULT_OUT})")
    parser.add_argument("--force", action="store_true", help="re-export even if --out exists")
    parser.add_argument(
        "--checkpoint", type=Path, help="also write the decoder's weights in diffusers names to this .safetensors"
    )
    args = parser.parse_args(argv)
    out: Path = args.out

    if out.exists() and not args.force and (args.checkpoint is None or args.checkpoint.exists()):
        print(f"{out} exists, skipping (use --force to rebuild)")
        return 0

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the hub
    try:
        import diffusers  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        print(f"error: {exc.name or exc} is not installed; hint: pip install torch==2.13.0 diffusers", file=sys.stderr)
        return 2
    try:
        import onnx  # noqa: F401
    except ImportError:
        print("error: onnx is not installed; hint: pip install onnx", file=sys.stderr)
        return 2

    start = time.monotonic()
    export(out, args.checkpoint)
    size_mb = out.stat().st_size / 1e6
    print(f"wrote {out} ({size_mb:.1f} MB, opset {OPSET}) in {time.monotonic() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
