"""RetinaFace, the face detector GFPGAN's and CodeFormer's helper (facexlib) runs: `detection_Resnet50_Final.pth`
(the default) or `detection_mobilenet0.25_Final.pth`. Exported as one part, `detector`: `image` [1, 3, height, width]
RGB in [0, 1] → per anchor `loc` (box offsets), `conf` (softmax [background, face]) and `landmarks` (5 points'
offsets). The anchors, their decoding, the score threshold and NMS are the runtime's (enginefarm.filters.faces),
from the numbers in `details`."""

from __future__ import annotations

from enginefarm.errors import ConfigError

from .registry import Architecture, Part, Parts, Source

# facexlib's configuration for both bodies: anchor sizes per level, the levels' strides, the box coding's variances
ANCHOR_SIZES = [[16, 32], [64, 128], [256, 512]]
STEPS = [8, 16, 32]
VARIANCE = [0.1, 0.2]
# the sizes the engine takes (each side); a larger image is shrunk for detection, as facexlib's `resize` does
MIN_SIDE, OPT_SIDE, MAX_SIDE = 32, 640, 2048
HEADS = ("ClassHead", "BboxHead", "LandmarkHead")


def matches(source: Source) -> bool:
    keys = source.state
    has_body = "body.conv1.weight" in keys or "body.stage1.0.0.weight" in keys
    return has_body and "fpn.output1.0.weight" in keys and all(f"{h}.2.conv1x1.weight" in keys for h in HEADS)


def build_module(state):
    """The detector as a torch module (eval, fp32) with the file's weights; ConfigError if the layout is off."""
    import torch

    from .retinaface_net import BGR_MEAN, RetinaFace

    try:
        with torch.device("meta"):  # no initialisation of weights the file replaces
            module = RetinaFace(state)
        module.load_state_dict({k: v.float() for k, v in state.items()}, strict=True, assign=True)
        module.mean = torch.tensor(BGR_MEAN).view(1, 3, 1, 1)
    except (KeyError, RuntimeError, ValueError, IndexError) as exc:
        raise ConfigError(
            f"this looks like RetinaFace but not facexlib's layout ({str(exc).splitlines()[0][:200]})",
            hint="facexlib's detection_Resnet50_Final.pth and detection_mobilenet0.25_Final.pth are supported",
        ) from None
    anchors = state["ClassHead.0.conv1x1.weight"].shape[0] // 2
    if anchors != len(ANCHOR_SIZES[0]):
        raise ConfigError(
            f"this RetinaFace has {anchors} anchors per place; facexlib's have {len(ANCHOR_SIZES[0])}",
            hint="facexlib's detection_Resnet50_Final.pth and detection_mobilenet0.25_Final.pth are supported",
        )
    return module.eval()


def build(source: Source) -> Parts:
    module = build_module(source.state)
    body = "resnet50" if "body.conv1.weight" in source.state else "mobilenet0.25"
    part = Part(
        module=module,
        inputs={"image": (1, 3, "height", "width")},
        outputs={"loc": (1, "anchors", 4), "conf": (1, "anchors", 2), "landmarks": (1, "anchors", 10)},
        profile={"height": (MIN_SIDE, OPT_SIDE, MAX_SIDE), "width": (MIN_SIDE, OPT_SIDE, MAX_SIDE)},
        ranges={"image": (0.0, 1.0)},
    )
    details = {
        "body": body,
        "anchor_sizes": ANCHOR_SIZES,
        "steps": STEPS,
        "variance": VARIANCE,
        "min_side": MIN_SIDE,
        "max_side": MAX_SIDE,
    }
    return Parts("RetinaFace", "face_detector", {"detector": part}, details)


ARCHITECTURES = [Architecture("RetinaFace (facexlib)", "face_detector", matches, build)]
