"""ONNX Runtime: the reference and universal fallback. The artifact is the prepared ONNX itself."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from enginefarm.errors import BackendUnavailable

from . import onnx_weights
from .base import Availability, Backend, Built, BuiltFile, BundleSpec, Feature, Rank
from .build_job import BuildJob
from .manifest_files import role_file

_PROVIDERS = {"cpu": "CPUExecutionProvider"}


def _ort():
    return BACKEND.sdk()


class OrtSession:
    def __init__(self, path: Path, device: str, precision: str, overrides: dict[str, np.ndarray] | None = None) -> None:
        ort = _ort()
        options = ort.SessionOptions()
        options.log_severity_level = 4  # a failed run raises with the same text; ORT's own log line would repeat it
        # initializers replaced at session creation (before graph optimization); ORT reads the arrays while the
        # session lives, so they are kept
        self._overrides = [(name, ort.OrtValue.ortvalue_from_numpy(value)) for name, value in (overrides or {}).items()]
        for name, value in self._overrides:
            options.add_initializer(name, value)
        if self._overrides:
            # ORT 1.32's layout passes (level ALL: NCHWc for fp32, NHWC for fp16) re-read Conv weights from the model
            # file, so overridden Conv weights would be silently dropped: sessions with overrides stop at EXTENDED
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        self._session = ort.InferenceSession(
            str(path), options, providers=[_PROVIDERS.get(device, "CPUExecutionProvider")]
        )
        self._run_options = _run_options(ort)
        self.input_names = [i.name for i in self._session.get_inputs()]
        self.output_names = [o.name for o in self._session.get_outputs()]
        self.compute_precision = precision

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self._session.run(self.output_names, feeds, self._run_options)
        return dict(zip(self.output_names, values, strict=True))

    def bind(self, fixed: dict[str, np.ndarray]) -> OrtBinding:
        return OrtBinding(self._session, fixed, self.output_names, self._run_options)

    def close(self) -> None:
        self._session = None


class OrtBinding:
    """An I/O binding: the fixed inputs are OrtValues bound once; outputs are allocated by ORT on the session's device
    each run, so a kept one stays valid while later runs write new ones."""

    name = "device"

    def __init__(self, session, fixed: dict[str, np.ndarray], output_names: list[str], run_options) -> None:
        ort = _ort()
        self._session, self._outputs, self._run_options = session, output_names, run_options
        self._binding = session.io_binding()
        self._fixed = {
            name: ort.OrtValue.ortvalue_from_numpy(array.copy()) for name, array in fixed.items()
        }  # the device's own copy
        for name, value in self._fixed.items():
            self._binding.bind_ortvalue_input(name, value)

    def run(self, feeds: dict, keep: tuple[str, ...] = ()) -> dict:
        from enginefarm.hardware.tensors import DeviceTensor

        binding = self._binding
        for name, value in feeds.items():
            if isinstance(value, DeviceTensor) and value.backend == "onnxruntime":
                binding.bind_ortvalue_input(name, value.value)
            else:  # numpy (or another backend's tensor, through numpy): ORT reads the array where it lies on the CPU
                binding.bind_cpu_input(name, np.ascontiguousarray(np.asarray(value)))
        for name in self._outputs:
            binding.bind_output(name, "cpu")
        self._session.run_with_iobinding(binding, self._run_options)
        values = binding.get_outputs()
        out = {}
        for name, value in zip(self._outputs, values, strict=True):
            if name in keep:
                out[name] = DeviceTensor(
                    "onnxruntime", value, tuple(value.shape()), _np_dtype(value), lambda v: v.numpy()
                )
            else:
                out[name] = value.numpy()
        return out

    def close(self) -> None:
        self._binding = self._session = None
        self._fixed = {}


def _run_options(ort):
    """Each run gives the CPU arena's free chunks back when it ends. Without it the arena keeps the largest run's
    high-water mark and grows past it on the next: the real-size SD 1.5 UNet (fp16, 512², batch 2) peaked at 6.1 GB
    on its first run and 8.4 GB from its second on; with shrinkage 6.2 GB on every run. Turning the arena off
    instead peaked at 6.7 GB."""
    options = ort.RunOptions()
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return options


_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(double)": np.float64,
    "tensor(bool)": np.bool_,
    "tensor(uint8)": np.uint8,
    "tensor(int8)": np.int8,
}


def _np_dtype(value) -> np.dtype:
    return np.dtype(_ORT_TYPES.get(value.data_type(), np.float32))


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
        provider = _PROVIDERS.get(device)
        if provider not in ort.get_available_providers():
            return Availability.missing(f"onnxruntime here has no {provider or device}")
        return Availability(True, True)

    def constraints(self, job: BuildJob) -> dict:
        # ONNX runs on any ORT that knows its opset; we ask for the build's minor or newer as a safe floor.
        return {"runtime": {"onnxruntime": ">=" + self.versions()["onnxruntime"].split("+")[0]}}

    def build(self, prepared_onnx: Path, job: BuildJob, workdir: Path) -> Built:
        from enginefarm.builder.onnx_data import (
            link_or_copy,  # the prepared files are never rewritten: a link is a copy for free
        )

        out = workdir / "model.onnx"
        link_or_copy(prepared_onnx, out)
        files = [BuiltFile("model.onnx", "model")]
        data = prepared_onnx.with_name(prepared_onnx.name + ".data")
        if data.exists():
            # External data keeps its original file name, which the ONNX graph refers to.
            link_or_copy(data, workdir / data.name)
            files.append(BuiltFile(data.name, "weights"))
        return Built(files)

    def load(self, artifact_dir: Path, manifest, device: str = "cpu") -> OrtSession:
        model = role_file(manifest, "model")
        return OrtSession(Path(artifact_dir) / model, manifest.parsed_target.device, manifest.precision)

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
