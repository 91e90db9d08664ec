"""Type checks for JSON that comes from a store (manifests, index entries): each names the field that is wrong,
so one bad object is reported and skipped instead of failing somewhere deep inside resolution or loading."""

from __future__ import annotations

import math
import re
from typing import Any

HEX64 = re.compile(r"[0-9a-f]{64}")


class FieldError(ValueError):
    """A field of store-side JSON has the wrong type or form. `field` is its dotted name."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def text(value: Any, field: str, *, pattern: re.Pattern | None = None, empty: bool = False) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise FieldError(field, f"must be a {'' if empty else 'non-empty '}string, got {_kind(value)}")
    if pattern is not None and not pattern.fullmatch(value):
        raise FieldError(field, f"{value[:80]!r} is not in the expected form")
    return value


def optional_text(value: Any, field: str) -> str | None:
    return None if value is None else text(value, field, empty=True)


def integer(value: Any, field: str, low: int = 0) -> int:
    if type(value) is not int or value < low:
        raise FieldError(
            field,
            f"must be an integer >= {low}, got {value!r}"
            if type(value) is int
            else f"must be an integer, got {_kind(value)}",
        )
    return value


def number(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise FieldError(
            field,
            f"must be a finite number, got {value!r}"
            if isinstance(value, float)
            else f"must be a number, got {_kind(value)}",
        )
    return value


def mapping(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise FieldError(field, f"must be an object, got {_kind(value)}")
    return value


def items(value: Any, field: str) -> list[Any]:
    if not isinstance(value, list):
        raise FieldError(field, f"must be a list, got {_kind(value)}")
    return value


def text_map(value: Any, field: str) -> dict[str, str]:
    for key, item in mapping(value, field).items():
        text(item, f"{field}.{key}", empty=True)
    return value


def _all_dims(value: Any) -> bool:
    """The common case, checked without building a field name per item (an index may hold 10^5 entries)."""
    return type(value) is list and all(type(item) is int and item >= 0 for item in value)


def dims(value: Any, field: str) -> list[int]:
    if _all_dims(value):
        return value
    for i, item in enumerate(items(value, field)):
        integer(item, f"{field}[{i}]")
    return value


def profile(value: Any, field: str) -> dict[str, dict[str, list[int]]]:
    """input name → {min, opt, max}: the bounds a session checks inputs against."""
    for name, bounds in mapping(value, field).items():
        if (
            type(bounds) is dict
            and _all_dims(bounds.get("min"))
            and _all_dims(bounds.get("opt"))
            and _all_dims(bounds.get("max"))
        ):
            pass  # well formed: only the ranks are left to compare
        else:
            for corner in ("min", "opt", "max"):
                dims(mapping(bounds, f"{field}.{name}").get(corner), f"{field}.{name}.{corner}")
        if not len(bounds["min"]) == len(bounds["opt"]) == len(bounds["max"]):
            raise FieldError(f"{field}.{name}", "min, opt and max differ in rank")
    return value
