"""What a live preview costs per step: the linear latent-to-RGB map (`enginefarm.diffusion.preview`) against a
TAESD decoder built by the farm, at a --side² image (512: an SD 1.5 latent of 64²).

The TAESD is madebyollin's taesd_decoder.safetensors layout at its published width (64 channels, blocks 3-3-3-1)
with seeded random weights (its cost does not depend on the values), exported with `export_filter` and built for
ONNX Runtime and OpenVINO at fp32 and fp16; diffusers' AutoencoderTiny in torch on the same latent is the reference.
Each time is the median of --repeats warm runs in this process. A benchmark, not a test: it never fails on numbers.

    .venv/bin/python bench/preview_cost.py [--side 512] [--repeats 5] [--work DIR]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TARGETS = ("onnxruntime:cpu", "openvino:cpu")
PRECISIONS = ("fp32", "fp16")


def _median(run, repeats: int) -> float:
    run()  # warm: first-run allocations and compilation are not the time asked for
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--side", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="preview-cost-"))
    work.mkdir(parents=True, exist_ok=True)

    import torch

    import enginefarm.filters
    from enginefarm.diffusion.preview import latent_rgb, linear_preview
    from enginefarm.export.filters.run import export_filter
    from tests.filters.tiny_filters import taesd, write_taesd_decoder_file

    model = taesd(narrow=False)
    source = write_taesd_decoder_file(work / "taesd_decoder.safetensors", model)
    start = time.perf_counter()
    export = export_filter(source, work / "out", name="taesd", targets=TARGETS, precisions=PRECISIONS, overwrite=True)
    exported = time.perf_counter() - start
    start = time.perf_counter()
    store = work / "store"
    command = [sys.executable, "-m", "enginefarm.cli_entry", "build", str(export.recipe), "--store", str(store)]
    subprocess.run([*command, "--no-bench"], check=True, capture_output=True)
    built = time.perf_counter() - start
    print(f"TAESD (published width): export {exported:.1f} s, build 4 artifacts {built:.1f} s")

    side = args.side // 8
    latent = np.random.default_rng(0).standard_normal((1, 4, side, side)).astype(np.float32)
    factors, bias = latent_rgb(0.18215, 4)
    rows = [("latent-RGB map (numpy)", _median(lambda: linear_preview(latent, factors, bias), args.repeats))]
    with torch.no_grad():
        tensor = torch.from_numpy(latent)
        rows.append(("TAESD torch fp32 (diffusers)", _median(lambda: model.decode(tensor), args.repeats)))
    for target in TARGETS:
        for precision in PRECISIONS:
            with enginefarm.filters.load("taesd", store=str(store), target=target, precision=precision) as decoder:
                seconds = _median(lambda decoder=decoder: decoder(latent), args.repeats)
                rows.append((f"TAESD {target} {precision} ({decoder.sessions['decoder'].compute_precision})", seconds))
    print(f"preview of a {args.side}² image (latent {side}²), median of {args.repeats}:")
    for label, seconds in rows:
        print(f"  {label:<48} {seconds * 1000:9.1f} ms per step")


if __name__ == "__main__":
    main()
