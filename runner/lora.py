"""LoRA layers placed on a component: which checkpoint tensor each layer of a LoRA file patches.

The file's formats and parts are read by `enginefarm.weights.lora`; here each layer the component takes is
matched to the base checkpoint's `<module>.weight` tensors (see NAMING):
- dotted names as they are, or after dropping one leading prefix in DOTTED_PREFIXES;
- kohya names `lora_<part>_<module with '.' as '_'>`, where <part> is in KOHYA_PARTS or absent.
A component that a part names (unet, text_encoder, …) takes that part's layers and ignores the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from enginefarm.builder.weightmap import WeightMap
from enginefarm.errors import WeightsError
from enginefarm.weights import lora as lora_files

DOTTED_PREFIXES = ("base_model.model.", "unet.", "vae.", "text_encoder.", "text_encoder_2.", "transformer.", "model.")
KOHYA_PARTS = ("unet", "te", "te1", "te2", "vae", "transformer")
NAMING = ("LoRA module names must name a `<module>.weight` of the component's checkpoint: dotted (PEFT, optionally "
          f"prefixed by one of {', '.join(DOTTED_PREFIXES)}) or kohya's lora_<{'|'.join(KOHYA_PARTS)}>_<module with _ for .>")


ORIGINAL_LAYOUTS = {"unet": "unet", "unet_controlnet": "unet"}  # component → its part in weights.layouts


@dataclass(frozen=True)
class LoraLayer:
    target: str  # the checkpoint tensor it changes
    layer: lora_files.Layer
    source: Path

    def apply(self, weight: np.ndarray, strength: float) -> np.ndarray:
        return self.layer.apply(weight, strength)


class ModuleNames:
    """Resolves a LoRA module name to the checkpoint tensor it patches."""

    def __init__(self, checkpoint_names, original_part: str | None = None) -> None:
        self.modules = {n[: -len(".weight")] for n in checkpoint_names if n.endswith(".weight")}
        self.kohya: dict[str, list[str]] = {}
        for module in self.modules:
            self.kohya.setdefault(module.replace(".", "_"), []).append(module)
        if original_part is not None:  # kohya names in the original (LDM) layout: lora_unet_input_blocks_1_1_proj_in
            from enginefarm.weights.layouts import original_names

            for module, original in original_names(original_part, sorted(self.modules)).items():
                if original.replace(".", "_") not in self.kohya:
                    self.kohya[original.replace(".", "_")] = [module]

    def resolve(self, module: str, local: str | None = None) -> tuple[str | None, str]:
        """(checkpoint tensor name, "") or (None, why). `local`: the name without its part's prefix, when the
        component takes only its part."""
        if local is not None:  # transformers 5 names a text encoder's tensors with or without `text_model.`
            bare = local.removeprefix("text_model.").removeprefix("text_model_")
            dotted = [local, bare, "text_model." + bare]
            flat = [local, bare, "text_model_" + bare]
        else:
            dotted = [module] + [module[len(p):] for p in DOTTED_PREFIXES if module.startswith(p)]
            rest = module[len("lora_"):] if module.startswith("lora_") else None
            flat = [] if rest is None else [rest] + [rest[len(p) + 1:] for p in KOHYA_PARTS if rest.startswith(p + "_")]
        for name in dotted:
            if name in self.modules:
                return name + ".weight", ""
        for name in flat:
            found = self.kohya.get(name, [])
            if len(found) == 1:
                return found[0] + ".weight", ""
            if len(found) > 1:
                return None, f"ambiguous: {', '.join(sorted(found))} all read {name} with '_' for '.'"
        return None, "names no module of the checkpoint"


def read_lora(path: Path, wmap: WeightMap, component: str = "", parsed: lora_files.LoraFile | None = None) -> list[LoraLayer]:
    """The layers of a LoRA file that `component` takes, each placed on a weight of the map. All problems are
    raised together; a file with nothing for this component is an error too (the pipeline passes a component only
    the files that hold its part)."""
    parsed = parsed or lora_files.read(path)
    mine = parsed.for_component(component)
    if not mine:
        theirs = ", ".join(f"{part} ({n})" for part, n in sorted(parsed.parts().items()))
        raise WeightsError(f"{path}: no layer of this LoRA is for {component} (it holds layers for {theirs})",
                           hint="load it on the component it was trained for, or with Pipeline.load(..., loras=…)")
    takes_part = component in lora_files.TAKERS
    names = ModuleNames(wmap.names, ORIGINAL_LAYOUTS.get(component))
    layers: list[LoraLayer] = []
    problems: list[str] = []
    for layer in mine:
        target, why = names.resolve(layer.module, layer.local if takes_part else None)
        if target is None:
            problems.append(f"{layer.module}: {why}")
            continue
        if target not in wmap.mapped:
            problems.append(f"{layer.module} → {target}: has no weight in the artifact ({wmap.unmatched.get(target, 'unknown')})")
            continue
        shape = wmap.mapped[target].shape
        rows, per_row = layer.out_in()
        if rows != shape[0] or rows * per_row != int(np.prod(shape)):
            problems.append(f"{layer.module}: its {layer.kind} gives [{rows}, {per_row}], the weight {target} is {list(shape)}")
            continue
        if why := layer.check_magnitude(shape):
            problems.append(f"{layer.module}: {why}")
            continue
        layers.append(LoraLayer(target, layer, Path(path)))
    if problems:
        raise WeightsError(f"{path}: {len(problems)} problem(s) in this LoRA: {lora_files.shown(problems)}", hint=NAMING)
    return layers
