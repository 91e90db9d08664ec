"""One LoRA layer (a module's tensors from a file) and the change it makes to a weight (numpy only): one class per
format, each knowing its tensors, their shapes, its rank and its ΔW.

Formats, by the suffixes of a module's tensors (W is the weight, all products in the weight's torch layout):
- `LoRA` (LoRA / LoCon)  `lora_down|lora_A` [r, in, (k, k)], `lora_up|lora_B` [out, r, (1, 1)], optional `lora_mid`
                 [r, r, k, k] (LoCon's Tucker form): ΔW = up @ down (through mid);
- `LoHa`         `hada_w1_a` [out, r] `hada_w1_b` [r, in·k·k] and the same for w2; with `hada_t1/t2` [r, r, k, k]
                 (Tucker, then w_a is [r, out] and w_b [r, in]): ΔW = (w1_a @ w1_b) ⊙ (w2_a @ w2_b);
- `LoKr`         `lokr_w1` [a, c] or `lokr_w1_a @ lokr_w1_b`; `lokr_w2` [b, d, (k, k)] or `lokr_w2_a @ lokr_w2_b` or
                 Tucker with `lokr_t2`: ΔW = w1 ⊗ w2 (Kronecker, out = a·b, in = c·d);
- `Full`         `diff`: ΔW itself (LyCORIS' full fine-tune module).
Scale: alpha / r where the file gives `alpha` and a rank (LoRA: down's rows; LoHa: w1_b's rows; LoKr: the rows of
the first decomposed factor, none when both factors are full, as LyCORIS does), else 1.
DoRA: `dora_scale` (kohya/LyCORIS) or `lora_magnitude_vector` (PEFT) is the magnitude m; the merged weight is
W' = m · V / ‖V‖ with V = W + strength · scale · ΔW, the norm taken per output row ([out, …] magnitudes, PEFT's and
LyCORIS' wd_on_out) or per input column (LyCORIS' [1, in, …]). The strength sits inside V, as PEFT's scaling does,
so diffusers' adapter weights and enginefarm's strengths mean the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

SUFFIXES = {
    "lora_down.weight": "down",
    "lora_A.weight": "down",
    "lora_up.weight": "up",
    "lora_B.weight": "up",
    "lora_mid.weight": "mid",
    "hada_w1_a": "w1a",
    "hada_w1_b": "w1b",
    "hada_w2_a": "w2a",
    "hada_w2_b": "w2b",
    "hada_t1": "t1",
    "hada_t2": "t2",
    "lokr_w1": "k1",
    "lokr_w1_a": "k1a",
    "lokr_w1_b": "k1b",
    "lokr_w2": "k2",
    "lokr_w2_a": "k2a",
    "lokr_w2_b": "k2b",
    "lokr_t2": "kt2",
    "diff": "diff",
    "alpha": "alpha",
    "dora_scale": "dora",
    "lora_magnitude_vector": "magnitude",
    "lora_magnitude_vector.weight": "magnitude",
}


@dataclass(frozen=True)
class Layer:
    """One module's LoRA: enough to compute its change to a weight of a given shape. A format's class says which
    tensors it takes (`MARKS`, `NEEDS`), how they agree (`problem`), its rank and its ΔW (`product`)."""

    kind: ClassVar[str]  # the format as messages name it
    MARKS: ClassVar[frozenset[str]]  # roles that make a module this format's
    NEEDS: ClassVar[frozenset[str]] = frozenset()  # roles a complete layer has

    module: str  # as the file names it
    part: str  # whose layer it is (PARTS), after the file's prefix
    local: str  # the module name without that prefix (dotted, or kohya's with '_' for '.')
    t: dict[str, np.ndarray] = field(repr=False)  # tensors by role (down, up, w1a, k1, ...), float32
    alpha: float | None = None

    @classmethod
    def lacks(cls, roles: set[str]) -> str:
        """What a module of this format lacks, in the file's own suffixes ('' when complete)."""
        return ", ".join(_suffix(role) for role in sorted(cls.NEEDS - roles))

    @classmethod
    def incomplete(cls, roles: set[str]) -> str:
        """Why a module with these roles is no complete layer of this format ('' when it is one)."""
        lacking = cls.lacks(roles)
        return f"{cls.kind} layer lacks {lacking}" if lacking else ""

    @property
    def rank(self) -> int | None:
        return None

    @property
    def scale(self) -> float:
        rank = self.rank
        return self.alpha / rank if self.alpha is not None and rank else 1.0

    @property
    def magnitude(self) -> np.ndarray | None:
        return self.t.get("dora", self.t.get("magnitude"))

    @property
    def low_rank(self) -> bool:
        """Whether ΔW is one plain up @ down product (no Tucker core, no DoRA): what merges as stacked factors."""
        return False

    def out_in(self) -> tuple[int, int]:
        """(rows, elements per row) of ΔW, from the shapes alone."""
        raise NotImplementedError

    def product(self, shape: tuple[int, ...]) -> np.ndarray:
        """ΔW unscaled, in any shape with the weight's elements."""
        raise NotImplementedError

    def problem(self) -> str:
        """Why the tensors disagree with each other ('' when they agree; the weight's shape is checked later)."""
        return ""

    def delta(self, shape: tuple[int, ...]) -> np.ndarray:
        """scale · ΔW, float32, in the weight's shape."""
        return (np.float32(self.scale) * np.asarray(self.product(shape), np.float32)).reshape(shape)

    def apply(self, weight: np.ndarray, strength: float) -> np.ndarray:
        """weight (torch layout, float32) with this layer merged at `strength`."""
        merged = self.delta(weight.shape)  # a fresh array: scaled and summed in place
        merged *= np.float32(strength)
        merged += weight
        m = self.magnitude
        if m is None:
            return merged
        if m.size == weight.shape[0] and (m.ndim == 1 or m.shape[0] == weight.shape[0]):  # one magnitude per output row
            norm = np.linalg.norm(merged.reshape(weight.shape[0], -1), axis=1).reshape(-1, *[1] * (weight.ndim - 1))
            m = m.reshape(norm.shape)
        else:  # [1, in, ...]: one per input column
            norm = np.linalg.norm(np.moveaxis(merged, 1, 0).reshape(weight.shape[1], -1), axis=1).reshape(
                1, -1, *[1] * (weight.ndim - 2)
            )
            m = m.reshape(norm.shape)
        return (m / np.where(norm == 0, 1, norm) * merged).astype(np.float32)

    def check_magnitude(self, shape: tuple[int, ...]) -> str:
        m = self.magnitude
        if m is None:
            return ""
        if m.size == shape[0] and (m.ndim == 1 or m.shape[0] == shape[0]):
            return ""
        if len(shape) > 1 and m.size == shape[1] and m.ndim > 1 and m.shape[0] == 1 and m.shape[1] == shape[1]:
            return ""
        return f"DoRA magnitude {list(m.shape)} fits neither the output rows nor the input columns of {list(shape)}"


class LoRA(Layer):
    """LoRA and LoCon (kohya, PEFT/diffusers, LyCORIS): ΔW = up @ down, through LoCon's Tucker `mid` when given."""

    kind = "lora"
    MARKS = frozenset({"up", "down", "mid"})
    NEEDS = frozenset({"down", "up"})

    @classmethod
    def incomplete(cls, roles: set[str]) -> str:
        if not cls.NEEDS <= roles:
            return f"needs both up and down tensors, has {', '.join(sorted(r for r in roles if r in cls.MARKS))}"
        return super().incomplete(roles)

    @property
    def rank(self) -> int | None:
        return self.t["down"].shape[0]

    @property
    def low_rank(self) -> bool:
        return "mid" not in self.t and self.magnitude is None

    def out_in(self) -> tuple[int, int]:
        t = self.t
        return t["up"].shape[0], int(np.prod(t["down"].shape[1:])) * (
            int(np.prod(t["mid"].shape[2:])) if "mid" in t else 1
        )

    def product(self, shape: tuple[int, ...]) -> np.ndarray:
        t = self.t
        rank = t["down"].shape[0]
        up, down = t["up"].reshape(t["up"].shape[0], rank), t["down"].reshape(rank, -1)
        if "mid" in t:  # up [out, r] · mid [r, r, k, k] · down [r, in]
            return np.einsum("ijkl,jr,pi->prkl", t["mid"], down, up)
        return up @ down

    def problem(self) -> str:
        t = self.t
        up, down = t["up"], t["down"]
        if up.ndim < 2 or down.ndim < 2 or any(d != 1 for d in up.shape[2:]):
            return f"up {list(up.shape)} / down {list(down.shape)} are not Linear or Conv LoRA shapes"
        if up.shape[1] != down.shape[0] or ("mid" in t and t["mid"].shape[:2] != (down.shape[0], down.shape[0])):
            return f"up {list(up.shape)} and down {list(down.shape)} disagree on the rank"
        return ""


class LoHa(Layer):
    """LyCORIS' LoHa: the Hadamard product of two low-rank products, each optionally in Tucker form."""

    kind = "loha"
    MARKS = frozenset({"w1a", "w1b", "w2a", "w2b", "t1", "t2"})
    NEEDS = frozenset({"w1a", "w1b", "w2a", "w2b"})

    @classmethod
    def lacks(cls, roles: set[str]) -> str:
        missing = [_suffix(role) for role in sorted(cls.NEEDS - roles)]
        if ("t1" in roles) != ("t2" in roles):
            missing.append("hada_t1 and hada_t2 together")
        return ", ".join(missing)

    @property
    def rank(self) -> int | None:
        return self.t["w1b"].shape[0]

    def out_in(self) -> tuple[int, int]:
        t = self.t
        if "t1" in t:
            return t["w1a"].shape[1], t["w1b"].shape[1] * int(np.prod(t["t1"].shape[2:]))
        return t["w1a"].shape[0], t["w1b"].shape[1]

    def product(self, shape: tuple[int, ...]) -> np.ndarray:
        return self._half("1", shape) * self._half("2", shape)

    def _half(self, i: str, shape: tuple[int, ...]) -> np.ndarray:
        t = self.t
        a, b = t[f"w{i}a"], t[f"w{i}b"]
        if f"t{i}" in t:  # Tucker: a [r, out], b [r, in], t [r, r, k, k]
            return np.einsum("ijkl,jr,ip->prkl", t[f"t{i}"], b, a).reshape(shape)
        return (a @ b).reshape(shape)

    def problem(self) -> str:
        t = self.t
        if ("t1" in t) and (t["w1a"].shape[1], t["w1b"].shape[1]) != (t["w2a"].shape[1], t["w2b"].shape[1]):
            return "w1 and w2 give different shapes"
        if "t1" not in t and (t["w1a"].shape[0], t["w1b"].shape[1]) != (t["w2a"].shape[0], t["w2b"].shape[1]):
            return (
                f"w1 {[t['w1a'].shape[0], t['w1b'].shape[1]]} and w2 {[t['w2a'].shape[0], t['w2b'].shape[1]]} "
                "differ in shape"
            )
        if "t1" not in t and (t["w1a"].shape[1] != t["w1b"].shape[0] or t["w2a"].shape[1] != t["w2b"].shape[0]):
            return "hada_w*_a and hada_w*_b disagree on the rank"
        return ""


class LoKr(Layer):
    """LyCORIS' LoKr: the Kronecker product of two factors, each full or a low-rank product (w2 also Tucker)."""

    kind = "lokr"
    MARKS = frozenset({"k1", "k1a", "k1b", "k2", "k2a", "k2b", "kt2"})

    @classmethod
    def lacks(cls, roles: set[str]) -> str:
        return ", ".join(
            f"lokr_w{i} (or lokr_w{i}_a and lokr_w{i}_b)"
            for i in "12"
            if f"k{i}" not in roles and not {f"k{i}a", f"k{i}b"} <= roles
        )

    @property
    def rank(self) -> int | None:
        return next((self.t[k].shape[0] for k in ("k1b", "k2b") if k in self.t), None)

    def out_in(self) -> tuple[int, int]:
        (a, c), (b, d) = self._factor_shape("1"), self._factor_shape("2")
        return a * b, c * d

    def product(self, shape: tuple[int, ...]) -> np.ndarray:
        w1, w2 = self._factor("1"), self._factor("2")
        return np.kron(w1.reshape(w1.shape[0], -1), w2.reshape(w2.shape[0], -1))

    def _factor_shape(self, i: str) -> tuple[int, int]:
        t = self.t
        if f"k{i}" in t:
            w = t[f"k{i}"]
            return w.shape[0], int(np.prod(w.shape[1:]))
        if i == "2" and "kt2" in t:  # Tucker: a [r, b], b [r, d], t [r, r, k, k]
            return t["k2a"].shape[1], t["k2b"].shape[1] * int(np.prod(t["kt2"].shape[2:]))
        return t[f"k{i}a"].shape[0], t[f"k{i}b"].shape[1]

    def _factor(self, i: str) -> np.ndarray:
        t = self.t
        if f"k{i}" in t:
            return t[f"k{i}"]
        if i == "2" and "kt2" in t:
            return np.einsum("ijkl,jr,ip->prkl", t["kt2"], t["k2b"], t["k2a"])
        return t[f"k{i}a"] @ t[f"k{i}b"]

    def problem(self) -> str:
        t = self.t
        for i in "12":
            if f"k{i}" not in t and f"k{i}a" in t and "kt2" not in t and t[f"k{i}a"].shape[1] != t[f"k{i}b"].shape[0]:
                return f"lokr_w{i}_a and lokr_w{i}_b disagree on the rank"
        return ""


class Full(Layer):
    """LyCORIS' full fine-tune module: `diff` is ΔW itself."""

    kind = "full"
    MARKS = frozenset({"diff"})
    NEEDS = frozenset({"diff"})

    def out_in(self) -> tuple[int, int]:
        return self.t["diff"].shape[0], int(np.prod(self.t["diff"].shape[1:]))

    def product(self, shape: tuple[int, ...]) -> np.ndarray:
        return self.t["diff"]


FORMATS: tuple[type[Layer], ...] = (LoRA, LoHa, LoKr, Full)  # a module with tensors of several: the first one's


def format_of(roles: set[str]) -> type[Layer] | None:
    """The format a module's roles (SUFFIXES' values) say, or None when they hold no LoRA weights."""
    return next((cls for cls in FORMATS if roles & cls.MARKS), None)


def _suffix(role: str) -> str:
    return next(s for s, r in SUFFIXES.items() if r == role)
