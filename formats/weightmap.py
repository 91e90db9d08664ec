"""The weight map: which ONNX initializer holds each tensor of a component's checkpoint, and in which layout.

ONNX exports rename and transpose weights (`nn.Linear` becomes MatMul over an anonymous, transposed
`onnx::MatMul_123`), so names cannot be trusted. The map is derived by matching contents: a checkpoint tensor
maps to the initializer that holds exactly its values, as is or transposed (2-D), or to one aligned block of a
fused initializer (onnxsim merges parallel MatMuls such as to_q/to_k/to_v). Anything that matches nothing,
or more than one way, is recorded as unmatched with the reason; nothing is guessed. A name shared by a tensor
and an initializer with the same values only breaks ties (all-ones norms, zero biases).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from enginefarm.cache.manifest import Manifest
from enginefarm.errors import IntegrityError

from .safetensors_io import FLOATS, SafeTensors, TensorReader

log = logging.getLogger(__name__)

MAP_FILE = "weights.map.json"
MAP_FORMAT = 1
TEXT_MODEL = "text_model."  # transformers 4's CLIP prefix, absent in transformers 5 (see WeightMap.own_name)


@dataclass(frozen=True)
class Mapped:
    initializer: str
    transpose: bool  # the initializer holds the checkpoint tensor transposed (2-D)
    shape: tuple[int, ...]  # in the checkpoint's layout
    onnx_shape: tuple[int, ...]  # the whole initializer's; may differ by size-1 axes (GroupNorm's [C] as [C, 1, 1])
    block: tuple[int, int, int] | None = None  # (axis, start, stop): one block of a fused initializer (QKV)

    @property
    def part_shape(self) -> tuple[int, ...]:
        if self.block is None:
            return self.onnx_shape
        axis, start, stop = self.block
        return tuple(stop - start if i == axis else d for i, d in enumerate(self.onnx_shape))

    def _where(self) -> tuple[slice, ...]:
        """Where in the initializer this tensor lies: its block of a fused one, or all of it."""
        if self.block is None:
            return tuple(slice(None) for _ in self.onnx_shape)
        axis, start, stop = self.block
        return tuple(slice(start, stop) if i == axis else slice(None) for i in range(len(self.onnx_shape)))

    def to_onnx(self, value: np.ndarray) -> np.ndarray:
        """The checkpoint tensor in the initializer's layout (its block of it, for a fused initializer)."""
        return np.ascontiguousarray((value.T if self.transpose else value).reshape(self.part_shape), dtype=np.float32)

    def from_onnx(self, whole: np.ndarray) -> np.ndarray:
        value = np.asarray(whole, dtype=np.float32)
        if self.block is not None:
            value = value.reshape(self.onnx_shape)[self._where()]
        return value.reshape(self.shape[::-1]).T if self.transpose else value.reshape(self.shape)

    def write(self, whole: np.ndarray, part: np.ndarray) -> None:
        whole[self._where()] = part


def _block(raw) -> tuple[int, int, int] | None:
    """A stored block, (axis, start, stop); anything but three numbers is a damaged map (ValueError), refused as it
    is read rather than when a merge first unpacks it."""
    if not raw:
        return None
    axis, start, stop = (int(d) for d in raw)
    return axis, start, stop


@dataclass
class WeightMap:
    checkpoint_sha256: str
    mapped: dict[str, Mapped] = field(default_factory=dict)
    unmatched: dict[str, str] = field(default_factory=dict)  # checkpoint name → why it has no initializer
    # unmatched name → digests of its base values as stored in F32, F16 and BF16 (or raw, for non-floats): a custom
    # checkpoint may repeat such a tensor, in any of those precisions, only unchanged
    digests: dict[str, dict[str, str]] = field(default_factory=dict)

    def to_json(self) -> bytes:
        body = {
            "format": MAP_FORMAT,
            "checkpoint_sha256": self.checkpoint_sha256,
            "mapped": {
                k: {
                    "initializer": m.initializer,
                    "transpose": m.transpose,
                    "shape": list(m.shape),
                    "onnx_shape": list(m.onnx_shape),
                    "block": list(m.block) if m.block else None,
                }
                for k, m in sorted(self.mapped.items())
            },
            "unmatched": {k: {"why": v, "digests": self.digests.get(k, {})} for k, v in sorted(self.unmatched.items())},
        }
        return json.dumps(body, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> WeightMap:
        try:
            data = json.loads(raw)
            if data.get("format") != MAP_FORMAT:
                raise ValueError(f"format {data.get('format')!r}")
            mapped = {
                str(k): Mapped(
                    str(v["initializer"]),
                    bool(v["transpose"]),
                    tuple(int(d) for d in v["shape"]),
                    tuple(int(d) for d in v["onnx_shape"]),
                    _block(v["block"]),
                )
                for k, v in data["mapped"].items()
            }
            unmatched = {str(k): str(v["why"]) for k, v in data["unmatched"].items()}
            digests = {str(k): {str(a): str(b) for a, b in v["digests"].items()} for k, v in data["unmatched"].items()}
            return cls(str(data["checkpoint_sha256"]), mapped, unmatched, digests)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise IntegrityError(
                f"weight map is malformed ({exc})", hint="rebuild the artifact with this enginefarm"
            ) from None

    @property
    def names(self) -> set[str]:
        """Every tensor name of the base checkpoint."""
        return set(self.mapped) | set(self.unmatched)

    def own_name(self, name: str) -> str | None:
        """The base checkpoint's name for a custom checkpoint's tensor `name`, or None. A CLIP text encoder's state dict
        is `text_model.…` in transformers 4 and in the files model sites ship, and has no such prefix in transformers 5
        (which reads both): either spelling maps, whichever the base was exported with."""
        known = lambda n: n in self.mapped or n in self.unmatched  # noqa: E731  (called per tensor: no set built)
        if known(name):
            return name
        other = name.removeprefix(TEXT_MODEL) if name.startswith(TEXT_MODEL) else TEXT_MODEL + name
        return other if known(other) else None


def _rounded(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "F16":
        return values.astype(np.float16).astype(np.float32)
    if dtype == "BF16":  # round to nearest even, as torch does
        bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return rounded.astype(np.uint32).view(np.float32)
    return values.astype(np.float32)


# Values rounded and hashed per chunk: rounding a whole tensor at once held ~8 bytes of temporaries per value, 6 GB
# beside T5-XXL's 131 M-value embedding (an unmatched tied copy), more than its job's whole weight-map stage needs.
CHUNK = 1 << 22


def _digest(tag: str, shape, data: np.ndarray, rounding: str = "") -> str:
    digest = hashlib.sha256(f"{tag}{list(shape)}".encode())
    flat = np.ascontiguousarray(data).reshape(-1)
    for start in range(0, flat.size, CHUNK):
        part = flat[start : start + CHUNK]
        digest.update(np.ascontiguousarray(_rounded(part, rounding) if rounding else part).tobytes())
    return digest.hexdigest()


def base_digests(ckpt: SafeTensors, name: str) -> dict[str, str]:
    entry = ckpt.entries[name]
    if entry.dtype not in FLOATS:
        return {"raw": _digest(entry.dtype, entry.shape, ckpt.raw(name, alone=True))}
    values = ckpt.array(name, alone=True)
    return {kind: _digest("float", entry.shape, values, kind) for kind in ("F32", "F16", "BF16")}


def same_as_base(ckpt: TensorReader, name: str, digests: dict[str, str]) -> bool:
    """Whether `name` in `ckpt` holds the base's values, at the precision `ckpt` stores it in."""
    entry = ckpt.entries[name]
    if entry.dtype not in FLOATS:
        return digests.get("raw") == _digest(entry.dtype, entry.shape, ckpt.raw(name))
    kind = entry.dtype if entry.dtype in ("F16", "BF16") else "F32"
    return digests.get(kind) == _digest("float", entry.shape, ckpt.array(name), kind)


def derive(checkpoint: Path, checkpoint_sha256: str, onnx_path: Path) -> WeightMap:
    """Match every tensor of `checkpoint` to the initializers of the (fp32) ONNX model at `onnx_path`."""
    from .onnx_data import Initializers
    from .weightmatch import Index, blocks

    # One initializer mapped at a time (but the last few a block search read, and small ones): holding the model and
    # a float32 copy of its matrices peaked at 2.4x the SD 1.5 UNet's weights (and would be 25 GB for SDXL's).
    initializers = Initializers(onnx_path)
    index = Index(initializers)  # by fingerprint; each candidate is compared in full
    shapes = initializers.shapes
    ckpt = SafeTensors(checkpoint)
    result = WeightMap(checkpoint_sha256)
    candidates: dict[str, list[tuple[str, bool]]] = {}
    for name in ckpt.names:
        entry = ckpt.entries[name]
        if entry.dtype not in FLOATS:
            result.unmatched[name] = f"not a float tensor ({entry.dtype})"
            continue
        # float32 as stored is compared where it lies in the file, other floats widened (one tensor's copy); each
        # tensor mapped alone, so its pages are let go with it
        array = ckpt.raw(name, alone=True) if entry.dtype == "F32" else ckpt.array(name, alone=True)
        found = index.matches(array)
        if found:
            candidates[name] = found
        else:
            placed = blocks(array, index.views, shapes)
            if len(placed) == 1:
                init, transpose, block = placed[0]
                result.mapped[name] = Mapped(init, transpose, entry.shape, shapes[init], block)
            elif placed:
                result.unmatched[name] = (
                    f"ambiguous: a block of {', '.join(sorted({b[0] for b in placed}))} in {len(placed)} places"
                )
            else:
                result.unmatched[name] = (
                    "no initializer holds these values (folded into another constant, or unused by the graph)"
                )
    _drop_shared_blocks(result)

    # Ties are broken by name only where the initializer kept the checkpoint's own name, as is or under a dotted
    # prefix (a wrapper module's `vae.decoder.conv_in.bias` for `decoder.conv_in.bias`); longest names first.
    taken: set[str] = set()
    for name in sorted(candidates, key=len, reverse=True):
        named = [i for i, t in candidates[name] if not t and (i == name or i.endswith("." + name)) and i not in taken]
        if len(named) == 1:
            result.mapped[name] = Mapped(named[0], False, ckpt.entries[name].shape, shapes[named[0]])
            taken.add(named[0])
    claims: dict[str, list[str]] = {}
    for name, found in candidates.items():
        if name not in result.mapped:
            candidates[name] = [(i, t) for i, t in found if i not in taken]
            for init in {i for i, _ in candidates[name]}:
                claims.setdefault(init, []).append(name)
            if found and not candidates[name]:
                result.unmatched[name] = (
                    f"its values are held only by {', '.join(sorted({i for i, _ in found}))}, which kept another "
                    "tensor's name"
                )
    for name, found in candidates.items():
        if name in result.mapped or not found:
            continue
        if len(found) == 1 and claims[found[0][0]] == [name]:
            result.mapped[name] = Mapped(found[0][0], found[0][1], ckpt.entries[name].shape, shapes[found[0][0]])
            continue
        others = sorted({o for i, _ in found for o in claims[i] if o != name})
        why = [f"matches {', '.join(f'{i}' + (' (transposed)' if t else '') for i, t in found)}"]
        if others:
            why.append(f"same values as {', '.join(others)}")
        result.unmatched[name] = "ambiguous: " + "; ".join(why)
    result.digests = {name: base_digests(ckpt, name) for name in result.unmatched}
    if result.unmatched:
        log.info("weight map: %d of %d checkpoint tensors unmatched", len(result.unmatched), len(ckpt.names))
    return result


def _drop_shared_blocks(result: WeightMap) -> None:
    """Two tensors in the same block (equal values, e.g. zero biases) cannot both be placed: neither is."""
    owners: dict[tuple, list[str]] = {}
    for name, m in result.mapped.items():
        if m.block is not None:
            owners.setdefault((m.initializer, m.block), []).append(name)
    for (init, _), names in owners.items():
        if len(names) > 1:
            for name in names:
                del result.mapped[name]
                result.unmatched[name] = (
                    f"ambiguous: the same block of {init} as {', '.join(n for n in names if n != name)}"
                )


def read_map(artifact_dir: Path, manifest: Manifest) -> WeightMap | None:
    entry = next((f for f in manifest.files if f.role == "map"), None)
    if entry is None:
        return None
    return WeightMap.from_json((Path(artifact_dir) / entry.path).read_bytes())
