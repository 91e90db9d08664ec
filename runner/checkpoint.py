"""A user's custom checkpoint read against a component's weight map: every tensor placed by the base's names, or
refused, all problems at once in one line, before anything is merged, compiled or cached."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from enginefarm.cache.manifest import Manifest
from enginefarm.errors import WeightsError
from enginefarm.formats.safetensors_io import FLOATS, SafeTensors, TensorReader
from enginefarm.formats.weightmap import WeightMap, same_as_base

ABSURD = 1e6  # no trained weight comes near this magnitude; a value past it is a broken file, and overflows at run time


def read_checkpoint(path: Path, wmap: WeightMap, manifest: Manifest) -> dict[str, np.ndarray]:
    """The custom checkpoint's tensors the map places, by the base's names (`WeightMap.own_name`). Everything wrong is
    raised at once, as one line, before anything is merged, compiled or cached. A whole-model file (single-file
    checkpoint, VAE) gives this component its own part, in diffusers names."""
    from enginefarm.weights.single_file import component_part

    part = component_part(
        path, manifest.component, manifest.ref, {n: m.shape for n, m in wmap.mapped.items()}, wmap.names
    )
    st: TensorReader = part if part is not None else SafeTensors(path)
    problems: list[str] = []
    foreign = 0
    out: dict[str, np.ndarray] = {}
    seen: dict[str, str] = {}  # the base's name → the first of the file's names placed there
    for name in st.names:
        entry, own = st.entries[name], wmap.own_name(name)
        if own is None:
            problems.append(f"{name}: not in the base checkpoint")
            foreign += 1
        elif own in seen:
            problems.append(f"{name}: the same tensor as {seen[own]}")
        elif own in wmap.mapped:
            want = wmap.mapped[own].shape
            if entry.shape != want:
                problems.append(f"{name}: shape {list(entry.shape)}, the base has {list(want)}")
                foreign += 1
            elif entry.dtype not in FLOATS:
                problems.append(f"{name}: dtype {entry.dtype}, the base is a float tensor")
            else:
                value = st.array(name)
                bad = _not_sane(value)
                if bad:
                    problems.append(f"{name}: {bad}")
                out[own] = value
        elif not same_as_base(st, name, wmap.digests.get(own, {})):
            # Nothing in the artifact holds it: fine while it equals the base, an error if it would be lost.
            problems.append(f"{name}: differs from the base, but {wmap.unmatched[own]}")
        if own is not None:
            seen.setdefault(own, name)
    if problems:
        raise _refusal(path, st, problems, foreign)
    return out


def _not_sane(value: np.ndarray) -> str | None:
    """Why a tensor would turn every output into NaN or Inf (non-finite values; magnitudes past ABSURD), or None."""
    finite = np.isfinite(value)
    if not finite.all():
        nan = int(np.isnan(value).sum())
        return f"{nan} NaN and {value.size - int(finite.sum()) - nan} infinite value(s)"
    peak = float(np.abs(value).max()) if value.size else 0.0
    return f"values up to {peak:.3g}, past any trained weight (±{ABSURD:g})" if peak > ABSURD else None


def _refusal(path: Path, st: TensorReader, problems: list[str], foreign: int) -> WeightsError:
    """One line: a file for another model says so, with one example; otherwise the problems, the first few shown."""
    if foreign * 2 > len(st.names):
        return WeightsError(
            f"{path}: not weights for this model: {foreign} of its {len(st.names)} tensor(s) have names or shapes the "
            f"model does not have (e.g. {problems[0]})",
            hint="a checkpoint of another family or component, or another layout: use the base model's own kind of "
            "file",
        )
    shown = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
    return WeightsError(
        f"{path}: {len(problems)} tensor(s) do not fit this model: {shown}",
        hint="custom weights must use the base checkpoint's names, shapes and float dtypes, with finite values",
    )
