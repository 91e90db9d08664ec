"""Custom weights and LoRA layers merged into a component's weights, by ONNX initializer (numpy only).

Every load with a LoRA merges again (only refit stacks are cached), so the common case is cheap: a weight that
only plain low-rank layers change (LoRA/LoCon without a Tucker mid or DoRA, on a whole initializer) is merged in
the initializer's own layout, straight from the artifact's stored values: base + A @ B in row chunks that stay in
the CPU's cache, A @ B being Σ strength · scale · up @ down laid out as the initializer is (down.T @ up.T for a
transposed Linear) with the coefficients folded into the small factor. No float32 copy of the base, no transposed
copies, no full-size temporaries, and the weights are shared out over the cores (numpy's matmul and ufuncs release
the GIL) (docs/benchmarks.md, "Measurements behind the code", has what it saves at SD 1.5 size). Everything else
(LoHa, LoKr, full diffs, DoRA, Tucker, a fused QKV block, a custom checkpoint's own tensors) takes the general
path: float32, the checkpoint's layout, one layer after another.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NoReturn

import numpy as np

from enginefarm.backends.base import Feature
from enginefarm.cache.manifest import Manifest
from enginefarm.errors import BackendUnavailable, IntegrityError, WeightsError
from enginefarm.formats.weightmap import Mapped, WeightMap

from .lora import LoraLayer

# Rows are merged a chunk at a time, the chunk's product small enough (m·n·k ≤ 2**18) that OpenBLAS computes it on
# the calling thread: above that it wakes its own threads, which spin against the merge's and cost 10× the CPU time
# (measured: 38 ms vs 401 ms for a 5120×1280 weight at rank 8). At rank 8 a chunk is 128 KiB of float32: in L2.
SINGLE_THREADED_PRODUCT = 1 << 18

Deltas = dict[str, list[tuple[LoraLayer, float]]]


def merged_weights(
    wmap: WeightMap,
    backend,
    artifact_dir: Path,
    manifest: Manifest,
    custom: dict[str, np.ndarray],
    loras: list[tuple[list[LoraLayer], float]],
    *,
    every: bool,
    stored: bool = False,
) -> dict[str, np.ndarray]:
    """New values by ONNX initializer (ONNX layout): each LoRA layer merged in stack order (W + strength · scale ·
    ΔW; DoRA rescales the sum), W being the custom tensor or the artifact's own. `every`: all weights the map
    covers, unchanged ones too. `stored`: low-rank merges keep the artifact's own dtype (fp16 stays fp16: the
    backend casts to it anyway), else every value is float32. A merge that overflows (in the dtype it is returned
    in) is refused before anything is compiled."""
    deltas: Deltas = {}
    for layers, strength in loras:
        for layer in layers if strength != 0 else ():
            deltas.setdefault(layer.target, []).append((layer, strength))
    touched = set(custom) | set(deltas)
    names = sorted(set(wmap.mapped) if every else touched)
    fast = {n for n in names if n not in custom and _low_rank(wmap.mapped[n], deltas.get(n, ()))}
    # Whole initializers are read where the result needs them: the tensor's own base value, or the rest of a fused one.
    wanted = {wmap.mapped[n].initializer for n in names if n not in custom or wmap.mapped[n].block is not None}
    base = base_weights(backend, artifact_dir, manifest, sorted(wanted))
    out = _low_rank_merges(sorted(fast), wmap, base, deltas, stored)
    parts: dict[str, list] = {}
    for name in names:
        if name in fast:
            continue
        m = wmap.mapped[name]
        value = np.array(custom[name] if name in custom else m.from_onnx(base[m.initializer]), dtype=np.float32)
        for layer, strength in deltas.get(name, ()):
            value = layer.apply(value, strength)
        if name in deltas and not np.isfinite(value).all():
            _overflow(name, deltas)
        parts.setdefault(m.initializer, []).append((m, m.to_onnx(value)))
    for init, items in parts.items():
        if items[0][0].block is None:
            out[init] = items[0][1]
            continue
        whole = np.array(base[init], dtype=np.float32).reshape(items[0][0].onnx_shape)
        for m, part in items:
            m.write(whole, part)
        out[init] = whole
    return out


def _overflow(name: str, deltas: Deltas) -> NoReturn:
    files = ", ".join(sorted({str(layer.source) for layer, _ in deltas[name]}))
    raise WeightsError(
        f"{files}: merging into {name} gives Inf or NaN",
        hint="lower the strength; the LoRA's values are too large for this weight",
    )


def _low_rank(m: Mapped, items) -> bool:
    """Whether every change to this weight is a plain up @ down on the whole initializer."""
    return bool(items) and m.block is None and all(layer.rows is None and layer.layer.low_rank for layer, _ in items)


def _factors(m: Mapped, items) -> tuple[np.ndarray, np.ndarray]:
    """(A, B), float32 and C-ordered, with A @ B = Σ strength · scale · ΔW in the initializer's layout, 2-D:
    [out, in·k·k], or [in, out] for a transposed Linear. The layers' ranks are stacked: a stack of LoRAs is one
    product."""
    lefts, rights = [], []
    for layer, strength in items:
        t, rank = layer.layer.t, layer.layer.rank
        coefficient = np.float32(strength) * np.float32(layer.layer.scale)
        up, down = t["up"].reshape(-1, rank), t["down"].reshape(rank, -1) * coefficient  # the small factor takes it
        lefts.append(down.T if m.transpose else up)
        rights.append(up.T if m.transpose else down)
    a, b = np.concatenate(lefts, axis=1), np.concatenate(rights, axis=0)
    return np.ascontiguousarray(a, dtype=np.float32), np.ascontiguousarray(b, dtype=np.float32)


def _low_rank_merges(
    names: list[str], wmap: WeightMap, base: dict[str, np.ndarray], deltas: Deltas, stored: bool
) -> dict[str, np.ndarray]:
    def one(name: str) -> tuple[str, np.ndarray]:
        m = wmap.mapped[name]
        merged = _merge_chunked(base[m.initializer], *_factors(m, deltas[name]), None if stored else np.float32)
        if merged is None:
            _overflow(name, deltas)
        return m.initializer, merged.reshape(m.onnx_shape)

    if len(names) < 2:
        return dict(map(one, names))
    with ThreadPoolExecutor(min(len(names), os.cpu_count() or 1), thread_name_prefix="lora-merge") as pool:
        return dict(pool.map(one, names))


def _merge_chunked(stored: np.ndarray, a: np.ndarray, b: np.ndarray, dtype) -> np.ndarray | None:
    """stored + a @ b (stored: [rows, cols] in any float dtype, read once, a chunk of rows at a time), in `dtype`
    (None: stored's own), computed in float32; None where a value would not be finite in the result's dtype.
    Overflow is caught without a pass of its own: the factors bound the product (|a @ b| ≤ |a| @ max|b|), and the
    floating-point flags trap an add or a cast that overflows (a NaN needs an Inf first; the factors are finite)."""
    rows, cols = a.shape[0], b.shape[1]
    with np.errstate(over="ignore"):
        if not np.isfinite(np.abs(a) @ np.abs(b).max(axis=1)).all():
            return None
    src = np.asarray(stored).reshape(rows, cols)
    out = np.empty((rows, cols), dtype or src.dtype)
    step = max(1, SINGLE_THREADED_PRODUCT // (cols * a.shape[1]))
    buffer = np.empty((step, cols), np.float32)
    try:
        with np.errstate(over="raise", invalid="raise"):  # per thread: workers do not inherit the caller's
            for start in range(0, rows, step):
                stop = min(rows, start + step)
                chunk = buffer[: stop - start]
                np.matmul(a[start:stop], b, out=chunk)
                np.add(chunk, src[start:stop], out=chunk)
                out[start:stop] = chunk
    except FloatingPointError:
        return None
    return out


def base_weights(backend, artifact_dir: Path, manifest: Manifest, names: list[str]) -> dict[str, np.ndarray]:
    """The artifact's own values of these initializers, in the dtype it stores them (ONNX layout)."""
    if not names:
        return {}
    if backend.has(Feature.PATCH_WEIGHTS):
        found = backend.read_weights(artifact_dir, manifest, names)
    else:  # refit-only backends that ship the ONNX beside the engine (weight-stripped engines)
        onnx_file = next((f for f in manifest.files if f.path.endswith(".onnx")), None)
        if onnx_file is None:
            raise BackendUnavailable(
                f"{manifest.target} artifacts hold no readable base weights", hint="use another target (--target)"
            )
        from enginefarm.backends import onnx_weights

        found = onnx_weights.read(Path(artifact_dir) / onnx_file.path, names)
    missing = sorted(set(names) - set(found))
    if missing:
        raise IntegrityError(
            f"{manifest.ref} [{manifest.build_key[:12]}]: weights {missing[:5]} named by its map are missing"
        )
    return found
