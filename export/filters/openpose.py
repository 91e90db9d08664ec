"""Poses for ControlNet (openpose): the CMU body-pose network as lllyasviel's Annotators ship it
(`body_pose_model.pth`, controlnet-aux's `bodypose_model`): a VGG backbone at stride 8, then six stages of two
branches, L1 giving the 38 part affinity fields (19 limbs, x and y) and L2 the 19 heatmaps (18 joints and the
background). The file's keys are the layer names alone (`conv1_1.weight`, `Mconv7_stage6_L2.bias`): controlnet-aux's
`util.transfer` strips the `model0.` / `modelS_B.` prefixes its module adds.

The graph is the network alone: `image` [1, 3, height, width] (BGR, `u / 256 - 0.5` of 8-bit values, sides padded to
a multiple of 8) → `pafs` and `heatmaps` at an eighth of its size. Resizing, the peaks, the limbs, the people and the
drawing are numpy at run time (`enginefarm.filters.openpose`). The widths are read from the file's shapes.

The hand net (`hand_pose_model.pth`) and the face net (`facenet.pth`, controlnet-aux's FaceNet) share one layout,
CMU's one-branch CPM: the same layer names, told apart by their heatmaps (22 and 71). Each is a filter of its own
that names the body filter it runs (`uses.body`)."""

from __future__ import annotations

import re

from .registry import Architecture, Part, Parts, Source, load_layout

STRIDE = 8
# controlnet-aux's Body: the image scaled so its height is half of the 368-pixel box (one scale, 0.5, of CMU's four)
BOX = 368
SCALE = 0.5
# controlnet-aux's OpenposeDetector: the short side to 512, each side a multiple of 64
RESOLUTION = 512
MULTIPLE = 64
# the network's sides: the height is always about 184 (BOX * SCALE, padded to the stride); the width follows the
# image's aspect: down to a quarter of that for a tall photo, up to four times for a wide one
SIDE_PROFILE = (48, 184, 736)
BACKBONE = (
    ("conv1_1", "conv1_2"),
    ("conv2_1", "conv2_2"),
    ("conv3_1", "conv3_2", "conv3_3", "conv3_4"),
    ("conv4_1", "conv4_2", "conv4_3_CPM", "conv4_4_CPM"),
)  # a 2x2 max pool after each group but the last
_STAGE = re.compile(r"Mconv1_stage(\d+)_L1\.weight")
# the hand net: a deeper backbone (conv5_3_CPM, 128 channels), one branch of 22 heatmaps (21 joints and the
# background), run on a square crop around each hand at four sides (0.5 to 2 times the 368 box)
HAND_BACKBONE = (
    ("conv1_1", "conv1_2"),
    ("conv2_1", "conv2_2"),
    ("conv3_1", "conv3_2", "conv3_3", "conv3_4"),
    ("conv4_1", "conv4_2", "conv4_3", "conv4_4", "conv5_1", "conv5_2", "conv5_3_CPM"),
)
HAND_SCALES = (0.5, 1.0, 1.5, 2.0)
HAND_PROFILE = (184, 368, 736)
_HAND_STAGE = re.compile(r"Mconv1_stage(\d+)\.weight")
# the face net (controlnet-aux's FaceNet, facenet.pth): the hand net's layers with 71 heatmaps, on a 384 square
FACE_HEATMAPS = 71
FACE_SIDE = 384


def is_openpose_body(source: Source) -> bool:
    state = source.state
    return all(
        f"{name}.weight" in state
        for name in ("conv1_1", "conv4_3_CPM", "conv4_4_CPM", "conv5_5_CPM_L1", "conv5_5_CPM_L2", "Mconv7_stage2_L2")
    )


def branch_layers(stage: int, branch: int) -> list[str]:
    """The layer names of one branch (1: PAFs, 2: heatmaps) of one stage, in order."""
    if stage == 1:
        return [f"conv5_{i}_CPM_L{branch}" for i in range(1, 6)]
    return [f"Mconv{i}_stage{stage}_L{branch}" for i in range(1, 8)]


def build_openpose_body(source: Source) -> Parts:
    import torch
    from torch.nn import functional

    state = source.state
    stages = max((int(m.group(1)) for k in state if (m := _STAGE.fullmatch(k))), default=1)

    def conv(name: str):
        return _conv(source, name, "body_pose_model.pth")

    class BodyPose(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.groups = [list(group) for group in BACKBONE]
            self.branches = {
                (s, b): branch_layers(s, b) for s in range(1, stages + 1) for b in (1, 2)
            }  # fmt: skip
            for name in [n for group in self.groups for n in group]:
                self.add_module(name, conv(name))
            for names in self.branches.values():
                for name in names:
                    self.add_module(name, conv(name))

        def forward(self, image):
            x = _vgg_features(self, image)
            features, flow = x, x
            pafs = heatmaps = x
            for stage in range(1, stages + 1):
                pafs = self._branch(flow, stage, 1, stages)
                heatmaps = self._branch(flow, stage, 2, stages)
                flow = torch.cat([pafs, heatmaps, features], 1)
            return pafs, heatmaps

        def _branch(self, x, stage: int, branch: int, last: int):
            names = self.branches[(stage, branch)]
            for index, name in enumerate(names):
                x = getattr(self, name)(x)
                # controlnet-aux's list of layers without a ReLU names Mconv7_stage6_L1 twice and not
                # Mconv7_stage6_L2, so its last heatmaps pass a ReLU: kept, the control images are its
                if index < len(names) - 1 or (branch == 2 and stage == last == 6):
                    x = functional.relu(x)
            return x

    hint = "give lllyasviel's Annotators body_pose_model.pth (the CMU body net controlnet-aux loads)"
    module = load_layout(BodyPose(), source, "body_pose_model.pth", hint)
    limbs = int(state[f"{branch_layers(stages, 1)[-1]}.weight"].shape[0])
    joints = int(state[f"{branch_layers(stages, 2)[-1]}.weight"].shape[0])
    if (limbs, joints) != (38, 19):
        raise _layout_error(source, f"38 PAF and 19 heatmap channels (it has {limbs} and {joints})")
    part = Part(
        module=module,
        inputs={"image": (1, 3, "height", "width")},
        outputs={"pafs": (1, limbs, "map_height", "map_width"), "heatmaps": (1, joints, "map_height", "map_width")},
        profile={"height": SIDE_PROFILE, "width": SIDE_PROFILE},
        ranges={"image": (-0.5, 0.5)},
    )
    details = {
        "task": "openpose",
        "resolution": RESOLUTION,
        "multiple": MULTIPLE,
        "stride": STRIDE,
        "box": BOX,
        "scale": SCALE,
        "stages": stages,
        "widths": [int(state[f"{g[-1]}.weight"].shape[0]) for g in BACKBONE],
    }
    return Parts("OpenposeBody", "preprocessor", {"body": part}, details)


def _conv(source: Source, name: str, layout: str):
    """A convolution shaped as the file's `name` (its padding keeps the size)."""
    import torch

    shape = getattr(source.state.get(f"{name}.weight"), "shape", None)
    if shape is None or len(shape) != 4:
        raise _layout_error(source, f"{name}.weight", layout)
    cout, cin, kernel = int(shape[0]), int(shape[1]), int(shape[2])
    return torch.nn.Conv2d(cin, cout, kernel, padding=kernel // 2)


def _layout_error(source: Source, what: str, layout: str = "body_pose_model.pth"):
    from enginefarm.errors import ConfigError

    return ConfigError(
        f"{source.path}: not the layout of {layout} (no {what})",
        hint=f"give lllyasviel's Annotators {layout} (the CMU net controlnet-aux loads)",
    )


def _cpm_heatmaps(source: Source) -> int:
    """How many heatmaps a one-branch CPM net (the hand and face nets share their layer names) gives: 22 for the
    hand's, 71 for the face's; 0 for another file."""
    state = source.state
    names = ("conv1_1", "conv5_3_CPM", "conv6_1_CPM", "conv6_2_CPM", "Mconv1_stage2")
    if not all(f"{name}.weight" in state for name in names):
        return 0
    return int(getattr(state["conv6_2_CPM.weight"], "shape", (0,))[0])


def is_openpose_hand(source: Source) -> bool:
    return _cpm_heatmaps(source) == 22


def is_openpose_face(source: Source) -> bool:
    return _cpm_heatmaps(source) == FACE_HEATMAPS


def build_openpose_hand(source: Source) -> Parts:
    """hand_pose_model.pth: the hand net (one branch, six stages) as the `hand` part of an openpose_hand filter,
    which runs the body filter it names (`uses.body`, default "openpose") and adds each person's hands."""
    module, stages, joints = _cpm_net(source, "hand_pose_model.pth", 22)
    part = Part(
        module=module,
        inputs={"image": (1, 3, "side", "side")},
        outputs={"heatmaps": (1, joints, "map_side", "map_side")},
        profile={"side": HAND_PROFILE},
        ranges={"image": (-0.5, 0.5)},
    )
    details = {
        "task": "openpose_hand",
        "resolution": RESOLUTION,
        "multiple": MULTIPLE,
        "stride": STRIDE,
        "box": BOX,
        "scales": list(HAND_SCALES),
        "stages": stages,
        "uses": {"body": "openpose"},
    }
    return Parts("OpenposeHand", "preprocessor", {"hand": part}, details)


def build_openpose_face(source: Source) -> Parts:
    """facenet.pth: the face net (the hand net's layers, 71 heatmaps: 70 landmarks and the background) as the
    `face` part of an openpose_face filter, which runs the body filter it names (`uses.body`, default "openpose")
    and adds each person's face; its input is always a 384-pixel square crop."""
    module, stages, landmarks = _cpm_net(source, "facenet.pth", FACE_HEATMAPS)
    side = FACE_SIDE
    part = Part(
        module=module,
        inputs={"image": (1, 3, "side", "side")},
        outputs={"heatmaps": (1, landmarks, "map_side", "map_side")},
        profile={"side": (side, side, side)},
        ranges={"image": (-0.5, 0.5)},
    )
    details = {
        "task": "openpose_face",
        "resolution": RESOLUTION,
        "multiple": MULTIPLE,
        "stride": STRIDE,
        "side": side,
        "stages": stages,
        "uses": {"body": "openpose"},
    }
    return Parts("OpenposeFace", "preprocessor", {"face": part}, details)


def _vgg_features(module, image):
    """The VGG backbone every CMU net starts with: `module.groups` of ReLU convolutions, a 2x2 max-pool between
    groups (stride 8 after the fourth)."""
    from torch.nn import functional

    x = image
    for index, group in enumerate(module.groups):
        if index:
            x = functional.max_pool2d(x, 2, 2)
        for name in group:
            x = functional.relu(getattr(module, name)(x))
    return x


def _cpm_net(source: Source, layout: str, heatmaps: int):
    """The hand or face net (CMU's one-branch CPM: a VGG backbone at stride 8, then stages refining the heatmaps
    from the features and the last stage's maps) loaded from the file: (module, stages, heatmap channels)."""
    import torch
    from torch.nn import functional

    state = source.state
    stages = max((int(m.group(1)) for k in state if (m := _HAND_STAGE.fullmatch(k))), default=1)

    class CpmNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.groups = [list(group) for group in HAND_BACKBONE]
            self.stages = [["conv6_1_CPM", "conv6_2_CPM"]]
            self.stages += [[f"Mconv{i}_stage{s}" for i in range(1, 8)] for s in range(2, stages + 1)]
            for name in [n for names in self.groups + self.stages for n in names]:
                self.add_module(name, _conv(source, name, layout))

        def forward(self, image):
            x = _vgg_features(self, image)
            features, heatmaps = x, x
            for index, names in enumerate(self.stages):
                y = features if index == 0 else torch.cat([heatmaps, features], 1)
                for position, name in enumerate(names):
                    y = getattr(self, name)(y)
                    y = functional.relu(y) if position < len(names) - 1 else y
                heatmaps = y
            return heatmaps

    hint = f"give lllyasviel's Annotators {layout} (the CMU net controlnet-aux loads)"
    module = load_layout(CpmNet(), source, layout, hint)
    joints = int(state[f"{(['conv6_2_CPM'] + [f'Mconv7_stage{s}' for s in range(2, stages + 1)])[-1]}.weight"].shape[0])
    if joints != heatmaps:
        raise _layout_error(source, f"{heatmaps} heatmap channels (it has {joints})", layout)
    return module, stages, joints


ARCHITECTURES = [
    Architecture("Openpose body (body_pose_model.pth)", "preprocessor", is_openpose_body, build_openpose_body),
    Architecture("Openpose hands (hand_pose_model.pth)", "preprocessor", is_openpose_hand, build_openpose_hand),
    Architecture("Openpose face (facenet.pth)", "preprocessor", is_openpose_face, build_openpose_face),
]
