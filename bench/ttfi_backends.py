"""Warm time to first inference, `enginefarm.load` against bare ONNX Runtime and bare OpenVINO on the same artifact
files, each in a fresh process, medians of --repeats (7); with Python writing bytecode (.pyc reused from the second
process on) and with PYTHONDONTWRITEBYTECODE=1 (every process compiles enginefarm's sources again).

The model is the 48 MB MatMul chain of tests/runner/test_lifecycle.py (12 layers of 1024×1024 fp32), built for
onnxruntime:cpu and openvino:cpu into a temporary store; the clock starts before `import enginefarm` / the SDK
import and stops when the first inference returns. A benchmark, not a test: it never fails on numbers.

    .venv/bin/python bench/ttfi_backends.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import sys, time
import numpy as np
x = np.ones((1, 1024), np.float32)
kind, target, path = sys.argv[1:4]
t0 = time.perf_counter()
if kind == "bare" and target.startswith("onnxruntime"):
    import onnxruntime as ort
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    s.run(None, {"x": x})
elif kind == "bare":
    import openvino as ov
    core = ov.Core()
    hints = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}
    compiled = core.compile_model(core.read_model(path), "CPU", hints)
    compiled.create_infer_request().infer({"x": x})
else:
    import enginefarm
    enginefarm.load("chain/net", device="cpu", target=target).run({"x": x})
print((time.perf_counter() - t0) * 1000)
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.runner.test_lifecycle import _chain

    with tempfile.TemporaryDirectory(prefix="ttfi-") as tmp:
        root = Path(tmp)
        _chain(root / "models" / "chain.onnx")
        (root / "recipe.toml").write_text(
            '[model]\nname = "chain"\nversion = "1"\n\n[defaults]\nprecisions = ["fp32"]\n'
            'targets = ["onnxruntime:cpu", "openvino:cpu"]\n\n[components.net]\nsource = "models/chain.onnx"\n\n'
            "[components.net.profiles.default]\nbatch = [1, 1, 4]\n"
        )
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
        files: dict[str, Path | str] = {"onnxruntime:cpu": "", "openvino:cpu": ""}

        def once(kind: str, target: str, bytecode: bool) -> float:
            child_env = dict(env)
            child_env.pop("PYTHONDONTWRITEBYTECODE", None)
            if not bytecode:
                child_env["PYTHONDONTWRITEBYTECODE"] = "1"
            out = subprocess.run(
                [sys.executable, "-c", CHILD, kind, target, str(files[target])],
                env=child_env,
                cwd=tmp,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            return float(out.strip().splitlines()[-1])

        for target in files:  # fetches the artifacts into the local cache, where bare reads the same files
            once("enginefarm", target, True)
        files = {
            "onnxruntime:cpu": next((root / "home").rglob("model.onnx")),
            "openvino:cpu": next((root / "home").rglob("model.xml")),
        }
        print(f"{'bytecode':<10}{'target':<18}{'bare ms':>9}{'enginefarm ms':>15}{'ratio':>7}")
        for bytecode in (True, False):
            for target in files:
                for kind in ("bare", "enginefarm"):
                    once(kind, target, bytecode)  # warm-up: OS file cache, .pyc, the device-probe cache
                times = {"bare": [], "enginefarm": []}
                for _ in range(args.repeats):
                    for kind in times:  # alternating, so a busy moment hits both
                        times[kind].append(once(kind, target, bytecode))
                bare, ours = statistics.median(times["bare"]), statistics.median(times["enginefarm"])
                print(
                    f"{'written' if bytecode else 'off':<10}{target:<18}{bare:>9.0f}{ours:>15.0f}{ours / bare:>7.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
