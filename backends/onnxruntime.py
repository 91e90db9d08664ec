"""ONNX Runtime: the reference and universal fallback. The artifact is the prepared ONNX itself."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from enginefarm.errors import BackendUnavailable
from enginefarm.sessions.onnxruntime import PROVIDERS, OrtSession

from . import onnx_weights
from .base import Availability, Backend, Built, BuiltFile, BundleSpec, Feature, Rank
from .build_job import BuildJob
from .manifest_files import role_file


# The artifact is its ONNX model (and the external data file beside it for large models).
def _model_path(artifact_dir: Path, manifest) -> Path:
    return Path(artifact_dir) / role_file(manifest, "model")


# An app bundle (`enginefarm bundle`) holds the Python package with its pybind module, which is self-contained: the C
# API library beside it (libonnxruntime.so, 35 MB) serves C/C++ callers only. Left out: tools/, transformers/,
# quantization/, datasets/ and backend/ (the ONNX backend API, which imports onnx), type stubs.
_ORT_BUNDLE = BundleSpec(
    ("onnxruntime",),
    drop=(
        "onnxruntime/tools/*",
        "onnxruntime/transformers/*",
        "onnxruntime/quantization/*",
        "onnxruntime/datasets/*",
        "onnxruntime/backend/*",
        "onnxruntime/capi/*onnxruntime.so*",
        "onnxruntime/capi/*onnxruntime.*.dylib",
        "*.pyi",
    ),
)


class OnnxRuntime(Backend):
    probes = ("cpu",)
    name = "onnxruntime"
    sdk_module = "onnxruntime"
    devices = re.compile(r"^cpu$")
    device_hint = "cpu"
    install = "pip install 'enginefarm[onnxruntime]'"
    onnx_precision = "same"  # fp16 artifacts are fp16 ONNX (float32 I/O)
    # the artifact is the prepared source itself, attention fused: SD 1.5's fp32 UNet validated at 1.4x its weights
    # at batch 2 x 768 px; the shared fp32 reference, an item at a time, is under the attention term
    build_memory_factor = 2.2
    lacks = {
        "bf16": "ONNX Runtime's CPU provider has no bf16 kernels for Conv and most other ops (a bf16 model does "
        "not even load); build bf16 for openvino:cpu"
    }
    features = frozenset({Feature.PATCH_WEIGHTS, Feature.WEIGHTS_AT_LOAD})
    bundles = {"cpu": _ORT_BUNDLE}

    def available(self, device: str) -> Availability:
        try:
            ort = self.sdk()
        except BackendUnavailable as exc:
            return Availability.missing(str(exc))
        provider = PROVIDERS.get(device)
        if provider not in ort.get_available_providers():
            return Availability.missing(f"onnxruntime here has no {provider or device}")
        return Availability(True, True)

    def versions(self) -> dict[str, str]:
        from .onnxruntime_attention import FUSION_VERSION

        return {"onnxruntime": str(self.sdk().__version__), "attention_fusion": FUSION_VERSION}

    def constraints(self, job: BuildJob) -> dict:
        # ONNX runs on any ORT that knows its opset; we ask for the build's minor or newer as a safe floor.
        return {"runtime": {"onnxruntime": ">=" + self.versions()["onnxruntime"].split("+")[0]}}

    def build(self, prepared_onnx: Path, job: BuildJob, workdir: Path) -> Built:
        from enginefarm.formats.onnx_data import (
            link_or_copy,  # the prepared files are never rewritten: a link is a copy for free
        )

        from .onnxruntime_attention import write_fused

        out = workdir / "model.onnx"
        fused = write_fused(prepared_onnx, out)
        if fused is None:
            link_or_copy(prepared_onnx, out)
        files = [BuiltFile("model.onnx", "model")]
        data = prepared_onnx.with_name(prepared_onnx.name + ".data")
        if data.exists():
            # External data keeps its original file name, which the ONNX graph refers to.
            link_or_copy(data, workdir / data.name)
            files.append(BuiltFile(data.name, "weights"))
        # The fused count, and the Softmax nodes left beside them (a text encoder's masked attention stays as it is).
        return Built(files, {"attention_fused": fused[0], "softmax_left": fused[1]} if fused else {})

    def load(self, artifact_dir: Path, manifest, device: str = "cpu") -> OrtSession:
        model = role_file(manifest, "model")
        session = OrtSession(Path(artifact_dir) / model, manifest.parsed_target.device, manifest.precision)
        session.reopen_plan = {
            "module": "enginefarm.sessions.onnxruntime",
            "model": model,
            "device": manifest.parsed_target.device,
            "precision": manifest.precision,
        }
        return session

    # Custom weights: the artifact is ONNX, so its weights are the initializers, by name (onnx_weights.py).
    def weight_shapes(self, artifact_dir: Path, manifest) -> dict[str, tuple[int, ...]]:
        return onnx_weights.float_shapes(_model_path(artifact_dir, manifest))

    def read_weights(self, artifact_dir: Path, manifest, names) -> dict[str, np.ndarray]:
        return onnx_weights.read(_model_path(artifact_dir, manifest), names)

    def patch_weights(
        self, artifact_dir: Path, manifest, weights: dict[str, np.ndarray], outdir: Path
    ) -> list[BuiltFile]:
        """A copy of the artifact with `weights` (float32, ONNX layout) cast into the initializers' own dtypes; large
        models keep their weights in one external file of the same name as before."""
        data = next((Path(f.path).name for f in manifest.files if f.role == "weights"), None)
        written = onnx_weights.write_patched(_model_path(artifact_dir, manifest), weights, outdir, data)
        return [BuiltFile(name, "weights" if name == data else "model") for name in written]

    def load_with_weights(
        self, artifact_dir: Path, manifest, weights: dict[str, np.ndarray], device: str = "cpu"
    ) -> OrtSession:
        """The artifact's session with `weights` (float32, ONNX layout, cast to the initializers' dtypes) given to ONNX
        Runtime as initializer overrides at session creation: nothing is written, and `onnx` is not imported."""
        model = _model_path(artifact_dir, manifest)
        overrides = onnx_weights.as_overrides(model, weights, f"{manifest.ref} [{manifest.build_key[:12]}]")
        return OrtSession(model, manifest.parsed_target.device, manifest.precision, overrides)

    def device_classes(self, device) -> tuple[str, ...]:
        return ("cpu",) if device.kind == "cpu" else ()

    def rank(self, device_class: str) -> Rank:
        return Rank.ONNX


BACKEND = OnnxRuntime()
