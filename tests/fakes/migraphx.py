"""A stand-in for ROCm's `migraphx` Python module, for tests only (the real one needs ROCm and an AMD GPU).

It mirrors the names and signatures of MIGraphX's pybind module (src/py/migraphx_py.cpp) that enginefarm uses,
records every call as one JSON line in $FAKE_MIGRAPHX_LOG, and "runs" a program with ONNX Runtime on the CPU
(rounding through float16 when the program was quantized), so builds validate for real. `compile` notes the gfx
that MIGraphX would compile for: the one HSA_OVERRIDE_GFX_VERSION names, else the HIP-visible fake GPU.
$FAKE_MIGRAPHX_CRASH=parse aborts the process inside parse_onnx, as a crashing SDK would.
"""

from __future__ import annotations

import json
import os

import numpy as np

__version__ = "2.12.0"


def _record(call: str, **args) -> None:
    log = os.environ.get("FAKE_MIGRAPHX_LOG")
    if log:
        with open(log, "a") as handle:
            handle.write(json.dumps({"call": call, "pid": os.getpid(), **args}, default=sorted) + "\n")


def _gfx_here() -> str:
    override = os.environ.get("HSA_OVERRIDE_GFX_VERSION")
    if override:
        major, minor, step = (int(p) for p in override.split("."))
        return f"gfx{major}{minor:x}{step:x}"
    gpus = [g for g in os.environ.get("FAKE_ROCM_GPUS", "").split(",") if g]
    visible = os.environ.get("HIP_VISIBLE_DEVICES")
    return gpus[int(visible)] if visible is not None else gpus[0]


class shape:  # noqa: N801 (pybind names)
    class dynamic_dimension:  # noqa: N801
        def __init__(self, min: int = 0, max: int = 0, optimals=()) -> None:  # noqa: A002
            self.min, self.max, self.optimals = min, max, set(optimals)

        def is_fixed(self) -> bool:
            return self.min == self.max


class argument:  # noqa: N801
    def __init__(self, buffer) -> None:
        self._data = np.array(buffer, copy=True)

    def __array__(self, dtype=None, copy=None):
        return self._data if dtype is None else self._data.astype(dtype)

    def get_shape(self):
        return list(self._data.shape)


class target:  # noqa: N801
    def __init__(self, name: str) -> None:
        self.name = name


class program:  # noqa: N801
    def __init__(self, state: dict) -> None:
        self.state = state

    def get_parameter_names(self) -> list[str]:
        return list(self.state["inputs"])

    def compile(self, t, offload_copy: bool = True, fast_math: bool = True, exhaustive_tune: bool = False) -> None:
        gfx = _gfx_here()
        _record(
            "compile",
            target=t.name,
            offload_copy=offload_copy,
            gfx=gfx,
            env={k: os.environ.get(k) for k in ("HIP_VISIBLE_DEVICES", "HSA_OVERRIDE_GFX_VERSION")},
        )
        self.state.update(compiled_for=gfx, target=t.name)

    def run(self, params: dict) -> list:
        import onnxruntime as ort

        _record(
            "run",
            args={
                name: [type(value).__name__, str(np.asarray(value).dtype), list(np.asarray(value).shape)]
                for name, value in params.items()
            },
        )
        session = ort.InferenceSession(self.state["onnx"], providers=["CPUExecutionProvider"])
        outputs = session.run(None, {name: np.asarray(value) for name, value in params.items()})
        if self.state.get("fp16"):
            outputs = [o.astype(np.float16).astype(o.dtype) for o in outputs]
        return [argument(o) for o in outputs]


def parse_onnx(
    filename: str,
    default_dim_value: int = 0,
    default_dyn_dim_value=None,
    dim_params=None,
    map_input_dims=None,
    map_dyn_input_dims=None,
    skip_unknown_operators: bool = False,
    print_program_on_error: bool = False,
    max_loop_iterations: int = 10,
    limit_max_iterations: int = 65535,
    use_debug_symbols: bool = False,
) -> program:
    if os.environ.get("FAKE_MIGRAPHX_CRASH") == "parse":
        os.abort()
    dyn = {
        name: [[d.min, d.max, sorted(d.optimals)] for d in dims] for name, dims in (map_dyn_input_dims or {}).items()
    }
    _record("parse_onnx", filename=filename, map_input_dims=map_input_dims or {}, map_dyn_input_dims=dyn)
    import onnx

    model = onnx.load(filename, load_external_data=False)
    inputs = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    return program({"onnx": os.path.abspath(filename), "inputs": inputs, "fp16": False})


def quantize_fp16(prog: program, ins_names=("all",)) -> None:
    _record("quantize_fp16", ins_names=list(ins_names))
    prog.state["fp16"] = True


def get_target(name: str) -> target:
    _record("get_target", name=name)
    return target(name)


def save(p: program, filename: str, format: str = "msgpack") -> None:  # noqa: A002
    _record("save", filename=filename, format=format)
    with open(filename, "w") as handle:
        json.dump(p.state, handle)


def load(filename: str, format: str = "msgpack") -> program:  # noqa: A002
    _record("load", filename=filename, format=format)
    with open(filename) as handle:
        return program(json.load(handle))
