"""One LoRA layer (a module's tensors from a file) and the change it makes to a weight (numpy only).

Formats, by the suffixes of a module's tensors (W is the weight, all products in the weight's torch layout):
- LoRA / LoCon   `lora_down|lora_A` [r, in, (k, k)], `lora_up|lora_B` [out, r, (1, 1)], optional `lora_mid` [r, r, k, k]
                 (LoCon's Tucker form): ΔW = up @ down (through mid);
- LoHa           `hada_w1_a` [out, r] `hada_w1_b` [r, in·k·k] and the same for w2; with `hada_t1/t2` [r, r, k, k]
(Tucker,
                 then w_a is [r, out] and w_b [r, in]): ΔW = (w1_a @ w1_b) ⊙ (w2_a @ w2_b);
- LoKr           `lokr_w1` [a, c] or `lokr_w1_a @ lokr_w1_b`; `lokr_w2` [b, d, (k, k)] or `lokr_w2_a @ lokr_w2_b` or
Tucker
                 with `lokr_t2`: ΔW = w1 ⊗ w2 (Kronecker, out = a·b, in = c·d);
- full           `diff`: ΔW itself (LyCORIS' full fine-tune module).
Scale: alpha / r where the file gives `alpha` and a rank (LoRA: down's rows; LoHa: w1_b's rows; LoKr: the rows of
the first decomposed factor, none when both factors are full, as LyCORIS does), else 1.
DoRA: `dora_scale` (kohya/LyCORIS) or `lora_magnitude_vector` (PEFT) is the magnitude m; the merged weight is
W' = m · V / ‖V‖ with V = W + strength · scale · ΔW, the norm taken per output row ([out, …] magnitudes, PEFT's and
LyCORIS' wd_on_out) or per input column (LyCORIS' [1, in, …]). The strength sits inside V, as PEFT's scaling does,
so diffusers' adapter weights and enginefarm's strengths mean the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
_KINDS = {"lora": {"down", "up"}, "loha": {"w1a", "w1b", "w2a", "w2b"}, "lokr": set(), "full": {"diff"}}


def kind_of(parts: set[str]) -> str | None:
    if parts & {"up", "down", "mid"}:
        return "lora"
    if parts & {"w1a", "w1b", "w2a", "w2b", "t1", "t2"}:
        return "loha"
    if parts & {"k1", "k1a", "k1b", "k2", "k2a", "k2b", "kt2"}:
        return "lokr"
    return "full" if "diff" in parts else None


@dataclass(frozen=True)
class Layer:
    """One module's LoRA: enough to compute its change to a weight of a given shape."""

    module: str  # as the file names it
    part: str  # whose layer it is (PARTS), after the file's prefix
    local: str  # the module name without that prefix (dotted, or kohya's with '_' for '.')
    kind: str
    t: dict[str, np.ndarray] = field(repr=False)  # tensors by role (down, up, w1a, k1, ...), float32
    alpha: float | None = None

    @property
    def rank(self) -> int | None:
        t = self.t
        if self.kind == "lora":
            return t["down"].shape[0]
        if self.kind == "loha":
            return t["w1b"].shape[0]
        if self.kind == "lokr":
            return next((t[k].shape[0] for k in ("k1b", "k2b") if k in t), None)
        return None

    @property
    def scale(self) -> float:
        rank = self.rank
        return self.alpha / rank if self.alpha is not None and rank else 1.0

    @property
    def magnitude(self) -> np.ndarray | None:
        return self.t.get("dora", self.t.get("magnitude"))

    def out_in(self) -> tuple[int, int]:
        """(rows, elements per row) of ΔW, from the shapes alone."""
        t = self.t
        if self.kind == "lora":
            return t["up"].shape[0], int(np.prod(t["down"].shape[1:])) * (
                int(np.prod(t["mid"].shape[2:])) if "mid" in t else 1
            )
        if self.kind == "loha":
            if "t1" in t:
                return t["w1a"].shape[1], t["w1b"].shape[1] * int(np.prod(t["t1"].shape[2:]))
            return t["w1a"].shape[0], t["w1b"].shape[1]
        if self.kind == "lokr":
            (a, c), (b, d) = _factor_shape(t, "1"), _factor_shape(t, "2")
            return a * b, c * d
        return self.t["diff"].shape[0], int(np.prod(self.t["diff"].shape[1:]))

    def delta(self, shape: tuple[int, ...]) -> np.ndarray:
        """scale · ΔW, float32, in the weight's shape."""
        t = self.t
        if self.kind == "lora":
            rank = t["down"].shape[0]
            up, down = t["up"].reshape(t["up"].shape[0], rank), t["down"].reshape(rank, -1)
            if "mid" in t:  # up [out, r] · mid [r, r, k, k] · down [r, in]
                product = np.einsum("ijkl,jr,pi->prkl", t["mid"], down, up)
            else:
                product = up @ down
        elif self.kind == "loha":
            product = _hada(t, "1", shape) * _hada(t, "2", shape)
        elif self.kind == "lokr":
            w1, w2 = _kron_factor(t, "1"), _kron_factor(t, "2")
            product = np.kron(w1.reshape(w1.shape[0], -1), w2.reshape(w2.shape[0], -1))
        else:
            product = t["diff"]
        return (np.float32(self.scale) * np.asarray(product, np.float32)).reshape(shape)

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


def _factor_shape(t: dict, i: str) -> tuple[int, int]:
    if f"k{i}" in t:
        w = t[f"k{i}"]
        return w.shape[0], int(np.prod(w.shape[1:]))
    if i == "2" and "kt2" in t:  # Tucker: a [r, b], b [r, d], t [r, r, k, k]
        return t["k2a"].shape[1], t["k2b"].shape[1] * int(np.prod(t["kt2"].shape[2:]))
    return t[f"k{i}a"].shape[0], t[f"k{i}b"].shape[1]


def _kron_factor(t: dict, i: str) -> np.ndarray:
    if f"k{i}" in t:
        return t[f"k{i}"]
    if i == "2" and "kt2" in t:
        return np.einsum("ijkl,jr,ip->prkl", t["kt2"], t["k2b"], t["k2a"])
    return t[f"k{i}a"] @ t[f"k{i}b"]


def _hada(t: dict, i: str, shape: tuple[int, ...]) -> np.ndarray:
    a, b = t[f"w{i}a"], t[f"w{i}b"]
    if f"t{i}" in t:  # Tucker: a [r, out], b [r, in], t [r, r, k, k]
        return np.einsum("ijkl,jr,ip->prkl", t[f"t{i}"], b, a).reshape(shape)
    return (a @ b).reshape(shape)


def missing_roles(kind: str, roles: set[str]) -> str:
    """What a module of `kind` lacks, in the file's own suffixes ('' when complete)."""
    if kind == "lokr":
        missing = [
            f"lokr_w{i} (or lokr_w{i}_a and lokr_w{i}_b)"
            for i in "12"
            if f"k{i}" not in roles and not {f"k{i}a", f"k{i}b"} <= roles
        ]
    else:
        missing = [next(s for s, r in SUFFIXES.items() if r == role) for role in sorted(_KINDS[kind] - roles)]
    if kind == "loha" and ("t1" in roles) != ("t2" in roles):
        missing.append("hada_t1 and hada_t2 together")
    return ", ".join(missing)
