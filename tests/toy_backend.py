"""A backend that lives outside the product: registered through ENGINEFARM_BACKENDS by tests/test_toy_backend.py to show
that one module is all a new backend takes. Its artifact is the prepared ONNX renamed `toy.onnx` plus a `toy.json`
that says which precision it was built in; it runs on ONNX Runtime's CPU provider."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np

from enginefarm.backends import Availability, Backend, Built, BuiltFile, Rank


class ToySession:
    def __init__(self, model: Path, precision: str) -> None:
        import onnxruntime

        self._session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self._session.get_inputs()]
        self.output_names = [o.name for o in self._session.get_outputs()]
        self.compute_precision = precision

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.output_names, self._session.run(self.output_names, feeds), strict=True))


class Toy(Backend):
    name = "toy"
    devices = re.compile(r"^cpu$")
    device_hint = "cpu"
    install = "it ships with the tests"
    onnx_precision = "same"

    def available(self, device: str) -> Availability:
        return Availability(True, True)

    def versions(self) -> dict[str, str]:
        return {"toy": "1.0"}

    def constraints(self, job) -> dict:
        return {"runtime": {"toy": ">=1.0"}}

    def build(self, prepared_onnx: Path, job, workdir: Path) -> Built:
        if prepared_onnx.with_name(prepared_onnx.name + ".data").exists():
            raise RuntimeError("the toy backend takes models under 2 GB only")
        shutil.copyfile(prepared_onnx, workdir / "toy.onnx")
        (workdir / "toy.json").write_text(json.dumps({"precision": job.precision}))
        return Built(
            [BuiltFile("toy.onnx", "model"), BuiltFile("toy.json", "engine")], {"toy_notes": "built by the toy"}
        )

    def load(self, artifact_dir: Path, manifest, device: str) -> ToySession:
        precision = json.loads((Path(artifact_dir) / "toy.json").read_text())["precision"]
        return ToySession(Path(artifact_dir) / "toy.onnx", precision)

    def device_classes(self, device) -> tuple[str, ...]:
        return ("cpu",) if device.kind == "cpu" else ()

    def rank(self, device_class: str) -> Rank:
        return Rank.PORTABLE_IR


BACKEND = Toy()
