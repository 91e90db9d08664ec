"""The session an app holds: checks inputs against the artifact's profile, runs, and explains its choice."""

from __future__ import annotations

from typing import Any

import numpy as np

from enginefarm.cache.manifest import Manifest
from enginefarm.errors import EnginefarmError


class InputError(EnginefarmError, ValueError):
    """Inputs that do not fit the artifact: a missing name, the wrong rank, or a shape outside the profile."""


class Session:
    def __init__(self, backend_session: Any, manifest: Manifest, explanation: str) -> None:
        self._session = backend_session
        self.artifact = manifest
        self._explanation = explanation
        self._inputs = {t["name"]: t for t in manifest.io.get("inputs", [])}

    @property
    def input_names(self) -> list[str]:
        return list(self._inputs) or list(self._session.input_names)

    @property
    def output_names(self) -> list[str]:
        return list(self._session.output_names)

    @property
    def compute_precision(self) -> str:
        return getattr(self._session, "compute_precision", "unknown")

    def explain(self) -> str:
        return self._explanation + f"\nruns in {self.compute_precision} ({self.artifact.target}, {self.artifact.precision} artifact)"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._session.run(self._checked(feeds))

    def _checked(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ref = self.artifact.ref
        missing = [n for n in self.input_names if n not in feeds]
        unknown = [n for n in feeds if n not in self.input_names]
        if missing or unknown:
            parts = ([f"missing {missing}"] if missing else []) + ([f"unknown {unknown}"] if unknown else [])
            raise InputError(f"{ref}: inputs {', '.join(parts)}", hint=f"inputs are: {', '.join(self.input_names)}")
        out = {}
        for name, value in feeds.items():
            array = np.asarray(value)
            info = self._inputs.get(name)
            if info is not None:
                array = self._cast(ref, name, array, info["dtype"])
            bounds = self.artifact.profile.get(name)
            if bounds is not None:
                self._check_shape(ref, name, array.shape, bounds)
            out[name] = np.ascontiguousarray(array)
        return out

    @staticmethod
    def _cast(ref: str, name: str, array: np.ndarray, dtype: str) -> np.ndarray:
        if array.dtype == np.dtype(dtype):
            return array
        if np.can_cast(array.dtype, dtype, casting="same_kind"):
            return array.astype(dtype)
        raise InputError(f"{ref}: input {name!r} is {array.dtype}, the model takes {dtype}",
                         hint=f"pass {dtype}; other dtypes are converted only within their kind or from a simpler one "
                              "(float64 -> float32, integers or bool -> float)")

    @staticmethod
    def _check_shape(ref: str, name: str, shape: tuple[int, ...], bounds: dict[str, list[int]]) -> None:
        lo, hi = bounds["min"], bounds["max"]
        if len(shape) != len(lo) or any(s < a or s > b for s, a, b in zip(shape, lo, hi)):
            raise InputError(
                f"{ref}: input {name!r} has shape {list(shape)}, outside the artifact's profile {lo} .. {hi}",
                hint="use a shape inside the profile, or add a profile that covers it to the recipe",
            )
