"""Finding a checkpoint tensor's values among a model's initializers, for the weight map (`formats/weightmap.py`).

A match is exact: the same float32 bits, in the initializer's layout or transposed (2-D), shapes equal but for
size-1 axes. Hashing every value (and a transposed copy of every matrix) to look matches up would take minutes at
real size (T5-XXL: 60 GB to hash), so the lookup key is a fingerprint instead: the squeezed shape and SAMPLE values at
fixed positions, read from a memory map without touching the rest. Equal tensors always have equal fingerprints, so
the fingerprint only narrows the candidates; each candidate is then compared value for value, and only those equal in
full match. Comparisons run in chunks that stop at the first difference, and a transposed comparison goes tile by tile
(no transposed copy: numpy's element-by-element walk of a transposed matrix runs at a fifth of the speed).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

SAMPLE = 1024  # values per fingerprint: trained weights differ in the first few, equal-valued ones are compared anyway
ROWS = 1 << 20  # values compared at a time where both sides run along rows
HEAD = 64  # values of a matrix's first row compared before anything else
PROBE = 4096  # values compared next (a place that differs from its first values on costs no more)
TILE = 128  # rows × columns compared at a time where one side is transposed (fits the cache; measured fastest)
SMALL = 1 << 20  # bytes: initializers up to this size stay in memory once compared (all-ones norms meet many twins)
SMALL_TOTAL = 64 << 20


def squeezed(shape) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


@lru_cache(maxsize=256)
def _positions(size: int) -> np.ndarray:
    """Which values (C order) a tensor of `size` values is fingerprinted by: all of a small one, else SAMPLE spread
    evenly from the first to the last."""
    if size <= SAMPLE:
        return np.arange(size, dtype=np.int64)
    return np.arange(SAMPLE, dtype=np.int64) * (size - 1) // (SAMPLE - 1)


def _bits(values: np.ndarray) -> np.ndarray:
    """The values as float32 bit patterns: equal bits, as the stored weight has, not equal numbers (-0.0 is not 0.0)."""
    return _float32(values).view(np.uint32)


def _float32(values: np.ndarray) -> np.ndarray:
    return values if values.dtype == np.float32 else values.astype(np.float32)


def fingerprint(values: np.ndarray, transpose: bool = False) -> tuple:
    """The key of `values` (of `values.T` with `transpose`, a 2-D array, read in place by index arithmetic)."""
    pos = _positions(values.size)
    if transpose:
        rows = values.shape[0]
        return squeezed(values.shape[::-1]), _bits(values[pos % rows, pos // rows]).tobytes()
    return squeezed(values.shape), _bits(values.reshape(-1)[pos]).tobytes()


def equal(a: np.ndarray, b: np.ndarray, *, bits: bool) -> bool:
    """Whether `a` and `b` (the same shape, any strides) hold the same values (the same float32 bits, with `bits`;
    numpy's ==, as np.array_equal, without). Compared in chunks, a small one first, stopping at the first difference:
    a block search tries many places that differ from their first values on."""
    if a.shape != b.shape:
        return False
    convert = _bits if bits else _float32
    same = lambda x, y: np.array_equal(convert(x), convert(y))  # noqa: E731
    if a.ndim == 2 and not same(a[:1, :HEAD], b[:1, :HEAD]):  # one page of each: most places differ at once
        return False
    if a.ndim != 2:
        a, b = a.reshape(-1), b.reshape(-1)  # a copy only for a strided N-D array, which no caller passes
        return all(same(a[s:e], b[s:e]) for s, e in _spans(a.size, PROBE, ROWS))
    if _along_rows(a) and _along_rows(b):
        width = max(1, a.shape[1])
        return all(same(a[s:e], b[s:e]) for s, e in _spans(a.shape[0], -(-PROBE // width), -(-ROWS // width)))
    return all(
        same(a[r : r + TILE, c : c + TILE], b[r : r + TILE, c : c + TILE])
        for r in range(0, a.shape[0], TILE)
        for c in range(0, a.shape[1], TILE)
    )


def _spans(total: int, first: int, step: int):
    start, size = 0, first
    while start < total:
        yield start, min(total, start + size)
        start, size = start + size, step


def _along_rows(a: np.ndarray) -> bool:
    return a.shape[1] <= 1 or a.strides[1] == a.itemsize


class Views:
    """The model's initializers as arrays mapped from their files (`Initializers.view`), so reading a few values
    reads a few pages. The last KEPT stay mapped (to_q, to_k and to_v come one after another and look in the same
    fused weights), and small ones stay in memory, up to SMALL_TOTAL bytes."""

    KEPT = 8

    def __init__(self, initializers) -> None:
        self._initializers = initializers
        self._recent: dict[str, np.ndarray] = {}
        self._small: dict[str, np.ndarray] = {}
        self._small_bytes = 0

    def get(self, name: str, keep: bool = True) -> np.ndarray:
        """The initializer `name`; with `keep`, among the recent ones (a block search), else mapped only for the
        caller (a candidate compared once: its pages are not held after)."""
        found = self._small.get(name)
        if found is None:
            found = self._recent.get(name)
        if found is None:
            found = self._initializers.view(name)
            if found.nbytes <= SMALL and self._small_bytes + found.nbytes <= SMALL_TOTAL:
                found = self._small[name] = np.array(found)
                self._small_bytes += found.nbytes
            elif keep:
                if len(self._recent) >= self.KEPT:
                    self._recent.pop(next(iter(self._recent)))
                self._recent[name] = found
        return found


class Index:
    """Every float initializer by fingerprint; `matches` confirms candidates in full."""

    def __init__(self, initializers) -> None:
        self.views = Views(initializers)
        self.shapes = initializers.shapes
        self._keys: dict[tuple, list[str]] = {}
        for name in self.shapes:
            self._keys.setdefault(fingerprint(initializers.view(name)), []).append(name)  # dropped: unmapped

    def matches(self, array: np.ndarray) -> list[tuple[str, bool]]:
        """The initializers holding exactly `array`'s values: (name, False) as is, then (name, True) transposed
        (2-D), each in the initializers' order."""
        found = [(name, False) for name in self._keys.get(fingerprint(array), []) if self._holds(name, array, False)]
        if array.ndim == 2:
            found += [
                (name, True) for name in self._keys.get(fingerprint(array, True), []) if self._holds(name, array, True)
            ]
        return found

    def _holds(self, name: str, array: np.ndarray, transpose: bool) -> bool:
        target = array.T if transpose else array
        if target.ndim != 2:
            target = target.reshape(-1)
        return equal(self.views.get(name, keep=False).reshape(target.shape), target, bits=True)


def blocks(array: np.ndarray, views: Views, shapes: dict) -> list[tuple[str, bool, tuple[int, int, int]]]:
    """Where `array` (1-D, or 2-D in torch layout) is one aligned block of a fused initializer, such as the
    [in, 3·out] MatMul weight onnxsim makes of to_q, to_k and to_v, or their concatenated bias. Blocks are views of
    the mapped initializer; a compare stops at its first differing chunk, so a block that differs costs one chunk."""
    if array.ndim not in (1, 2):
        return []
    layouts = [(array, False)] + ([(array.T, True)] if array.ndim == 2 else [])
    found = []
    for init, shape in shapes.items():
        if len(shape) != array.ndim or np.prod(shape) <= array.size:
            continue
        for part, transpose in layouts:
            for axis in range(len(shape)):
                other = [d for i, d in enumerate(shape) if i != axis]
                size = part.shape[axis]
                if other != [d for i, d in enumerate(part.shape) if i != axis] or shape[axis] % size:
                    continue
                whole = views.get(init)
                where = [slice(None)] * whole.ndim
                for start in range(0, whole.shape[axis], size):
                    where[axis] = slice(start, start + size)
                    if equal(whole[tuple(where)], part, bits=False):
                        found.append((init, transpose, (axis, start, start + size)))
    return found
