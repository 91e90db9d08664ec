"""diffusers' `StableDiffusionSafetyChecker` (CompVis/stable-diffusion-safety-checker, and a pipeline's
`safety_checker/` folder): config.json (a CLIPConfig) and model.safetensors / pytorch_model.bin, with the CLIP
image processor's preprocessor_config.json beside it (or in the pipeline's `feature_extractor/`).

The exported component `checker` takes CLIP's pixel_values [N, 3, S, S] and gives the cosine similarity of the
image embedding (CLIP's vision tower, pooled, projected) with each special-care and concept embedding; the
thresholds (`*_embeds_weights`) and the preprocessing settings go to filter.json, where `filters/safety.py` reads
them to decide as diffusers' `forward` does."""

from __future__ import annotations

import json
from pathlib import Path

from enginefarm.errors import ConfigError

from .registry import Architecture, Part, Parts, Source

_CHECKER_KEYS = ("concept_embeds", "special_care_embeds", "concept_embeds_weights", "special_care_embeds_weights")
BATCH_PROFILE = (1, 1, 4)  # an app checks the images of one call: 1 to 4 (run one by one by the runtime today)


def matches(source: Source) -> bool:
    """A safety checker folder: its config names the class, or its weights hold the concept embeddings."""
    config = source.config if isinstance(source.config, dict) else {}
    named = "StableDiffusionSafetyChecker" in (config.get("architectures") or [])
    return named or (bool(config) and all(k in source.state for k in _CHECKER_KEYS))


def _preprocessor(folder: Path) -> dict:
    """The CLIP image processor's settings: the folder's preprocessor_config.json, else the pipeline's
    feature_extractor/, else CLIPImageProcessor's defaults (which CompVis' file repeats)."""
    for path in (folder / "preprocessor_config.json", folder.parent / "feature_extractor" / "preprocessor_config.json"):
        if path.is_file():
            try:
                return dict(json.loads(path.read_text(encoding="utf-8")))
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"{path} is not JSON ({exc})", hint="re-download the safety checker") from None
    return {}


def _settings(found: dict, image_size: int) -> dict:
    """filter.json's preprocessing details from a preprocessor config, refusing what the numpy side does not do."""
    size = found.get("size", {"shortest_edge": 224})
    shortest = size.get("shortest_edge") if isinstance(size, dict) else size
    crop = found.get("crop_size", {"height": 224, "width": 224})
    crop_side = crop if isinstance(crop, int) else crop.get("height")
    square = isinstance(crop, int) or crop.get("height") == crop.get("width")
    if (
        found.get("resample", 3) != 3
        or not found.get("do_resize", True)
        or not found.get("do_center_crop", True)
        or not found.get("do_normalize", True)
        or not found.get("do_rescale", True)
        or abs(float(found.get("rescale_factor", 1 / 255)) - 1 / 255) > 1e-9
        or not isinstance(shortest, int)
        or not square
        or crop_side != image_size
    ):
        raise ConfigError(
            "this safety checker's image preprocessing is not CLIP's (bicubic resize of the shortest side, centre "
            f"crop to {image_size}, /255, mean/std)",
            hint="export CompVis/stable-diffusion-safety-checker's folder with its preprocessor_config.json",
        )
    details = {"shortest_edge": shortest, "crop_size": crop_side}
    for key in ("image_mean", "image_std"):
        if key in found:
            details[key] = [float(v) for v in found[key]]
    return details


def build(source: Source) -> Parts:
    """The `checker` component (CLIP vision tower → cosines) and the thresholds and preprocessing details."""
    import torch
    from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
    from transformers import CLIPConfig

    try:
        config = CLIPConfig.from_dict(dict(source.config or {}))
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError(f"{source.path}: config.json is not a CLIPConfig ({exc})", hint="re-download it") from None
    config.vision_config._attn_implementation = "eager"  # plain matmuls: every backend's ONNX importer takes them
    config._attn_implementation = "eager"
    checker = StableDiffusionSafetyChecker(config).eval()
    expected = checker.state_dict()
    state = {k: v for k, v in source.state.items() if not k.endswith("position_ids")}  # a buffer older files save
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [k for k in state if k in expected and tuple(state[k].shape) != tuple(expected[k].shape)]
    if missing or unexpected or wrong:
        what = missing[:3] or unexpected[:3] or wrong[:3]
        raise ConfigError(
            f"{source.path}: its weights are not this config's safety checker ({what})",
            hint="give the folder as published (config.json with its model.safetensors or pytorch_model.bin)",
        )
    checker.load_state_dict({k: v.float() for k, v in state.items()})
    image_size = int(config.vision_config.image_size)
    details = _settings(_preprocessor(source.path if source.path.is_dir() else source.path.parent), image_size)
    details["special_thresholds"] = [float(v) for v in checker.special_care_embeds_weights.tolist()]
    details["concept_thresholds"] = [float(v) for v in checker.concept_embeds_weights.tolist()]
    details["image_size"] = image_size

    class Similarities(torch.nn.Module):
        """CLIP pixel_values → (cosine with each special-care embedding, with each concept embedding)."""

        def __init__(self) -> None:
            super().__init__()
            self.vision_model = checker.vision_model
            self.visual_projection = checker.visual_projection
            # the embeddings normalised once here: the graph keeps two constant matrices
            self.register_buffer("special", torch.nn.functional.normalize(checker.special_care_embeds.data).T.clone())
            self.register_buffer("concepts", torch.nn.functional.normalize(checker.concept_embeds.data).T.clone())

        def forward(self, pixel_values):
            pooled = self.vision_model(pixel_values)[1]
            embeds = torch.nn.functional.normalize(self.visual_projection(pooled))
            return embeds @ self.special, embeds @ self.concepts

    part = Part(
        module=Similarities().eval(),
        inputs={"pixel_values": ("batch", 3, image_size, image_size)},
        outputs={
            "special_cos": ("batch", len(details["special_thresholds"])),
            "concept_cos": ("batch", len(details["concept_thresholds"])),
        },
        profile={"batch": BATCH_PROFILE},
        ranges={"pixel_values": (-1.8, 2.2)},  # (0 - mean) / std .. (1 - mean) / std, over CLIP's channels
    )
    return Parts("StableDiffusionSafetyChecker", "safety_checker", {"checker": part}, details)


ARCHITECTURES = [
    Architecture("diffusers StableDiffusionSafetyChecker (CLIP ViT-L/14)", "safety_checker", matches, build)
]
