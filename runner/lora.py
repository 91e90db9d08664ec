"""LoRA files: which checkpoint tensor each layer patches, and by how much.

Formats (safetensors):
- diffusers/PEFT: `<module>.lora_A.weight` (down) and `<module>.lora_B.weight` (up), optional `<module>.alpha`;
- kohya: `<module>.lora_down.weight`, `<module>.lora_up.weight` and `<module>.alpha`.
Without alpha the scale is 1 (alpha = rank). Linear ([out, r] @ [r, in]) and Conv (up [out, r, 1, 1], down
[r, in, k, k]) layers; the delta is up @ down reshaped to the weight's shape.

Module names are matched to the base checkpoint's `<module>.weight` tensors (see NAMING):
- dotted names as they are, or after dropping one leading prefix in DOTTED_PREFIXES;
- kohya names `lora_<part>_<module with '.' as '_'>`, where <part> is in KOHYA_PARTS or absent.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from enginefarm.builder.safetensors_io import SafeTensors
from enginefarm.builder.weightmap import WeightMap
from enginefarm.errors import WeightsError

_SUFFIXES = ((".lora_A.weight", "down"), (".lora_B.weight", "up"), (".lora_down.weight", "down"), (".lora_up.weight", "up"), (".alpha", "alpha"))
DOTTED_PREFIXES = ("base_model.model.", "unet.", "vae.", "text_encoder.", "text_encoder_2.", "transformer.", "model.")
KOHYA_PARTS = ("unet", "te", "te1", "te2", "vae", "transformer")
NAMING = ("LoRA module names must name a `<module>.weight` of the component's checkpoint: dotted (PEFT, optionally "
          f"prefixed by one of {', '.join(DOTTED_PREFIXES)}) or kohya's lora_<{'|'.join(KOHYA_PARTS)}>_<module with _ for .>")


@dataclass(frozen=True)
class LoraLayer:
    target: str  # the checkpoint tensor it changes
    up: np.ndarray
    down: np.ndarray
    alpha: float | None

    @property
    def rank(self) -> int:
        return self.down.shape[0]

    def delta(self, shape: tuple[int, ...]) -> np.ndarray:
        """(alpha / rank) · up @ down, in fp32, in the weight's own shape."""
        scale = (self.alpha if self.alpha is not None else self.rank) / self.rank
        product = self.up.reshape(self.up.shape[0], self.rank) @ self.down.reshape(self.rank, -1)
        return (scale * product).reshape(shape)


class ModuleNames:
    """Resolves a LoRA module name to the checkpoint tensor it patches."""

    def __init__(self, checkpoint_names) -> None:
        self.modules = {n[: -len(".weight")] for n in checkpoint_names if n.endswith(".weight")}
        self.kohya: dict[str, list[str]] = {}
        for module in self.modules:
            self.kohya.setdefault(module.replace(".", "_"), []).append(module)

    def resolve(self, module: str) -> tuple[str | None, str]:
        """(checkpoint tensor name, "") or (None, why)."""
        tries = [module] + [module[len(p):] for p in DOTTED_PREFIXES if module.startswith(p)]
        for name in tries:
            if name in self.modules:
                return name + ".weight", ""
        if module.startswith("lora_"):
            rest = module[len("lora_"):]
            flat = [rest] + [rest[len(p) + 1:] for p in KOHYA_PARTS if rest.startswith(p + "_")]
            for name in flat:
                found = self.kohya.get(name, [])
                if len(found) == 1:
                    return found[0] + ".weight", ""
                if len(found) > 1:
                    return None, f"ambiguous: {', '.join(sorted(found))} all read {name} with '_' for '.'"
        return None, "names no module of the checkpoint"


def read_lora(path: Path, wmap: WeightMap) -> list[LoraLayer]:
    """Every layer of a LoRA file, checked against the weight map. All problems are raised together."""
    st = SafeTensors(path)
    groups: dict[str, dict[str, str]] = {}
    problems: list[str] = []
    for name in st.names:
        for suffix, part in _SUFFIXES:
            if name.endswith(suffix):
                groups.setdefault(name[: -len(suffix)], {})[part] = name
                break
        else:
            problems.append(f"{name}: not a LoRA tensor (lora_A/lora_B, lora_down/lora_up or alpha)")
    names = ModuleNames(wmap.names)
    layers: list[LoraLayer] = []
    for module, parts in sorted(groups.items()):
        if "up" not in parts or "down" not in parts:
            problems.append(f"{module}: needs both up and down tensors, has {', '.join(sorted(parts))}")
            continue
        target, why = names.resolve(module)
        if target is None:
            problems.append(f"{module}: {why}")
            continue
        if target not in wmap.mapped:
            problems.append(f"{module} → {target}: has no weight in the artifact ({wmap.unmatched.get(target, 'unknown')})")
            continue
        layer, problem = _layer(st, parts, target, wmap.mapped[target].shape)
        if problem:
            problems.append(f"{module}: {problem}")
        else:
            layers.append(layer)
    if not groups and not problems:
        problems.append("holds no tensors")
    if problems:
        shown = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
        raise WeightsError(f"{path}: {len(problems)} problem(s) in this LoRA: {shown}", hint=NAMING)
    return layers


def _layer(st: SafeTensors, parts: dict[str, str], target: str, shape: tuple[int, ...]) -> tuple[LoraLayer | None, str]:
    for part in ("up", "down"):
        if st.entries[parts[part]].dtype not in ("F32", "F16", "BF16", "F64"):
            return None, f"{part} is {st.entries[parts[part]].dtype}, not float"
    up, down = st.array(parts["up"]), st.array(parts["down"])
    if up.ndim < 2 or down.ndim < 2 or any(d != 1 for d in up.shape[2:]):
        return None, f"up {list(up.shape)} / down {list(down.shape)} are not Linear or Conv LoRA shapes"
    rank = down.shape[0]
    if up.shape[1] != rank:
        return None, f"up {list(up.shape)} and down {list(down.shape)} disagree on the rank"
    if up.shape[0] * int(np.prod(down.shape[1:])) != int(np.prod(shape)) or up.shape[0] != shape[0]:
        return None, f"up @ down gives {[up.shape[0], *down.shape[1:]]}, the weight {target} is {list(shape)}"
    alpha = None
    if "alpha" in parts:
        value = st.array(parts["alpha"]).reshape(-1)
        if value.size != 1 or not np.isfinite(value[0]):
            return None, "alpha must be one finite number"
        alpha = float(value[0])
    return LoraLayer(target, up, down, alpha), ""
