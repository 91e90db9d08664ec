#!/usr/bin/env python3
"""Export Stable Diffusion 1.5's text encoder, UNet and VAE decoder to ONNX, with random weights.

The architectures are the real ones (transformers' CLIPTextModel and diffusers' UNet2DConditionModel and
AutoencoderKL, built from SD 1.5's configs); no weights are downloaded. The weights are seeded: the text
encoder and the UNet keep their libraries' own initialisation, the VAE decoder gets
recipes/make_sd_vae_decoder.py's re-initialisation (so its image has a sane spread).

    text_encoder.onnx   input_ids int64 [batch, 77] -> last_hidden_state float32 [batch, 77, 768]     (~0.5 GB)
    unet.onnx + .data   sample float32 [batch, 4, height, width], timestep float32 [batch],
                        encoder_hidden_states float32 [batch, 77, 768] -> out_sample like sample       (3.44 GB)
    vae_decoder.onnx    latent float32 [batch, 4, height, width] -> sample float32 [batch, 3, 8h, 8w]  (~0.2 GB)

The UNet is over protobuf's 2 GB limit, so its weights go to one external file, unet.onnx.data, next to it.
Opset 17; IR version 10 (onnx 1.23 writes 14, which onnxruntime 1.31 cannot read).

Usage (needs torch, diffusers and transformers; never a dependency of enginefarm itself):
    pip install torch==2.13.0 diffusers transformers onnx
    python recipes/make_sd15.py [--out-dir recipes/models/sd15] [--only unet] [--force]

Exporting all three takes about 2 minutes and peaks at 4.5 GB of memory (measured on a 2-core machine).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "models" / "sd15"
OPSET = 17
MAX_IR_VERSION = 10
SEED = 0
TOKENS = 77
COMPONENTS = ("text_encoder", "unet", "vae_decoder")

# runwayml/stable-diffusion-v1-5, text_encoder/config.json (CLIP ViT-L/14's text tower).
SD15_TEXT_CONFIG = dict(
    vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
    max_position_embeddings=TOKENS, hidden_act="quick_gelu", layer_norm_eps=1e-5, projection_dim=768,
    pad_token_id=1, bos_token_id=0, eos_token_id=2,
)

# runwayml/stable-diffusion-v1-5, unet/config.json.
SD15_UNET_CONFIG = dict(
    sample_size=64, in_channels=4, out_channels=4, center_input_sample=False, flip_sin_to_cos=True, freq_shift=0,
    down_block_types=["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    up_block_types=["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
    block_out_channels=[320, 640, 1280, 1280], layers_per_block=2, downsample_padding=1, mid_block_scale_factor=1,
    act_fn="silu", norm_num_groups=32, norm_eps=1e-5, cross_attention_dim=768, attention_head_dim=8,
)


def _vae_module():
    spec = importlib.util.spec_from_file_location("make_sd_vae_decoder", HERE / "make_sd_vae_decoder.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _text_encoder(torch):
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(SEED)
    model = CLIPTextModel(CLIPTextConfig(**SD15_TEXT_CONFIG)).eval()

    class TextEncoder(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids):
            return self.inner(input_ids=input_ids, return_dict=False)[0]

    example = (torch.randint(0, SD15_TEXT_CONFIG["vocab_size"], (1, TOKENS), dtype=torch.int64),)
    return TextEncoder(model).eval(), example, ["input_ids"], ["last_hidden_state"], {
        "input_ids": {0: "batch"}, "last_hidden_state": {0: "batch"}}


def _unet(torch):
    from diffusers import UNet2DConditionModel

    torch.manual_seed(SEED)
    model = UNet2DConditionModel(**SD15_UNET_CONFIG).eval()

    class Unet(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, sample, timestep, encoder_hidden_states):
            return self.inner(sample, timestep, encoder_hidden_states, return_dict=False)[0]

    example = (torch.randn(1, 4, 64, 64), torch.tensor([981.0]), torch.randn(1, TOKENS, 768))
    axes = {"sample": {0: "batch", 2: "height", 3: "width"}, "timestep": {0: "batch"},
            "encoder_hidden_states": {0: "batch"}, "out_sample": {0: "batch", 2: "height", 3: "width"}}
    return Unet(model).eval(), example, ["sample", "timestep", "encoder_hidden_states"], ["out_sample"], axes


def _export(torch, make, out: Path) -> None:
    """torch's exporter writes a model over 2 GB as one file per tensor; we re-save it as one .data file.
    The torch module is dropped before the ONNX weights are read back, so the two never share the memory."""
    import onnx

    module, example, inputs, outputs, axes = make(torch)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".export-") as tmp:
        raw = Path(tmp) / out.name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TracerWarnings and the legacy-exporter deprecation
            with torch.no_grad():
                torch.onnx.export(module, example, str(raw), input_names=inputs, output_names=outputs, dynamic_axes=axes,
                                  opset_version=OPSET, do_constant_folding=True, dynamo=False)
        del module
        gc.collect()
        proto = onnx.load(str(raw), load_external_data=True)
        proto.ir_version = min(proto.ir_version, MAX_IR_VERSION)
        large = sum(len(t.raw_data) for t in proto.graph.initializer) > 1_500_000_000
        staged = Path(tmp) / "staged"
        staged.mkdir()
        onnx.save_model(proto, str(staged / out.name), save_as_external_data=large, all_tensors_to_one_file=True,
                        location=f"{out.name}.data" if large else None, size_threshold=1024)
        del proto
        for leftover in (out, out.with_name(out.name + ".data")):
            leftover.unlink(missing_ok=True)
        if large:
            os.replace(staged / f"{out.name}.data", out.with_name(out.name + ".data"))
        os.replace(staged / out.name, out)  # last: a complete .onnx means its data is in place


def export(name: str, out_dir: Path) -> Path:
    import torch

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    out = out_dir / f"{name}.onnx"
    if name == "vae_decoder":
        _vae_module().export(out)
        return out
    _export(torch, _text_encoder if name == "text_encoder" else _unet, out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT, help=f"where to write the models (default: {DEFAULT_OUT})")
    parser.add_argument("--only", choices=COMPONENTS, action="append", help="export only this component (repeatable)")
    parser.add_argument("--force", action="store_true", help="re-export what already exists")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the hub
    try:
        import diffusers  # noqa: F401
        import onnx  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        print(f"error: {exc.name or exc} is not installed; hint: pip install torch==2.13.0 diffusers transformers onnx", file=sys.stderr)
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name in args.only or COMPONENTS:
        out = args.out_dir / f"{name}.onnx"
        if out.exists() and not args.force:
            print(f"{out} exists, skipping (use --force to export again)")
            continue
        start = time.monotonic()
        export(name, args.out_dir)
        size = sum(p.stat().st_size for p in (out, out.with_name(out.name + ".data")) if p.exists())
        print(f"wrote {out} ({size / 1e9:.2f} GB with its data, opset {OPSET}) in {time.monotonic() - start:.0f} s", flush=True)
    shutil.rmtree(args.out_dir / "__pycache__", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
