"""ONNX Runtime's session and I/O binding: what `enginefarm.load` opens for an onnxruntime artifact.

Apart from the backend (backends/onnxruntime.py) so that a warm load (runner/warm.py) opens an artifact without
importing the backend registry: this module imports numpy and, when a session is made, onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np

PROVIDERS = {"cpu": "CPUExecutionProvider"}


def _ort():
    import onnxruntime  # found by the backend's availability check, or by the remembered pick's own import

    return onnxruntime


class OrtSession:
    def __init__(
        self,
        path: Path,
        device: str,
        precision: str,
        overrides: dict[str, np.ndarray] | None = None,
        model_bytes: bytes | None = None,
    ) -> None:
        """model_bytes: the model itself, a variant of the one at `path` (runner/live_weights.py), whose external
        data is read from `path`'s folder."""
        ort = _ort()
        options = ort.SessionOptions()
        if model_bytes is not None:
            options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(path.parent))
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
            str(path) if model_bytes is None else model_bytes,
            options,
            providers=[PROVIDERS.get(device, "CPUExecutionProvider")],
        )
        self._run_options = shrinking_run_options(ort)
        self.input_names = [i.name for i in self._session.get_inputs()]
        self.output_names = [o.name for o in self._session.get_outputs()]
        self.compute_precision = precision
        self.reopen_plan: dict | None = None  # how runner/warm.py opens it again (set by the backend's plain load)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self._session.run(self.output_names, feeds, self._run_options)
        return dict(zip(self.output_names, values, strict=True))

    def bind(self, fixed: dict[str, np.ndarray], shared: dict[str, np.ndarray] | None = None) -> OrtBinding:
        """shared: inputs bound over the caller's arrays, read in place (weights fed as inputs:
        runner/live_weights.py), not copied like `fixed`."""
        binding = OrtBinding(self._session, fixed, self.output_names, self._run_options)
        for name, array in (shared or {}).items():
            value = _ort().OrtValue.ortvalue_from_numpy(array)  # over the array's memory on the CPU
            binding._fixed[name] = value
            binding._binding.bind_ortvalue_input(name, value)
        return binding

    def close(self) -> None:
        self._session = None
        self._overrides = []  # the replaced initializers' values (custom weights): the closed session read them


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


def shrinking_run_options(ort):
    """Each run gives the CPU arena's free chunks back when it ends. Without it the arena keeps the largest run's
    high-water mark and grows past it on the next (runs of growing shapes: a build's validation cases); turning the
    arena off instead costs more than shrinking it (docs/benchmarks.md, "Measurements behind the code")."""
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


def reopen(root: Path, plan: dict) -> OrtSession:
    """The session a full load opened, opened again from its plan (`OrtSession.reopen`)."""
    return OrtSession(root / plan["model"], plan["device"], plan["precision"])
