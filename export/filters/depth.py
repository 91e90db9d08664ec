"""Depth preprocessors for ControlNet: Depth Anything (V1 and V2), as transformers' `DepthAnythingForDepthEstimation`
folders ship it (config.json + model.safetensors, e.g. LiheYoung/depth-anything-small-hf,
depth-anything/Depth-Anything-V2-Small-hf). The graph maps a normalised image to relative depth (larger is nearer);
resizing, normalising and the min-max to a control image are the runtime's (`enginefarm.filters.preprocess`), in
numpy, with the values of the folder's preprocessor_config.json written to filter.json."""

from __future__ import annotations

import json
from typing import Any

from enginefarm.errors import ConfigError

from .registry import Architecture, Part, Parts, Source

# Depth Anything's processor: the short side to 518, each side a multiple of the 14-pixel patch, ImageNet statistics.
RESOLUTION = 518
MULTIPLE = 14
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
# The sides an engine is built for: the short side at 518 and a long side up to twice that (the runtime shrinks a
# longer image to fit), down to 4 patches for small detect resolutions.
SIDE_PROFILE = (4 * MULTIPLE, RESOLUTION, 2 * RESOLUTION)


def is_depth_anything(source: Source) -> bool:
    config = source.config or {}
    return config.get("model_type") == "depth_anything" or "DepthAnythingForDepthEstimation" in config.get(
        "architectures", ()
    )


def build_depth_anything(source: Source) -> Parts:
    import torch
    from transformers import DepthAnythingForDepthEstimation

    if not source.path.is_dir():
        raise ConfigError(
            f"{source.path}: Depth Anything is exported from its transformers folder",
            hint="give the folder with config.json and model.safetensors (save_pretrained's layout)",
        )
    # from_pretrained, not load_state_dict: it renames the published key layout (attention.attention.query…) into
    # the module's current one; it reads safetensors, or a .bin with weights_only.
    model, info = DepthAnythingForDepthEstimation.from_pretrained(
        str(source.path), output_loading_info=True, torch_dtype=torch.float32
    )
    config = model.config
    missing, unexpected = info.get("missing_keys", []), info.get("unexpected_keys", [])
    if missing or unexpected:
        raise ConfigError(
            f"{source.path}: its weights do not fit its config.json ({len(missing)} missing, e.g. "
            f"{(missing or ['-'])[0]}; {len(unexpected)} unexpected, e.g. {(unexpected or ['-'])[0]})",
            hint="give the folder save_pretrained wrote for DepthAnythingForDepthEstimation",
        )
    model = model.float().eval()
    patch = int(config.patch_size)
    if patch != MULTIPLE:
        raise ConfigError(f"{source.path}: a Depth Anything with {patch}-pixel patches", hint="the published use 14")

    class DepthGraph(torch.nn.Module):
        """transformers' forward, its head's last resize taken from the input's shape so that the traced graph
        keeps height and width dynamic (transformers casts them to Python ints there)."""

        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, image):
            net = self.net
            features = net.backbone.forward_with_filtered_kwargs(image).feature_maps
            features = net.neck(features, image.shape[2] // patch, image.shape[3] // patch)
            head = net.head
            depth = head.conv1(features[head.head_in_index])
            depth = torch.nn.functional.interpolate(depth, size=image.shape[2:], mode="bilinear", align_corners=True)
            depth = head.activation2(head.conv3(head.activation1(head.conv2(depth)))) * head.max_depth
            return depth[:, 0]

    processing = _processing(source)
    lowest = min((0 - m) / s for m, s in zip(processing["mean"], processing["std"], strict=True))
    highest = max((1 - m) / s for m, s in zip(processing["mean"], processing["std"], strict=True))
    part = Part(
        module=DepthGraph(model).eval(),
        inputs={"image": (1, 3, "height", "width")},
        outputs={"depth": (1, "height", "width")},
        profile={"height": SIDE_PROFILE, "width": SIDE_PROFILE},
        ranges={"image": (round(lowest, 4), round(highest, 4))},
    )
    details = {
        "task": "depth",
        **processing,
        "max_side": SIDE_PROFILE[2],
        "depth_type": str(getattr(config, "depth_estimation_type", "relative")),
    }
    return Parts("DepthAnything", "preprocessor", {"depth": part}, details)


def _processing(source: Source) -> dict[str, Any]:
    """Resize and normalisation from the folder's preprocessor_config.json where it has one, else the published."""
    record: dict[str, Any] = {}
    path = source.path / "preprocessor_config.json" if source.path.is_dir() else None
    if path is not None and path.is_file():
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            record = {}
    size = record.get("size") or {}
    resolution = min(size.get("height", RESOLUTION), size.get("width", RESOLUTION)) if isinstance(size, dict) else 0
    return {
        "resolution": int(resolution or RESOLUTION),
        "multiple": int(record.get("ensure_multiple_of") or MULTIPLE),
        "mean": [float(v) for v in record.get("image_mean") or MEAN],
        "std": [float(v) for v in record.get("image_std") or STD],
        "resample": "bicubic",
    }


ARCHITECTURES = [
    Architecture("Depth Anything (transformers folder)", "preprocessor", is_depth_anything, build_depth_anything),
]
