"""LoRA layers placed on a component: which checkpoint tensor each layer of a LoRA file patches.

The file's formats and parts are read by `enginefarm.weights.lora`; here each layer the component takes is
matched to the base checkpoint's `<module>.weight` tensors (see NAMING):
- dotted names as they are, or after dropping one leading prefix in DOTTED_PREFIXES;
- kohya names `lora_<part>_<module with '.' as '_'>`, where <part> is in KOHYA_PARTS or absent;
- either of them in the original layout (`weights/layouts.py`: LDM's UNet, Flux's and SD3's transformers), where a
  fused original module (Flux's `img_attn.qkv`, `linear1`) patches each diffusers target with its rows of ΔW.
A component that a part names (unet, text_encoder, …) takes that part's layers and ignores the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from enginefarm.errors import WeightsError
from enginefarm.formats.weightmap import WeightMap
from enginefarm.weights import layouts
from enginefarm.weights import lora as lora_files
from enginefarm.weights.denoisers import lora_fits_component
from enginefarm.weights.layouts import Source

DOTTED_PREFIXES = (
    "base_model.model.",
    "unet.",
    "vae.",
    "text_encoder.",
    "text_encoder_2.",
    "transformer.",
    "diffusion_model.",
    "model.",
)
KOHYA_PARTS = ("unet", "te", "te1", "te2", "vae", "transformer")
NAMING = (
    "LoRA module names must name a `<module>.weight` of the component's checkpoint: dotted (PEFT, optionally "
    f"prefixed by one of {', '.join(DOTTED_PREFIXES)}) or kohya's lora_<{'|'.join(KOHYA_PARTS)}>_<module with _ for .>"
)


ORIGINAL_LAYOUTS = {
    "unet": "unet",
    "unet_controlnet": "unet",
    "transformer": "transformer",
}  # component → its part in weights.layouts


@dataclass(frozen=True)
class LoraLayer:
    target: str  # the checkpoint tensor it changes
    layer: lora_files.Layer
    source: Path
    rows: Source | None = None  # the layer is for a fused original module: which rows of its change are the target's

    def apply(self, weight: np.ndarray, strength: float) -> np.ndarray:
        if self.rows is None:
            return self.layer.apply(weight, strength)
        start, stop, n = self.rows.take or (0, 1, 1)
        fused = self.layer.delta((weight.shape[0] * n // (stop - start), *weight.shape[1:]))
        return (weight + np.float32(strength) * self.rows.convert(fused)).astype(np.float32)


Places = list[
    tuple[str, "Source | None"]
]  # (diffusers module or tensor, the rows of the original module it is, or None)


class ModuleNames:
    """Resolves a LoRA module name to the checkpoint tensors it patches: one, or several where the name is an
    original module that diffusers splits (Flux's `img_attn.qkv` → to_q, to_k, to_v; `linear1` → those and proj_mlp)."""

    def __init__(self, checkpoint_names, original_part: str | None = None) -> None:
        self.modules = {n[: -len(".weight")] for n in checkpoint_names if n.endswith(".weight")}
        self.kohya: dict[str, Places] = {}
        for module in self.modules:
            self.kohya.setdefault(module.replace(".", "_"), []).append((module, None))
        self.original: dict[str, Places] = {}  # original module names, dotted (ComfyUI's, BFL's); kohya's below
        if original_part is not None:  # kohya names in the original layout: lora_unet_input_blocks_1_1_proj_in
            for module, source in layouts.sources(
                _layout_part(original_part, self.modules), sorted(self.modules)
            ).items():
                self.original.setdefault(source.key, []).append(
                    (module, source if source.take or source.swap else None)
                )
            for original, places in self.original.items():
                if original.replace(".", "_") not in self.kohya:
                    self.kohya[original.replace(".", "_")] = places

    def resolve(self, module: str, local: str | None = None) -> tuple[Places, str]:
        """([(checkpoint tensor name, rows)], "") or ([], why). `local`: the name without its part's prefix, when
        the component takes only its part."""
        if local is not None:  # transformers 5 names a text encoder's tensors with or without `text_model.`
            bare = local.removeprefix("text_model.").removeprefix("text_model_")
            dotted = [local, bare, "text_model." + bare]
            flat = [local, bare, "text_model_" + bare]
        else:
            dotted = [module] + [module[len(p) :] for p in DOTTED_PREFIXES if module.startswith(p)]
            rest = module[len("lora_") :] if module.startswith("lora_") else None
            flat = (
                [] if rest is None else [rest] + [rest[len(p) + 1 :] for p in KOHYA_PARTS if rest.startswith(p + "_")]
            )
        for name in dotted:
            if name in self.modules:
                return [(name + ".weight", None)], ""
            if name in self.original:
                return [(m + ".weight", rows) for m, rows in self.original[name]], ""
        for name in flat:
            found = self.kohya.get(name, [])
            if len(found) == 1 or (found and all(rows is not None for _, rows in found)):
                return [(m + ".weight", rows) for m, rows in found], ""
            if len(found) > 1:
                return [], f"ambiguous: {', '.join(sorted(m for m, _ in found))} all read {name} with '_' for '.'"
        return [], "names no module of the checkpoint"


def _layout_part(component_part: str, modules) -> str:
    """A transformer's original layout, by its modules: Flux has single-stream blocks, SD3's MMDiT has not."""
    if component_part != "transformer":
        return component_part
    return layouts.FLUX if any(m.startswith("single_transformer_blocks.") for m in modules) else layouts.SD3


def place_lora(
    parsed: lora_files.LoraFile, wmap: WeightMap, component: str = "", ref: str | None = None
) -> list[LoraLayer]:
    """The layers of a LoRA file (read once by the load: `weights.lora.read`) that `component` (`ref`:
    MODEL/COMPONENT) takes, each placed on a weight of the map. All problems are raised together; a file with
    nothing for this component is an error too (the pipeline passes a component only the files that hold its part),
    and so is one for another kind of denoiser."""
    path = parsed.path
    lora_fits_component(parsed, wmap.names, ref or component or "this component")
    mine = parsed.for_component(component)
    if not mine:
        theirs = ", ".join(f"{part} ({n})" for part, n in sorted(parsed.parts().items()))
        raise WeightsError(
            f"{path}: no layer of this LoRA is for {component} (it holds layers for {theirs})",
            hint="load it on the component it was trained for, or with Pipeline.load(..., loras=…)",
        )
    takes_part = component in lora_files.TAKERS
    names = ModuleNames(wmap.names, ORIGINAL_LAYOUTS.get(component))
    layers: list[LoraLayer] = []
    problems: list[str] = []
    for layer in mine:
        places, why = names.resolve(layer.module, layer.local if takes_part else None)
        if not places:
            problems.append(f"{layer.module}: {why}")
        for target, fused in places:
            if why := _misfit(layer, target, fused, wmap):
                problems.append(why)
            else:
                layers.append(LoraLayer(target, layer, path, fused))
    if problems:
        raise WeightsError(
            f"{path}: {len(problems)} problem(s) in this LoRA: {lora_files.shown(problems)}", hint=NAMING
        )
    return layers


def _misfit(layer: lora_files.Layer, target: str, fused: Source | None, wmap: WeightMap) -> str:
    """Why the layer cannot change `target` (its rows of a fused module where `fused` says so), or ''."""
    if target not in wmap.mapped:
        return f"{layer.module} → {target}: has no weight in the artifact ({wmap.unmatched.get(target, 'unknown')})"
    shape = wmap.mapped[target].shape
    start, stop, n = fused.take if fused is not None and fused.take else (0, 1, 1)
    want = shape[0] * n // (stop - start)  # the rows of the module the layer was trained on
    rows, per_row = layer.out_in()
    if rows != want or shape[0] % (stop - start) or rows * per_row != want * int(np.prod(shape[1:])):
        part = f" ({stop - start} of {n} parts of a fused module)" if fused is not None and fused.take else ""
        return f"{layer.module}: its {layer.kind} gives [{rows}, {per_row}], the weight {target} is {list(shape)}{part}"
    if fused is not None and layer.magnitude is not None:
        return f"{layer.module}: DoRA on a fused module (one magnitude for {target} and its siblings) is not supported"
    return layer.check_magnitude(shape)
