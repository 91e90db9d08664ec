"""ONNX Runtime: the reference and universal fallback. The artifact is the prepared ONNX itself."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np

from enginefarm.errors import BackendUnavailable

from .base import Availability, BuiltFile, import_sdk

NAME = "onnxruntime"
DEVICES = re.compile(r"^cpu$")
DEVICE_HINT = "cpu"
ONNX_PRECISION = "same"  # fp16 artifacts are fp16 ONNX (float32 I/O)

_PROVIDERS = {"cpu": "CPUExecutionProvider"}


def _ort():
    return import_sdk("onnxruntime", "pip install 'enginefarm[onnxruntime]'")


def available(device: str) -> Availability:
    try:
        ort = _ort()
    except BackendUnavailable as exc:
        return Availability.missing(str(exc))
    provider = _PROVIDERS.get(device)
    if provider not in ort.get_available_providers():
        return Availability.missing(f"onnxruntime here has no {provider or device}")
    return Availability(True, True)


def versions() -> dict[str, str]:
    return {"onnxruntime": _ort().__version__}


def constraints(job) -> dict:
    # ONNX runs on any ORT that knows its opset; we ask for the build's minor or newer as a safe floor.
    return {"runtime": {"onnxruntime": ">=" + versions()["onnxruntime"].split("+")[0]}}


def build(prepared_onnx: Path, job, workdir: Path) -> list[BuiltFile]:
    out = workdir / "model.onnx"
    shutil.copyfile(prepared_onnx, out)
    files = [BuiltFile("model.onnx", "model")]
    data = prepared_onnx.with_name(prepared_onnx.name + ".data")
    if data.exists():
        # External data keeps its original file name, which the ONNX graph refers to.
        shutil.copyfile(data, workdir / data.name)
        files.append(BuiltFile(data.name, "weights"))
    return files


class OrtSession:
    def __init__(self, path: Path, device: str, precision: str) -> None:
        ort = _ort()
        options = ort.SessionOptions()
        options.log_severity_level = 3
        self._session = ort.InferenceSession(str(path), options, providers=[_PROVIDERS.get(device, "CPUExecutionProvider")])
        self.input_names = [i.name for i in self._session.get_inputs()]
        self.output_names = [o.name for o in self._session.get_outputs()]
        self.compute_precision = precision

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self._session.run(self.output_names, feeds)
        return dict(zip(self.output_names, values))


def load(artifact_dir: Path, manifest, device: str = "cpu") -> OrtSession:
    model = next(f.path for f in manifest.files if f.role == "model")
    return OrtSession(Path(artifact_dir) / model, manifest.parsed_target.device, manifest.precision)

