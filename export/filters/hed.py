"""Soft edges for ControlNet (softedge_hed): lllyasviel's Apache-2 HED (`ControlNetHED.pth`, controlnet-aux's
`ControlNetHED_Apache2`): five VGG-style blocks, each with a 1x1 projection to one edge map. The graph takes the RGB
image in [0, 255] (as controlnet-aux feeds it), resizes each block's edge map to the input's size (bilinear, half-pixel
centres: cv2.resize's INTER_LINEAR), averages them and applies the sigmoid: the soft edge map in [0, 1]. The widths
are read from the file's shapes."""

from __future__ import annotations

import re

from .registry import Architecture, Part, Parts, Source, load_layout

# controlnet-aux's HEDdetector: the short side to 512, each side a multiple of 64
RESOLUTION = 512
MULTIPLE = 64
SIDE_PROFILE = (MULTIPLE, RESOLUTION, 2 * RESOLUTION)
BLOCKS = 5
_CONV = re.compile(r"block(\d)\.convs\.(\d+)\.weight")


def is_hed(source: Source) -> bool:
    state = source.state
    if "norm" not in state or getattr(state["norm"], "shape", None) != (1, 3, 1, 1):
        return False
    return all(f"block{b}.convs.0.weight" in state and f"block{b}.projection.weight" in state for b in range(1, 6))


def build_hed(source: Source) -> Parts:
    import torch
    from torch.nn import functional

    state = source.state
    layers = {b: 1 + max(int(m.group(2)) for k in state if (m := _CONV.fullmatch(k)) and int(m.group(1)) == b)
              for b in range(1, BLOCKS + 1)}  # fmt: skip
    widths = [int(state[f"block{b}.convs.0.weight"].shape[0]) for b in range(1, BLOCKS + 1)]

    class Block(torch.nn.Module):
        def __init__(self, cin: int, cout: int, count: int):
            super().__init__()
            self.convs = torch.nn.Sequential(
                *(torch.nn.Conv2d(cin if i == 0 else cout, cout, 3, padding=1) for i in range(count))
            )
            self.projection = torch.nn.Conv2d(cout, 1, 1)

        def forward(self, x, down: bool):
            if down:
                x = functional.max_pool2d(x, kernel_size=2, stride=2)
            for conv in self.convs:
                x = functional.relu(conv(x))
            return x, self.projection(x)

    class SoftEdges(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.Parameter(torch.zeros(1, 3, 1, 1))
            cins = [3, *widths[:-1]]
            for b in range(1, BLOCKS + 1):
                setattr(self, f"block{b}", Block(cins[b - 1], widths[b - 1], layers[b]))

        def forward(self, image):
            x = image - self.norm
            maps = []
            for b in range(1, BLOCKS + 1):
                x, projection = getattr(self, f"block{b}")(x, b > 1)
                maps.append(functional.interpolate(projection, size=image.shape[2:], mode="bilinear"))
            return torch.sigmoid(torch.cat(maps, 1).mean(1))

    hint = "give lllyasviel's Annotators ControlNetHED.pth (the Apache-2 HED controlnet-aux loads)"
    part = Part(
        module=load_layout(SoftEdges(), source, "ControlNetHED.pth", hint),
        inputs={"image": (1, 3, "height", "width")},
        outputs={"edges": (1, "height", "width")},
        profile={"height": SIDE_PROFILE, "width": SIDE_PROFILE},
        ranges={"image": (0.0, 255.0)},
    )
    details = {
        "task": "softedge",
        "resolution": RESOLUTION,
        "multiple": MULTIPLE,
        "mean": [0.0, 0.0, 0.0],
        "std": [1 / 255] * 3,  # the network takes 0..255
        "resample": "bicubic",
        "output": "as_is",  # already in [0, 1]: no min-max
        "max_side": SIDE_PROFILE[2],
        "widths": widths,
    }
    return Parts("ControlNetHED", "preprocessor", {"edges": part}, details)


ARCHITECTURES = [Architecture("HED soft edges (ControlNetHED.pth)", "preprocessor", is_hed, build_hed)]
