"""Soft edges for ControlNet (softedge_pidinet, and through the runtime's modes softedge_pidsafe / scribble_pidinet):
Zhuo Su's PiDiNet, `table5_pidinet.pth` as lllyasviel's Annotators ship it (controlnet-aux's PidiNetDetector: the
training checkpoint, `state_dict` with `module.` prefixes, which reading.unwrap takes off).

PiDiNet's layers are pixel-difference convolutions (PDC): "cd" (central: each tap minus the centre), "ad" (angular:
each tap minus its clockwise neighbour) and "rd" (radial: the outer ring of a 5x5 window minus the inner ring). Each
is linear in the input, so it is one plain convolution with a rearranged kernel, as the authors' `convert_pidinet`
does for inference: cd → the 3x3 kernel with its centre minus the kernel's sum, ad → the kernel minus its clockwise
rotation of taps, rd → a 5x5 kernel (outer ring +w, inner ring -w, centre 0) at padding 2. The graph holds only
those plain convolutions.

The file does not say which PDC each layer is: table5's networks (pidinet, -small, -tiny) are all the "carv4"
pattern (cd, ad, rd, cv per stage), which is assumed. The base width (60; 30 and 20 for -small/-tiny), the
dilation module's width (24) and whether the attention (CSAM) and dilation (CDCM) modules are present are read from
the keys and shapes. controlnet-aux feeds the network BGR in [0, 1]; the graph takes RGB in [0, 1] (the first
kernel's input channels are reversed: the same sums) and gives the fused edge probability [1, height, width]."""

from __future__ import annotations

from enginefarm.errors import ConfigError

from .registry import Architecture, Part, Parts, Source, load_layout

RESOLUTION = 512  # controlnet-aux's detect resolution; sides multiples of 64 (resize_image)
MULTIPLE = 64
SIDE_PROFILE = (MULTIPLE, RESOLUTION, 2 * RESOLUTION)
# table5's "carv4": the PDC of the first convolution, then of each block's depthwise convolution, in order
CARV4 = ("cd", "ad", "rd", "cv") * 4
# (name, stride) of the 15 blocks after the first convolution; a stride-2 block pools and widens
BLOCKS = tuple(
    (f"block{stage}_{i}", 2 if i == 1 and stage > 1 else 1)
    for stage, count in ((1, 3), (2, 4), (3, 4), (4, 4))
    for i in range(1, count + 1)
)
_KEYS = ("init_block.weight", "block1_1.conv1.weight", "block4_4.conv2.weight", "classifier.weight")
# the ad kernel's taps (row-major 3x3) each minus the tap clockwise before it
_CLOCKWISE = (3, 0, 1, 6, 4, 2, 7, 8, 5)
# rd: where the 3x3 kernel's 8 outer taps go in a 5x5 window, on the outer ring (+) and the inner ring (-)
_RING_OUT = (0, 2, 4, 10, 14, 20, 22, 24)
_RING_IN = (6, 7, 8, 11, 13, 16, 17, 18)


def is_pidinet(source: Source) -> bool:
    state = source.state
    return all(k in state for k in _KEYS) and "conv_reduces.0.conv.weight" in state


def plain_kernel(weight, pdc: str):
    """The plain convolution kernel equal to the pixel-difference convolution `pdc` with `weight` [out, in, 3, 3]:
    3x3 for cv/cd/ad (padding 1), 5x5 for rd (padding 2)."""
    import torch

    if tuple(weight.shape[2:]) != (3, 3):
        raise ConfigError(
            f"a PiDiNet kernel of {tuple(weight.shape[2:])} taps: this file looks converted already",
            hint="give the training checkpoint table5_pidinet.pth (3x3 pixel-difference kernels)",
        )
    if pdc == "cv":
        return weight.clone()
    if pdc == "cd":
        kernel = weight.clone()
        kernel[:, :, 1, 1] -= weight.sum(dim=(2, 3))
        return kernel
    flat = weight.reshape(*weight.shape[:2], 9)
    if pdc == "ad":
        return (flat - flat[:, :, list(_CLOCKWISE)]).reshape(weight.shape)
    if pdc == "rd":
        ring = torch.zeros(*weight.shape[:2], 25, dtype=weight.dtype)
        ring[:, :, list(_RING_OUT)] = flat[:, :, 1:]
        ring[:, :, list(_RING_IN)] = -flat[:, :, 1:]
        return ring.reshape(*weight.shape[:2], 5, 5)
    raise ValueError(f"unknown pixel-difference convolution {pdc!r}")


def converted_state(state: dict, pdcs: tuple[str, ...] = CARV4) -> dict:
    """The checkpoint's weights with each PDC kernel made plain; the first kernel's input channels reversed (BGR →
    RGB, so the graph takes RGB)."""
    converted = dict(state)
    converted["init_block.weight"] = plain_kernel(state["init_block.weight"], pdcs[0]).flip(1)
    for (name, _), pdc in zip(BLOCKS, pdcs[1:], strict=True):
        if f"{name}.conv1.weight" in state:  # a missing one is load_layout's message
            converted[f"{name}.conv1.weight"] = plain_kernel(state[f"{name}.conv1.weight"], pdc)
    return converted


def build_pidinet(source: Source) -> Parts:
    import torch
    from torch import nn
    from torch.nn import functional

    state = source.state
    width = int(state["init_block.weight"].shape[0])
    attention = "attentions.0.conv1.weight" in state
    dilation = int(state["dilations.0.conv1.weight"].shape[0]) if "dilations.0.conv1.weight" in state else None
    if int(state["init_block.weight"].shape[1]) != 3:
        raise ConfigError(f"{source.path}: a PiDiNet whose first convolution does not take RGB")
    converted = converted_state(state)

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, taps: int):
            super().__init__()
            self.stride = stride
            if stride > 1:
                self.shortcut = nn.Conv2d(cin, cout, 1)
            self.conv1 = nn.Conv2d(cin, cin, taps, padding=taps // 2, groups=cin, bias=False)
            self.conv2 = nn.Conv2d(cin, cout, 1, bias=False)

        def forward(self, x):
            if self.stride > 1:
                x = functional.max_pool2d(x, 2, 2)
            y = self.conv2(functional.relu(self.conv1(x)))
            return y + (self.shortcut(x) if self.stride > 1 else x)

    class Dilations(nn.Module):  # CDCM: four dilated 3x3 convolutions summed
        def __init__(self, cin: int, cout: int):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 1)
            for i, rate in enumerate((5, 7, 9, 11), start=1):
                setattr(self, f"conv2_{i}", nn.Conv2d(cout, cout, 3, dilation=rate, padding=rate, bias=False))

        def forward(self, x):
            x = self.conv1(functional.relu(x))
            return sum(getattr(self, f"conv2_{i}")(x) for i in range(1, 5))

    class Attention(nn.Module):  # CSAM: a one-channel spatial gate
        def __init__(self, channels: int):
            super().__init__()
            self.conv1 = nn.Conv2d(channels, 4, 1)
            self.conv2 = nn.Conv2d(4, 1, 3, padding=1, bias=False)

        def forward(self, x):
            return x * torch.sigmoid(self.conv2(self.conv1(functional.relu(x))))

    class Reduce(nn.Module):
        def __init__(self, channels: int):
            super().__init__()
            self.conv = nn.Conv2d(channels, 1, 1)

        def forward(self, x):
            return self.conv(x)

    class PiDiNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.init_block = nn.Conv2d(3, width, 3, padding=1, bias=False)
            channels, self.stages = width, []
            for (name, stride), pdc in zip(BLOCKS, CARV4[1:], strict=True):
                wider = channels * 2 if stride > 1 and channels < 4 * width else channels
                setattr(self, name, Block(channels, wider, stride, 5 if pdc == "rd" else 3))
                channels = wider
            fuse = (width, 2 * width, 4 * width, 4 * width)
            reduced = [dilation or c for c in fuse]
            if dilation is not None:
                self.dilations = nn.ModuleList(Dilations(c, dilation) for c in fuse)
            if attention:
                self.attentions = nn.ModuleList(Attention(c) for c in reduced)
            self.conv_reduces = nn.ModuleList(Reduce(c) for c in reduced)
            self.classifier = nn.Conv2d(4, 1, 1)

        def forward(self, image):
            x = self.init_block(image)
            stages = []
            for name, _ in BLOCKS:
                if name.endswith("_1") and name != "block1_1":
                    stages.append(x)
                x = getattr(self, name)(x)
            stages.append(x)
            edges = []
            for i, features in enumerate(stages):
                if dilation is not None:
                    features = self.dilations[i](features)
                if attention:
                    features = self.attentions[i](features)
                edge = self.conv_reduces[i](features)
                edges.append(functional.interpolate(edge, size=image.shape[2:], mode="bilinear"))
            return torch.sigmoid(self.classifier(torch.cat(edges, 1)))[:, 0]

    hint = "give lllyasviel's Annotators table5_pidinet.pth (controlnet-aux's PidiNetDetector)"
    module = load_layout(PiDiNet(), Source(source.path, converted, source.config), "table5_pidinet.pth", hint)
    part = Part(
        module=module,
        inputs={"image": (1, 3, "height", "width")},
        outputs={"edges": (1, "height", "width")},
        profile={"height": SIDE_PROFILE, "width": SIDE_PROFILE},
        ranges={"image": (0.0, 1.0)},
    )
    details = {
        "task": "softedge",
        "resolution": RESOLUTION,
        "multiple": MULTIPLE,
        "mean": [0.0, 0.0, 0.0],
        "std": [1.0, 1.0, 1.0],
        "resample": "bicubic",
        "output": "as_is",  # the fused edge probability, already in [0, 1]
        "max_side": SIDE_PROFILE[2],
        "width": width,
        "dilation": dilation,
        "attention": attention,
        "pdcs": "carv4",
    }
    return Parts("PiDiNet", "preprocessor", {"edges": part}, details)


ARCHITECTURES = [Architecture("PiDiNet soft edges (table5_pidinet.pth)", "preprocessor", is_pidinet, build_pidinet)]
