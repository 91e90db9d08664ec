#!/usr/bin/env python3
"""Small models to try enginefarm with, made here from seeded random weights (nothing is downloaded):

    python recipes/make_tiny_model.py pipeline sd1 tiny-sd1                     # a diffusers folder (model_index.json)
    python recipes/make_tiny_model.py lora tiny-sd1 detail.safetensors          # a LoRA for it, as kohya writes one
    python recipes/make_tiny_model.py checkpoint tiny-sd1 finetune.safetensors  # a "fine-tune" of it as one file

The walkthrough in docs/getting-started.md uses all three.

`pipeline FAMILY` writes the family's real diffusers pipeline at toy sizes (families: sd1, sd2, sd2-v, sdxl,
sdxl-refiner, controlnet-sd1, controlnet-sdxl, sd1-inpaint, sdxl-inpaint, sd3, sd3.5, flux, flux-schnell, chroma):
the structure, configs, scheduler and tokenizer padding of the real model, a few MB of weights; its images are noise.
The tests use the same makers (tests/tiny_pipelines.py). `lora` writes rank-4 layers on the UNet's attention and the
text encoder's first query; `checkpoint` writes the folder's weights, each moved by seeded noise, in the original
single-file layout (model.diffusion_model.*, cond_stage_model.*, first_stage_model.*) as model sites ship them, at fp16.
SD 1.x and 2.x folders only for those two.

Needs the export extra (torch, diffusers, transformers) and a checkout (the makers live in tests/).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYOUT_OF = {768: "sd1", 1024: "sd2"}  # an SD UNet's text width → its family's single-file layout


def make_lora(folder: Path, out: Path, seed: int = 0) -> Path:
    """Rank-4 kohya layers on every UNet self-attention query and key, and on the text encoder's first q_proj."""
    import numpy as np
    from safetensors import safe_open

    from tests.models import write_safetensors
    from tests.weights.lora_reference import lora_pair

    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for part, prefix in (("unet", "lora_unet_"), ("text_encoder", "lora_te_")):
        (weights,) = (folder / part).glob("*.safetensors")
        with safe_open(str(weights), "np") as f:
            shapes = {k.removesuffix(".weight"): f.get_slice(k).get_shape() for k in f.keys() if k.endswith(".weight")}
        if part == "unet":
            chosen = sorted(m for m in shapes if m.endswith(("attn1.to_q", "attn1.to_k")))
        else:
            chosen = sorted(m for m in shapes if m.endswith("self_attn.q_proj"))[:1]
        for module in chosen:
            name = module if part == "unet" else "text_model." + module.removeprefix("text_model.")
            rows, columns = shapes[module]
            tensors |= lora_pair(rng, prefix + name.replace(".", "_"), rows, columns, 4, scale=0.3, alpha=4.0)
    return write_safetensors(out, tensors)


def make_checkpoint(folder: Path, out: Path, seed: int = 0) -> Path:
    """The folder's weights, each moved by 5% of its spread, in the family's original single-file layout."""
    import numpy as np

    from tests.weights.originals import original_tensors, write_file

    index = json.loads((folder / "model_index.json").read_text())
    width = json.loads((folder / "unet" / "config.json").read_text()).get("cross_attention_dim")
    if index["_class_name"] != "StableDiffusionPipeline" or width not in LAYOUT_OF:
        raise SystemExit(f"error: checkpoint makes SD 1.x and 2.x files; {folder} holds a {index['_class_name']}")
    rng = np.random.default_rng(seed)
    tensors = original_tensors(folder, LAYOUT_OF[width])
    # A tensor whose values are all equal (zero biases, unit norms) stays as it is, as a fine-tune leaves it: the
    # export keeps one copy of equal constants, and a file that moved them apart would not fit the built engines.
    # So does the text encoder's position embedding, which the build folds into a constant.
    moved = {
        k: v if "position_embedding" in k else v + rng.normal(0, 0.05 * float(v.std()), v.shape).astype(v.dtype)
        for k, v in tensors.items()
    }
    return write_file(out, moved, "fp16")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = parser.add_subparsers(dest="kind", required=True)
    pipeline = kinds.add_parser("pipeline", help="a tiny diffusers pipeline folder of one family")
    pipeline.add_argument("family")
    pipeline.add_argument("out", type=Path)
    for kind, what in (("lora", "a LoRA file"), ("checkpoint", "a single-file checkpoint")):
        made = kinds.add_parser(kind, help=f"{what} for a tiny pipeline folder")
        made.add_argument("folder", type=Path)
        made.add_argument("out", type=Path)
    for made in kinds.choices.values():
        made.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))  # the makers live with the tests
    if args.kind == "pipeline":
        from tests.tiny_pipelines import FAMILIES, make_tiny_pipeline

        if args.family not in FAMILIES:
            parser.error(f"unknown family {args.family!r}; one of {', '.join(FAMILIES)}")
        made = make_tiny_pipeline(args.family, args.out, seed=args.seed)
        index = json.loads((made / "model_index.json").read_text())
        print(f"wrote {made}: a tiny {index['_class_name']} ({args.family})")
        return 0
    if not (args.folder / "model_index.json").is_file():
        parser.error(f"{args.folder} is not a diffusers folder (no model_index.json): make one with `pipeline`")
    made = (make_lora if args.kind == "lora" else make_checkpoint)(args.folder, args.out, seed=args.seed)
    print(f"wrote {made} ({made.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
