"""The validation gate: an artifact must reproduce the fp32 ONNX Runtime run of the original model.

Each output is judged by two criteria, and every metric is reported:
- max-abs: max |artifact - reference| ≤ max(max_abs_rel × the reference's range, the numerical noise floor);
- cosine ≥ min_cosine, unless the reference's whole range lies within the noise floor (then its direction is
  numerical noise, and max-abs alone decides).
The noise floor is what a correct kernel's rounding may add: the precision's epsilon times the magnitude the output
carries (its own values and the values feeding it, see `scales`), times a small growth factor measured on real
models. A tolerance taken from the output's range alone collapses when the output is nearly constant (a sigmoid
map of ~1e-8 computed from logits of ~20), and then a correct fp32 artifact fails against itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from enginefarm.cache import precision_table
from enginefarm.cache.precision_table import QUANTIZED_EPSILON

from .recipe import ValidateSpec
from .samples import fit, image_layout, image_like, noise
from .scales import feeding_tensors, is_quantized, session_with_extra_outputs

# Bump when the gate's rules or defaults change: stored verdicts reached under another version are re-checked.
GATE_VERSION = "2"
# Each precision's default limits (min_cosine, max_abs_rel: range-relative, for outputs that carry a signal) and its
# epsilon are rows of the precision table (cache/precision_table.py), with what they were measured on.
# A correct artifact's max-abs error, in units of epsilon × carried magnitude. Measured on eight real models (OCR
# detector and recognizers, a quantized recognizer, two YOLO detectors, a VAD with control flow) on ONNX Runtime and
# OpenVINO: at most 4.3 (fp16) and 7.4 (8-bit quantized, 40 inputs, OpenVINO and ONNX Runtime fp16 vs ONNX Runtime).
NOISE_GROWTH = 16.0
# Its relative RMS error, in the same units, sets the loosest default min_cosine: 1 - (16 eps)^2 / 2. Only quantized
# graphs get below the table's defaults by it (0.992): OpenVINO rounds 8-bit steps differently from ONNX Runtime,
# measured 1 - cos up to 2.9e-3 on rendered text lines, the recognizer's argmax agreeing on 97-100% of its steps.
COSINE_GROWTH = 16.0
# fp32 kernels differ from the reference by summation order; cancellation makes that ~30 fp32 epsilons of the carried
# magnitude on the real models measured (3.3e-6): the floor below which no fp32 artifact is judged.
ACCUMULATION_EPSILON = 2.0**-16
# Below this many rounding units of spread, an output's direction is noise (cosine is not judged).
SIGNAL_UNITS = 4.0


@dataclass(frozen=True)
class Thresholds:
    min_cosine: float
    max_abs_rel: float
    # The rounding unit of what the artifact computes with.
    epsilon: float = precision_table.get(precision_table.REFERENCE).epsilon
    noise_floor: float | None = None  # an absolute noise floor from the recipe, instead of the computed one

    @classmethod
    def for_job(cls, precision: str, spec: ValidateSpec, *, quantized: bool = False) -> Thresholds:
        base = precision_table.get(precision)
        epsilon = max(base.epsilon, QUANTIZED_EPSILON if quantized else 0.0)
        if quantized and base.epsilon >= QUANTIZED_EPSILON:
            # Rounding as coarse as an 8-bit step adds to the 8-bit steps: bf16 on the quantized recognizer measured
            # 16.8 units of 2^-7 where fp32 showed 3.9.
            epsilon = base.epsilon + QUANTIZED_EPSILON
        min_cosine = min(base.min_cosine, 1 - (COSINE_GROWTH * epsilon) ** 2 / 2)
        return cls(
            spec.min_cosine if spec.min_cosine is not None else round(min_cosine, 6),
            spec.max_abs_rel if spec.max_abs_rel is not None else base.max_abs_rel,
            epsilon,
            spec.noise_floor,
        )

    def unit(self, scale: float) -> float:
        """One rounding unit of an output that carries magnitude `scale`."""
        if self.noise_floor is not None:
            return self.noise_floor / NOISE_GROWTH
        return max(self.epsilon, ACCUMULATION_EPSILON) * scale

    def floor(self, scale: float) -> float:
        """The largest error a correct artifact may show on an output that carries magnitude `scale`."""
        return NOISE_GROWTH * self.unit(scale)

    def to_dict(self) -> dict[str, Any]:
        return {
            "min_cosine": self.min_cosine,
            "max_abs_rel": self.max_abs_rel,
            "epsilon": self.epsilon,
            "noise_floor": self.noise_floor if self.noise_floor is not None else "computed",
        }


@dataclass
class Reference:
    """The fp32 ONNX Runtime outputs of one case, and the magnitude each output carries."""

    outputs: dict[str, np.ndarray]
    scales: dict[str, float] = field(default_factory=dict)


def sample_cases(
    inputs, profile: dict[str, dict[str, list[int]]], spec: ValidateSpec
) -> list[tuple[str, dict[str, np.ndarray]]]:
    """Seeded inputs at the profile's min, opt and max shapes: image-like for image inputs, noise for the rest.
    Models with image inputs also get a noise case at opt (other activations), and every model the recipe's samples."""
    cases = []
    any_image = False
    for index, corner in enumerate(("min", "opt", "max")):
        feeds, images = _feeds(inputs, profile, spec, corner, np.random.default_rng(spec.seed + index), images=True)
        cases.append((corner, feeds))
        any_image = any_image or images
    if any_image:
        feeds, _ = _feeds(inputs, profile, spec, "opt", np.random.default_rng(spec.seed + 3), images=False)
        cases.append(("opt-noise", feeds))
    if spec.samples is not None:
        with np.load(spec.samples, allow_pickle=False) as data:
            cases.append(
                ("samples", {t.name: np.asarray(data[t.name]).astype(t.dtype) for t in inputs if t.name in data})
            )
    return cases


def _feeds(
    inputs, profile, spec: ValidateSpec, corner: str, rng: np.random.Generator, *, images: bool
) -> tuple[dict[str, np.ndarray], bool]:
    feeds, used_image = {}, False
    for tensor in inputs:
        shape = profile[tensor.name][corner]
        sample = spec.inputs.get(tensor.name)
        if sample is not None and sample.file is not None:
            feeds[tensor.name] = fit(np.load(sample.file, allow_pickle=False), shape, tensor.dtype)
            continue
        low, high = (sample.low, sample.high) if sample else (-1.0, 1.0)
        layout = image_layout(shape, tensor.dtype) if images else None
        if layout is not None:
            feeds[tensor.name] = image_like(shape, layout, low, high, rng).astype(tensor.dtype)
            used_image = True
        else:
            feeds[tensor.name] = noise(shape, tensor.dtype, low, high, rng)
    return feeds, used_image


def model_traits(model_path: Path) -> tuple[bool, dict[str, list[str]]]:
    """(whether the graph quantizes, the tensors feeding each output), from the graph alone."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    return is_quantized(model), feeding_tensors(model)


def reference_outputs(model_path: Path, cases, feeding: dict[str, list[str]] | None = None) -> list[Reference]:
    """ONNX Runtime fp32 on the original model, plus the magnitude of the tensors feeding each output."""
    import onnxruntime as ort

    from enginefarm.sessions.onnxruntime import shrinking_run_options

    if feeding is None:
        feeding = model_traits(model_path)[1]
    extra = sorted({name for names in feeding.values() for name in names})

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = session_with_extra_outputs(model_path, extra, options)
    names = [o.name for o in session.get_outputs()]
    # the cases grow to the profile's largest: an arena kept from the smaller ones adds to the largest one's
    # (a narrow SD 1.5-layout UNet at batch 2 x 512 px after two smaller cases: 3.46 GB, 2.22 GB with shrinkage)
    run_options = shrinking_run_options(ort)
    split = batch_axis_everywhere(session, list(feeding))
    references = []
    for _, feeds in cases:
        # A batched case runs an item at a time where every input and output leads with the same batch axis: the
        # items are independent, and the unfused attention's score matrices are then one item's, not the batch's
        # (SD 1.5's UNet at batch 2 x 768 px: 5.4 GB a matrix, 2.7 item by item).
        batch = _batch(feeds) if split else 1
        parts = [_item(feeds, i) for i in range(batch)] if batch > 1 else [feeds]
        runs = [dict(zip(names, session.run(names, part, run_options), strict=True)) for part in parts]
        outputs = {
            name: np.concatenate([run[name] for run in runs]) if len(runs) > 1 else runs[0][name] for name in feeding
        }
        scales = {
            name: max(_magnitude(run[t]) for run in runs for t in [name, *feeding[name]] if t in run)
            for name in feeding
        }
        references.append(Reference(outputs, scales))
    return references


def batch_axis_everywhere(session, outputs: list[str]) -> bool:
    """Whether every input and each of `outputs` of an ONNX Runtime session leads with one and the same named axis
    (the batch), so that a batch can run an item at a time and be put back together."""
    declared = {o.name: o for o in session.get_outputs()}
    tensors = [*session.get_inputs(), *(declared[name] for name in outputs if name in declared)]
    leading = {t.shape[0] if t.shape else None for t in tensors}
    return (
        len(tensors) == len(session.get_inputs()) + len(outputs)
        and len(leading) == 1
        and isinstance(leading.pop(), str)
    )


def _batch(feeds: dict[str, np.ndarray]) -> int:
    """The leading size all `feeds` share (1 when they do not, or one is a scalar)."""
    sizes = {int(np.shape(value)[0]) if np.ndim(value) else 0 for value in feeds.values()}
    return sizes.pop() if len(sizes) == 1 and 0 not in sizes else 1


def _item(feeds: dict[str, np.ndarray], index: int) -> dict[str, np.ndarray]:
    return {name: value[index : index + 1] for name, value in feeds.items()}


def _magnitude(value) -> float:
    array = np.asarray(value)
    if array.size == 0 or not np.issubdtype(array.dtype, np.number):
        return 0.0
    finite = np.abs(array[np.isfinite(array)]) if np.issubdtype(array.dtype, np.floating) else np.abs(array)
    return float(finite.max()) if finite.size else 0.0


def compare(
    reference: np.ndarray, actual: np.ndarray, limits: Thresholds, scale: float | None = None
) -> dict[str, Any]:
    """Judge one output. `scale`: the magnitude it carries (default: its own largest value)."""
    ref = np.asarray(reference, dtype=np.float64).ravel()
    got = np.asarray(actual, dtype=np.float64).ravel()
    if ref.shape != got.shape:
        return {
            "passed": False,
            "decided_by": "shape",
            "reason": f"shape {np.shape(actual)} != reference {np.shape(reference)}",
        }
    if not np.all(np.isfinite(got)):
        return {"passed": False, "decided_by": "finite", "reason": "output has NaN or inf"}
    if ref.size == 0:
        return {"passed": True, "decided_by": "empty output", "reason": ""}
    scale = max(float(np.max(np.abs(ref))), scale or 0.0)
    floor = limits.floor(scale)
    value_range = float(ref.max() - ref.min())
    error = np.abs(ref - got)
    max_abs = float(error.max())
    rms_error = float(np.sqrt(np.mean(error**2)))
    tolerance = max(limits.max_abs_rel * value_range, floor)
    norms = float(np.linalg.norm(ref) * np.linalg.norm(got))
    cosine = float(np.dot(ref, got) / norms) if norms > 0 else (1.0 if max_abs == 0 else 0.0)
    peak = max(value_range, floor)
    psnr = 999.0 if rms_error == 0 else min(999.0, 20 * np.log10(peak / rms_error))
    result = {
        "cosine": round(cosine, 9),
        "max_abs": max_abs,
        "rms_error": rms_error,
        "range": value_range,
        "scale": scale,
        "noise_floor": floor,
        "tolerance": tolerance,
        "psnr": round(float(psnr), 2),
    }
    result.update(_argmax_agreement(reference, actual))
    # A reference that varies by no more than a few rounding units of its magnitude carries no direction to judge:
    # its cosine is noise, and max-abs alone decides.
    within_noise = value_range <= SIGNAL_UNITS * limits.unit(scale)
    if cosine < limits.min_cosine and not within_noise:
        return {
            **result,
            "passed": False,
            "decided_by": "cosine",
            "reason": f"cosine {cosine:.8f} < {limits.min_cosine}",
        }
    if max_abs > tolerance:
        limit = (
            f"noise floor {floor:.3g}"
            if floor >= limits.max_abs_rel * value_range
            else f"{limits.max_abs_rel:g} × range {value_range:.3g}"
        )
        return {**result, "passed": False, "decided_by": "max_abs", "reason": f"max_abs {max_abs:.3g} > {limit}"}
    decided = (
        "max_abs (cosine ignored: the reference varies less than its rounding noise)"
        if within_noise
        else "cosine and max_abs"
    )
    return {**result, "passed": True, "decided_by": decided, "reason": ""}


def _argmax_agreement(reference: np.ndarray, actual: np.ndarray) -> dict[str, float]:
    """For class scores (2-D or 3-D, classes last): how often both pick the same class. Reported, never decides."""
    ref, got = np.asarray(reference), np.asarray(actual)
    if ref.ndim not in (2, 3) or ref.shape[-1] < 2 or ref.shape != got.shape:
        return {}
    return {"argmax_agreement": round(float(np.mean(ref.argmax(-1) == got.argmax(-1))), 6)}


def validate(session, cases, references: Sequence[Reference], limits: Thresholds) -> dict[str, Any]:
    checks = []
    for (corner, feeds), reference in zip(cases, references, strict=True):
        actual = session.run(feeds)
        for name, ref in reference.outputs.items():
            if name not in actual:
                checks.append(
                    {
                        "case": corner,
                        "output": name,
                        "passed": False,
                        "decided_by": "missing",
                        "reason": f"artifact has no output {name!r}",
                    }
                )
                continue
            checks.append(
                {
                    "case": corner,
                    "output": name,
                    "shape": list(np.shape(ref)),
                    **compare(ref, actual[name], limits, reference.scales.get(name)),
                }
            )
        del actual
    failed = [c for c in checks if not c["passed"]]
    scored = [c for c in checks if "cosine" in c]
    return {
        "passed": not failed,
        "thresholds": limits.to_dict(),
        "compute_precision": getattr(session, "compute_precision", "unknown"),
        "min_cosine": min((c["cosine"] for c in scored), default=None),
        "min_psnr": min((c["psnr"] for c in scored), default=None),
        "max_abs_rel_seen": max((c["max_abs"] / c["range"] for c in scored if c["range"] > 0), default=None),
        "checks": checks,
        "failure": "; ".join(f"{c['output']}@{c['case']}: {c['reason']}" for c in failed),
        "hint": _hint(failed, limits),
    }


def _hint(failed: list[dict[str, Any]], limits: Thresholds) -> str:
    """The knobs, with the numbers that would have passed: the user decides whether that difference is acceptable."""
    if not failed:
        return ""
    scored = [c for c in failed if "cosine" in c]
    knobs = []
    cosines = [c["cosine"] for c in scored if c["decided_by"] == "cosine"]
    if cosines:
        knobs.append(f"min_cosine = {_round_down(min(cosines))} (now {limits.min_cosine}; seen {min(cosines):.8f})")
    ratios = [c["max_abs"] / c["range"] for c in scored if c["decided_by"] == "max_abs" and c["range"] > 0]
    if ratios:
        knobs.append(
            f"max_abs_rel = {_round_up(max(ratios))} (now {limits.max_abs_rel:g}; seen {max(ratios):.3g} of the range)"
        )
    samples = (
        'if the inputs are unlike your data, give real ones: validate.samples = "samples.npz" (one array per input)'
    )
    if not knobs:
        overflow = any(c["decided_by"] == "finite" for c in failed)
        return (
            "the artifact computes NaN or inf: a value overflows its precision; keep the op that overflows fp32 with "
            'fp16_keep_fp32 = ["OpType"] in the component, or build fp32'
            if overflow
            else "the artifact does not produce the reference's outputs (names or shapes differ)"
        )
    return f"if that difference is acceptable, set {' or '.join(knobs)} in [components.NAME.validate]; {samples}"


def _round_down(value: float) -> str:
    for digits in range(2, 10):
        candidate = np.floor(value * 10**digits) / 10**digits
        if value - candidate < (1 - value) / 2:
            return f"{candidate:.{digits}f}"
    return f"{value:.9f}"


def _round_up(value: float) -> str:
    return f"{float(f'{value * 1.1:.2g}'):g}"
