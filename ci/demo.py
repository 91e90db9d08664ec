"""`make demo`: build the tiny SD-style recipe for OpenVINO and ONNX Runtime (fp32, fp16; bf16 on OpenVINO) into a local store,
load every artifact with enginefarm.load from an empty cache, run it, and print one table.

Everything lives under .enginefarm/ in the repository, so the demo never touches your real cache or store.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".enginefarm"
RECIPE = ROOT / "recipes" / "tiny_sd.toml"


def main() -> int:
    shutil.rmtree(WORK, ignore_errors=True)
    os.environ["ENGINEFARM_HOME"] = str(WORK / "home")
    os.environ["ENGINEFARM_STORE"] = str(WORK / "store")
    subprocess.run([sys.executable, str(ROOT / "recipes" / "make_tiny_sd.py")], check=True)
    cli = [sys.executable, "-m", "enginefarm.cli"]
    subprocess.run(cli + ["plan", str(RECIPE)], check=True)
    built = subprocess.run(cli + ["build", str(RECIPE), "-j", "2"])
    if built.returncode != 0:
        return built.returncode

    import numpy as np
    from rich.console import Console
    from rich.table import Table

    import enginefarm

    latent = np.random.default_rng(0).uniform(-3, 3, (1, 4, 16, 16)).astype(np.float32)
    table = Table(title="tiny-sd/decoder: every artifact, loaded from an empty cache")
    for column in ("artifact", "backend", "precision", "computes in", "min cosine", "min PSNR dB", "p50 ms (build)", "first inference ms", "output"):
        table.add_column(column)
    for target, precisions in (("openvino:cpu", ("fp32", "fp16", "bf16")), ("onnxruntime:cpu", ("fp32", "fp16"))):
        for precision in precisions:
            start = time.perf_counter()
            try:
                session = enginefarm.load("tiny-sd/decoder", precision=precision, device="cpu", target=target)
            except enginefarm.EnginefarmError as exc:  # bf16 is built only where the CPU computes it
                table.add_row("-", target, precision, "-", "-", "-", "-", "-", f"not built here: {str(exc)[:60]}")
                continue
            out = session.run({"latent": latent})["sample"]
            ttfi = (time.perf_counter() - start) * 1000
            m = session.artifact
            table.add_row(m.build_key[:12], target, precision, session.compute_precision, f"{m.validation['min_cosine']:.8f}", f"{m.validation['min_psnr']:.1f}",
                          f"{m.benchmarks[0]['p50_ms']:.3f}", f"{ttfi:.0f}", f"{list(out.shape)} std {out.std():.3f}")
    console = Console(width=160)
    console.print(table)
    session = enginefarm.load("tiny-sd/decoder", device="cpu")
    console.print("\nenginefarm.load('tiny-sd/decoder') picks:\n" + session.explain(), markup=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
