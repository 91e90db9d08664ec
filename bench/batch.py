"""Images per call: N images in one `Pipeline` call (`num_images_per_prompt=N`, the denoiser's 2N rows in calls of
the profile's max batch) against N one-image calls, and the live preview's cost per step (`on_preview`, the linear
latent-to-RGB map), on a tiny SD 1.x pipeline (tests/tiny_pipelines.py) exported with a batch profile up to 2N and
built for each backend at fp32. Medians of REPEATS; the first call of each kind is a warm-up. A benchmark, not a test.

    .venv/bin/python bench/batch.py [--images 4] [--latent 32] [--steps 4] [--repeats 3] [--work DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from families import _cli, _tiny_pipelines  # bench/families.py: the tiny pipelines and the CLI, as its runs use them

BACKENDS = ("onnxruntime:cpu", "openvino:cpu")
PROMPT = "a lighthouse on a cliff at dawn"


def build(work: Path, latent: int, rows: int) -> tuple[Path, Path, str]:
    """The tiny SD 1.x exported with latent side `latent` and batch up to `rows`, built for both backends at fp32."""
    source = _tiny_pipelines().make_tiny_pipeline("sd1", work / "source")
    out, store = work / "export", work / "store"
    _cli(
        "export",
        str(source),
        "--out",
        str(out),
        "--latent",
        f"{latent},{latent},{latent}",
        "--batch",
        f"1,{rows},{rows}",
    )
    _cli("build", str(out / "recipe.toml"), "--store", str(store), "--no-bench", "-j", "2", "--precision", "fp32")
    import tomllib

    return out, store, tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]


def median_seconds(call, repeats: int) -> float:
    call()  # warm-up: the first run of a shape pays the engine's own set-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(pipe, size: int, args) -> tuple[float, float, float, float]:
    """(one call of N images, N calls, the preview's seconds per step, a step's seconds), medians."""
    n, kwargs = args.images, dict(steps=args.steps, width=size, height=size)
    batched = median_seconds(lambda: pipe(PROMPT, seed=0, num_images_per_prompt=n, **kwargs), args.repeats)
    single = median_seconds(lambda: [pipe(PROMPT, seed=i, **kwargs) for i in range(n)], args.repeats)
    previews = []
    for _ in range(args.repeats):
        pipe(PROMPT, seed=0, on_preview=lambda step, image: None, **kwargs)
        previews.append(pipe.timings["preview"] / args.steps)
    return batched, single, statistics.median(previews), pipe.timings["denoise"] / args.steps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=4)
    p.add_argument("--latent", type=int, default=32, help="latent side (image side / 8)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--work", type=Path, default=None, help="folder to build in (default: a temporary one)")
    args = p.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-batch-"))
    print(f"building the tiny SD 1.x (latent {args.latent}, batch up to {2 * args.images}) in {work}", flush=True)
    out, store, name = build(work, args.latent, 2 * args.images)

    from enginefarm.diffusion import Pipeline

    size, n = args.latent * 8, args.images
    print(f"\n{n} images of {size}x{size}, {args.steps} steps, guidance on (UNet rows per step: {2 * n} vs 2)")
    print(f"{'backend':18} {'one call':>10} {f'{n} calls':>10} {'speed-up':>9} {'preview/step':>13} {'step':>9}")
    for target in BACKENDS:
        assets = out / "assets"
        pipe = Pipeline.load(name, store=str(store), target=target, precision="fp32", device="cpu", assets=assets)
        batched, single, preview, step = measure(pipe, size, args)
        pipe.close()
        print(
            f"{target:18} {batched:9.3f}s {single:9.3f}s {single / batched:8.2f}x "
            f"{preview * 1e3:10.3f} ms {step * 1e3:6.1f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
