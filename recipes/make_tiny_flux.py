#!/usr/bin/env python3
"""Tiny Flux.1 dev, Flux.1 schnell and Chroma, exported for the farm: each a diffusers folder with seeded random
weights (tests/tiny_flux.py: the real pipeline classes at toy sizes) put through `enginefarm export`, which writes
the ONNX files, checkpoints, assets and the recipe.

    python recipes/make_tiny_flux.py [--families flux,flux-schnell,chroma] [--out-dir recipes/models]
    enginefarm build recipes/models/tiny-flux/recipe.toml
    enginefarm generate tiny-flux "a lighthouse at dawn" --steps 4 --width 64 --height 64 --out flux.png

Needs the export extra (torch, diffusers, transformers). About 50 s per family on a 2-core machine. The real models
go through the same command: `enginefarm export ./FLUX.1-dev --out exports/flux-dev` (its recipe says what to build).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default="flux,flux-schnell,chroma")
    parser.add_argument("--out-dir", type=Path, default=HERE / "models")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.tiny_flux import make_tiny_flux

    with tempfile.TemporaryDirectory() as scratch:
        for family in args.families.split(","):
            source = make_tiny_flux(family, Path(scratch) / f"tiny-{family}")
            out = args.out_dir / f"tiny-{family}"
            # latent 8…16 (64…128 px images), batch 1…2: the tiny models' sizes
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "enginefarm.cli",
                    "export",
                    str(source),
                    "--out",
                    str(out),
                    "--latent",
                    "8,8,16",
                    "--batch",
                    "1,2,2",
                    "--overwrite",
                ],
                check=True,
            )
            print(f"{family}: {out / 'recipe.toml'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
