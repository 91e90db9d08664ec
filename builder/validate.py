"""The validation gate: an artifact must reproduce the fp32 ONNX Runtime run of the original model.

Cosine alone is fooled by noise: random inputs can drive a model to near-constant outputs (all ~1e-9),
where cosine is meaningless. So each output is judged by cosine *and* a max-abs tolerance relative to the
reference's range; where the range is below the noise floor, only max-abs decides. The report says which.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .recipe import ValidateSpec

DEFAULT_THRESHOLDS = {
    "fp32": {"min_cosine": 0.9999, "max_abs_rel": 1e-3},
    "fp16": {"min_cosine": 0.995, "max_abs_rel": 0.05},
}
DEFAULT_NOISE_FLOOR = 1e-6


@dataclass(frozen=True)
class Thresholds:
    min_cosine: float
    max_abs_rel: float
    noise_floor: float

    @classmethod
    def for_job(cls, precision: str, spec: ValidateSpec) -> "Thresholds":
        base = DEFAULT_THRESHOLDS[precision]
        return cls(
            spec.min_cosine if spec.min_cosine is not None else base["min_cosine"],
            spec.max_abs_rel if spec.max_abs_rel is not None else base["max_abs_rel"],
            spec.noise_floor if spec.noise_floor is not None else DEFAULT_NOISE_FLOOR,
        )


def sample_cases(inputs, profile: dict[str, dict[str, list[int]]], spec: ValidateSpec) -> list[tuple[str, dict[str, np.ndarray]]]:
    """Seeded inputs at the profile's min, opt and max shapes, plus the recipe's real samples if any."""
    cases = []
    for index, corner in enumerate(("min", "opt", "max")):
        rng = np.random.default_rng(spec.seed + index)
        feeds = {}
        for tensor in inputs:
            shape = profile[tensor.name][corner]
            sample = spec.inputs.get(tensor.name)
            if sample is not None and sample.file is not None:
                feeds[tensor.name] = _fit(np.load(sample.file), shape, tensor.dtype)
                continue
            low, high = (sample.low, sample.high) if sample else (-1.0, 1.0)
            if tensor.dtype.startswith(("int", "uint")):
                feeds[tensor.name] = rng.integers(int(low), int(high) + 1, size=shape).astype(tensor.dtype)
            elif tensor.dtype == "bool":
                feeds[tensor.name] = rng.integers(0, 2, size=shape).astype(bool)
            else:
                feeds[tensor.name] = rng.uniform(low, high, size=shape).astype(tensor.dtype)
        cases.append((corner, feeds))
    if spec.samples is not None:
        with np.load(spec.samples) as data:
            cases.append(("samples", {t.name: np.asarray(data[t.name]).astype(t.dtype) for t in inputs if t.name in data}))
    return cases


def _fit(array: np.ndarray, shape: list[int], dtype: str) -> np.ndarray:
    """Tile or crop a real sample to the profile corner's shape."""
    array = np.asarray(array)
    if list(array.shape) == list(shape):
        return array.astype(dtype)
    if array.ndim != len(shape):
        raise ValueError(f"sample of shape {array.shape} has the wrong rank for {shape}")
    reps = [-(-want // have) for want, have in zip(shape, array.shape)]
    tiled = np.tile(array, reps)
    return tiled[tuple(slice(0, n) for n in shape)].astype(dtype)


def reference_outputs(model_path: Path, cases) -> list[dict[str, np.ndarray]]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(names, feeds))) for _, feeds in cases]


def compare(reference: np.ndarray, actual: np.ndarray, limits: Thresholds) -> dict[str, Any]:
    ref = np.asarray(reference, dtype=np.float64).ravel()
    got = np.asarray(actual, dtype=np.float64).ravel()
    if ref.shape != got.shape:
        return {"passed": False, "decided_by": "shape", "reason": f"shape {np.shape(actual)} != reference {np.shape(reference)}"}
    if not np.all(np.isfinite(got)):
        return {"passed": False, "decided_by": "finite", "reason": "output has NaN or inf"}
    value_range = float(ref.max() - ref.min()) if ref.size else 0.0
    max_abs = float(np.max(np.abs(ref - got))) if ref.size else 0.0
    tolerance = limits.max_abs_rel * max(value_range, limits.noise_floor)
    mse = float(np.mean((ref - got) ** 2)) if ref.size else 0.0
    psnr = float("inf") if mse == 0 else 10 * np.log10(max(value_range, limits.noise_floor) ** 2 / mse)
    norms = float(np.linalg.norm(ref) * np.linalg.norm(got))
    cosine = float(np.dot(ref, got) / norms) if norms > 0 else (1.0 if max_abs == 0 else 0.0)
    result = {"cosine": round(cosine, 9), "max_abs": max_abs, "range": value_range, "tolerance": tolerance, "psnr": round(min(psnr, 999.0), 2)}
    if value_range <= limits.noise_floor:
        passed = max_abs <= tolerance
        decided = "max_abs (cosine ignored: output range below the noise floor)"
        reason = "" if passed else f"max_abs {max_abs:.3g} > tolerance {tolerance:.3g}"
    elif cosine < limits.min_cosine:
        passed, decided, reason = False, "cosine", f"cosine {cosine:.8f} < {limits.min_cosine}"
    elif max_abs > tolerance:
        passed, decided, reason = False, "max_abs", f"max_abs {max_abs:.3g} > {limits.max_abs_rel} × range {value_range:.3g}"
    else:
        passed, decided, reason = True, "cosine and max_abs", ""
    return {**result, "passed": passed, "decided_by": decided, "reason": reason}


def validate(session, cases, references, limits: Thresholds) -> dict[str, Any]:
    checks = []
    for (corner, feeds), reference in zip(cases, references):
        actual = session.run(feeds)
        for name, ref in reference.items():
            if name not in actual:
                checks.append({"case": corner, "output": name, "passed": False, "decided_by": "missing", "reason": f"artifact has no output {name!r}"})
                continue
            checks.append({"case": corner, "output": name, "shape": list(np.shape(ref)), **compare(ref, actual[name], limits)})
    failed = [c for c in checks if not c["passed"]]
    scored = [c for c in checks if "cosine" in c]
    return {
        "passed": not failed,
        "thresholds": {"min_cosine": limits.min_cosine, "max_abs_rel": limits.max_abs_rel, "noise_floor": limits.noise_floor},
        "compute_precision": getattr(session, "compute_precision", "unknown"),
        "min_cosine": min((c["cosine"] for c in scored), default=None),
        "min_psnr": min((c["psnr"] for c in scored), default=None),
        "checks": checks,
        "failure": "; ".join(f"{c['output']}@{c['case']}: {c['reason']}" for c in failed),
    }
