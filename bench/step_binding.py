"""Per-step overhead of a denoising loop's UNet call: `Session.run` (every input through numpy each step) against a
`Session.bind` binding (the text states placed on the device once; only the latent and timestep each step), for ONNX
Runtime and OpenVINO on CPU, side by side in one run.

The model has the SD 1.5 UNet's real inputs and output at a 64×64 latent under guidance (sample [2, 4, 64, 64],
timestep [2], encoder_hidden_states [2, 77, 768] → out_sample [2, 4, 64, 64]) and next to no compute (a sum): a
real UNet's step takes seconds on this CPU, so the milliseconds a binding saves would drown in its noise, while
here the step time is the overhead itself. overhead saved = median(run) − median(bound); ratio = run / bound.
A benchmark, not a test: it never fails on numbers.

    .venv/bin/python bench/step_binding.py [--steps 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("onnxruntime:cpu", "openvino:cpu")
RECIPE = """
[model]
name = "stepio"
version = "1"

[defaults]
precisions = ["fp32"]
targets = ["onnxruntime:cpu", "openvino:cpu"]

[components.unet]
source = "unet_io.onnx"
"""


def write_model(path: Path) -> None:
    """out_sample = sample + mean(encoder_hidden_states) · mean(timestep) · 1e-6: every input is read, little is
    computed."""
    import onnx
    import onnx.helper as h

    f = onnx.TensorProto.FLOAT
    nodes = [
        h.make_node("ReduceMean", ["encoder_hidden_states"], ["m_text"], keepdims=0),
        h.make_node("ReduceMean", ["timestep"], ["m_t"], keepdims=0),
        h.make_node("Mul", ["m_text", "m_t"], ["m"]),
        h.make_node("Mul", ["m", "tiny"], ["scaled"]),
        h.make_node("Add", ["sample", "scaled"], ["out_sample"]),
    ]
    graph = h.make_graph(
        nodes,
        "unet_io",
        [
            h.make_tensor_value_info("sample", f, [2, 4, 64, 64]),
            h.make_tensor_value_info("timestep", f, [2]),
            h.make_tensor_value_info("encoder_hidden_states", f, [2, 77, 768]),
        ],
        [h.make_tensor_value_info("out_sample", f, [2, 4, 64, 64])],
        [h.make_tensor("tiny", f, [], [1e-6])],
    )
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10), str(path))


def per_step(loop, steps: int, repeats: int) -> float:
    """Median over `repeats` of the mean seconds per step of `steps` steps."""
    loop(5)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        loop(steps)
        times.append((time.perf_counter() - start) / steps)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="step-binding-") as tmp:
        root = Path(tmp)
        write_model(root / "unet_io.onnx")
        (root / "recipe.toml").write_text(RECIPE)
        env = {**os.environ, "ENGINEFARM_HOME": str(root / "home"), "ENGINEFARM_STORE": str(root / "store")}
        subprocess.run(
            [
                sys.executable,
                "-m",
                "enginefarm.cli",
                "build",
                str(root / "recipe.toml"),
                "--store",
                str(root / "store"),
                "--no-bench",
            ],
            cwd=ROOT,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        os.environ.update(ENGINEFARM_HOME=env["ENGINEFARM_HOME"], ENGINEFARM_STORE=env["ENGINEFARM_STORE"])
        import enginefarm

        rng = np.random.default_rng(0)
        text = rng.standard_normal((2, 77, 768)).astype(np.float32)
        x0 = rng.standard_normal((2, 4, 64, 64)).astype(np.float32)
        t = np.array([500.0, 500.0], np.float32)
        print(f"{'backend':<18}{'run ms/step':>13}{'bound ms/step':>15}{'saved ms/step':>15}{'ratio':>8}")
        for target in TARGETS:
            with enginefarm.load("stepio/unet", precision="fp32", device="cpu", target=target) as unet:

                def plain(n: int) -> None:
                    x = x0
                    for _ in range(n):
                        x = unet.run({"sample": x, "timestep": t, "encoder_hidden_states": text})[
                            "out_sample"
                        ] * np.float32(0.5)

                with unet.bind({"encoder_hidden_states": text}) as binding:

                    def bound(n: int) -> None:
                        x = x0
                        for _ in range(n):
                            x = binding.run({"sample": x, "timestep": t})["out_sample"] * np.float32(0.5)

                    a, b = per_step(plain, args.steps, args.repeats), per_step(bound, args.steps, args.repeats)
            print(f"{target:<18}{a * 1e3:>13.3f}{b * 1e3:>15.3f}{(a - b) * 1e3:>15.3f}{a / b:>8.2f}")


if __name__ == "__main__":
    main()
