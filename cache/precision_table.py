"""The precision table: every fact the product knows about a precision, in one place.

It lives in `cache`, the lowest layer, because all three layers ask it: recipes and the validation gate (builder),
the manifest's contract (cache), resolution's tie order and `load(precision=...)` (runner). It imports nothing but
the standard library, so the runtime may read it without onnx or numpy.

Which backends compute a precision is not a column here: each backend declares its own (`Backend.computes`), so
a backend added from outside the product (an entry point) needs no edit of this table. Adding a precision is one
row here plus the backends that build it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    name: str
    # Unit roundoff (machine epsilon) of what an artifact in this precision computes with: the validation gate's
    # noise floor and its loosest cosine follow from it (builder/validate.py).
    epsilon: float
    # The gate's default limits against the fp32 reference, measured on real models (see builder/validate.py).
    min_cosine: float
    max_abs_rel: float
    # Resolution's tie order: among artifacts equally fast, the lower wins (the more exact one).
    tie_order: int
    # The ONNX element type (onnx.TensorProto) of its float tensors, as the plain number: no onnx import.
    onnx_type: int
    bits: int  # the width of one stored float: weights take bits / 8 bytes each
    exported_by_default: bool = False  # `enginefarm export` builds it unless told otherwise

    @property
    def reduced(self) -> bool:
        """Narrower than the fp32 reference: its prepared ONNX and its weights are cast."""
        return self.bits < 32


# Ordered by tie order: the first is the reference every artifact is validated against.
TABLE: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision(
            "fp32",
            2.0**-23,
            min_cosine=0.9999,
            max_abs_rel=1e-3,
            tie_order=0,
            onnx_type=1,
            bits=32,
            exported_by_default=True,
        ),
        # fp16 artifacts of the real models measured stay within 0.9% of the range (cosine >= 0.99987); SD's VAE decoder
        # within 0.03%.
        Precision(
            "fp16",
            2.0**-10,
            min_cosine=0.999,
            max_abs_rel=0.02,
            tie_order=1,
            onnx_type=10,
            bits=16,
            exported_by_default=True,
        ),
        # bf16 (OpenVINO CPU, 8 bits of mantissa) within 4.8% of the range (the OCR direction classifier; SD VAE decoder
        # 0.6%, YOLOv8 1.8%), at most 7.3 rounding units; min_cosine is the gate's rule, 1 - (16 eps)^2 / 2 = 0.992.
        Precision("bf16", 2.0**-7, min_cosine=0.992, max_abs_rel=0.1, tie_order=2, onnx_type=16, bits=16),
    )
}
NAMES: tuple[str, ...] = tuple(TABLE)
REFERENCE = "fp32"  # what sources are exported in, what the gate's reference runs in, what every backend computes
# One step of an 8-bit range that spans both signs (2/255 of the magnitude): the epsilon of a quantized graph's
# activations, whatever precision the artifact computes its floats in.
QUANTIZED_EPSILON = 2.0**-7


def get(name: str) -> Precision:
    """The row of `name`; a KeyError names the known precisions (callers that take user input check `NAMES` first
    and raise a ConfigError with `hint()`)."""
    try:
        return TABLE[name]
    except KeyError:
        raise KeyError(f"unknown precision {name!r} (known: {', '.join(NAMES)})") from None


def hint() -> str:
    return f"use one of: {', '.join(NAMES)}"


def tie_order(name: str | None) -> int:
    """Resolution's tie order; a precision this version does not know (from a newer builder) sorts last."""
    row = TABLE.get(name or "")
    return row.tie_order if row is not None else len(TABLE)


def reduced(name: str) -> bool:
    return get(name).reduced
