"""The nearest-2x-then-3x3 fold (backends/upsample_conv.py) against the graph as exported, per run, on OpenVINO CPU
(whose builds apply it) and ONNX Runtime CPU.

The real SD 1.5 VAE decoder or UNet, random weights (bench/seamless.py's export: diffusers' classes from the published
configs, exported by torch), folded; the two run interleaved `--repeats` times after a warm-up, medians compared,
and the largest difference between their outputs printed beside the ratio. OpenVINO compiles the folded ONNX through
its own reader in f32, as a build's IR is compiled.

    python bench/upsample_conv.py --model vae --pixels 512 --work /tmp/upsample-bench [--repeats 3]
    python bench/upsample_conv.py --model unet --onnx EXPORT/unet.onnx     # an `enginefarm export`'s UNet instead
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from seamless import export, feeds, model_arguments, runner, timed  # noqa: E402


def main() -> int:
    args = model_arguments(__doc__.splitlines()[0], "vae", "/tmp/upsample-bench", "openvino,onnxruntime")
    from enginefarm.backends.upsample_conv import fold_upsample_convs
    from enginefarm.formats.onnx_data import write_rewritten

    plain = args.onnx or export(args.model, args.work)
    folded_dir = args.work / f"{args.model}-folded"
    folded = write_rewritten(plain, folded_dir, fold_upsample_convs)
    print(f"upsampling convolutions folded: {folded}")
    inputs = feeds(args.model, args.pixels)
    print(
        f"| {args.model} {args.pixels} px | as exported s/run | folded s/run | ratio | max abs difference |\n"
        "|---|---|---|---|---|"
    )
    for backend in args.backends.split(","):
        runs = [runner(backend, plain), runner(backend, folded_dir / plain.name)]
        outputs = [np.asarray(_first(run(inputs))) for run in runs]
        base, rewritten = timed(runs, inputs, args.repeats)
        difference = float(np.abs(outputs[0] - outputs[1]).max())
        print(f"| {backend} | {base:.3f} | {rewritten:.3f} | {rewritten / base:.3f} | {difference:.1e} |", flush=True)
    return 0


def _first(result):
    """The first output of an ONNX Runtime run (a list) or an OpenVINO call (a result keyed by port)."""
    return result[0]


if __name__ == "__main__":
    raise SystemExit(main())
