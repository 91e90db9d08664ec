"""The cost of a seamless (tiled) variant against the plain model, per run, on ONNX Runtime and OpenVINO CPU.

The real SD 1.5 UNet (0.86 B parameters) or VAE decoder, random weights (diffusers' classes from the published
configs, exported by torch), rewritten by builder/seamless_onnx.py for tiling "xy" (the most wrapping); each variant
run `--repeats` times after a warm-up, the two interleaved, medians compared. OpenVINO runs the ONNX through its own
reader, as a build does. The UNet runs one denoising step's call: batch 2 (classifier-free guidance), 77 text tokens.

    python bench/seamless.py --model unet --pixels 512 --work /tmp/seamless-bench [--repeats 3]
    python bench/seamless.py --model unet --onnx EXPORT/unet.onnx     # an `enginefarm export`'s UNet instead
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SD15_UNET = dict(
    sample_size=64,
    in_channels=4,
    out_channels=4,
    layers_per_block=2,
    block_out_channels=(320, 640, 1280, 1280),
    down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    cross_attention_dim=768,
    attention_head_dim=8,
)
SD15_VAE = dict(
    in_channels=3,
    out_channels=3,
    latent_channels=4,
    block_out_channels=(128, 256, 512, 512),
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
    layers_per_block=2,
    sample_size=512,
)


def export(kind: str, folder: Path) -> Path:
    """The model's ONNX in `folder` (made once)."""
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel

    path = folder / kind / "model.onnx"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    if kind == "unet":
        model = UNet2DConditionModel(**SD15_UNET).eval()
        args = (torch.zeros(2, 4, 64, 64), torch.tensor([500.0, 500.0]), torch.zeros(2, 77, 768))
        names = ["sample", "timestep", "encoder_hidden_states"]

        class Wrapped(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.unet = model

            def forward(self, sample, timestep, hidden):
                return self.unet(sample, timestep, hidden, return_dict=False)[0]

        module = Wrapped()
        dynamic = {"sample": {0: "b", 2: "h", 3: "w"}, "timestep": {0: "b"}, "encoder_hidden_states": {0: "b"}}
    else:
        vae = AutoencoderKL(**SD15_VAE).eval()

        class Decoder(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.vae = vae

            def forward(self, latent):
                return self.vae.decode(latent, return_dict=False)[0]

        module, args, names = Decoder(), (torch.zeros(1, 4, 64, 64),), ["latent_sample"]
        dynamic = {"latent_sample": {0: "b", 2: "h", 3: "w"}}
    with torch.no_grad():
        torch.onnx.export(
            module, args, str(path), input_names=names, dynamic_axes=dynamic, opset_version=17, dynamo=False
        )
    return path


def feeds(kind: str, pixels: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    side = pixels // 8
    if kind == "unet":
        return {
            "sample": rng.standard_normal((2, 4, side, side)).astype(np.float32),
            "timestep": np.array([500.0, 500.0], np.float32),
            "encoder_hidden_states": rng.standard_normal((2, 77, 768)).astype(np.float32),
        }
    return {"latent_sample": rng.standard_normal((1, 4, side, side)).astype(np.float32)}


def timed(runs, inputs, repeats: int) -> list[float]:
    """Median seconds per run of each, the runs interleaved (a busy machine's load falls on both alike)."""
    for run in runs:
        run(inputs)  # warm-up (OpenVINO allocates at its first inference)
    seconds: list[list[float]] = [[] for _ in runs]
    for _ in range(repeats):
        for run, kept in zip(runs, seconds, strict=True):
            start = time.perf_counter()
            run(inputs)
            kept.append(time.perf_counter() - start)
    return [statistics.median(kept) for kept in seconds]


def runner(backend: str, path: Path):
    if backend == "onnxruntime":
        import onnxruntime as ort

        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return lambda inputs: session.run(None, inputs)
    import openvino as ov

    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return lambda inputs: compiled(inputs)


def model_arguments(description: str, model: str, work: str, backends: str) -> argparse.Namespace:
    """The command line of a bench that times one SD 1.5 model's graph against a rewrite of it."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", choices=("unet", "vae"), default=model)
    p.add_argument("--pixels", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--work", type=Path, default=Path(work))
    p.add_argument("--backends", default=backends)
    p.add_argument("--onnx", type=Path, help="the model's ONNX (its inputs named as the exporter names them)")
    return p.parse_args()


def main() -> int:
    args = model_arguments(__doc__.splitlines()[0], "unet", "/tmp/seamless-bench", "onnxruntime,openvino")
    from enginefarm.builder.seamless_onnx import write_seamless

    plain = args.onnx or export(args.model, args.work)
    tiled_dir = args.work / f"{args.model}-xy"
    if not (tiled_dir / plain.name).exists():
        print(f"convolutions wrapped: {write_seamless(plain, tiled_dir, 'xy')}")
    inputs = feeds(args.model, args.pixels)
    print(f"| {args.model} {args.pixels} px | plain s/run | seamless xy s/run | ratio |\n|---|---|---|---|")
    for backend in args.backends.split(","):
        base, tiled = timed([runner(backend, plain), runner(backend, tiled_dir / plain.name)], inputs, args.repeats)
        print(f"| {backend} | {base:.3f} | {tiled:.3f} | {tiled / base:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
