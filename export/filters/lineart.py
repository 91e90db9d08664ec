"""Line art for ControlNet (lineart, lineart_coarse): lllyasviel's `sk_model.pth` / `sk_model2.pth`, controlnet-aux's
LineartDetector `Generator(3, 1, 3)`: a reflection-padded 7x7 convolution, two stride-2 convolutions, residual blocks,
two transposed convolutions back and a 7x7 convolution to one sigmoid channel, instance norm throughout. The graph
takes the RGB image in [0, 1] and gives the line probability; the control image is its inverse (white lines on
black), as controlnet-aux's `255 - detected_map`. Widths and the residual block count are read from the file."""

from __future__ import annotations

import re

from enginefarm.errors import ConfigError

from .registry import Architecture, Part, Parts, Source, load_layout

RESOLUTION = 512  # controlnet-aux's detect resolution; sides multiples of 64 (resize_image)
MULTIPLE = 64
SIDE_PROFILE = (MULTIPLE, RESOLUTION, 2 * RESOLUTION)
_BLOCK = re.compile(r"model2\.(\d+)\.conv_block\.1\.weight")
_KEYS = ("model0.1.weight", "model1.0.weight", "model1.3.weight", "model3.0.weight", "model3.3.weight")


def is_lineart(source: Source) -> bool:
    state = source.state
    return all(k in state for k in (*_KEYS, "model4.1.weight")) and any(_BLOCK.fullmatch(k) for k in state)


def build_lineart(source: Source) -> Parts:
    from torch import nn

    state = source.state
    width = int(state["model0.1.weight"].shape[0])
    blocks = 1 + max(int(m.group(1)) for k in state if (m := _BLOCK.fullmatch(k)))
    if int(state["model4.1.weight"].shape[0]) != 1 or int(state["model0.1.weight"].shape[1]) != 3:
        raise ConfigError(f"{source.path}: a line-art generator that is not RGB in, one channel out")

    def norm_relu(channels: int) -> list:
        return [nn.InstanceNorm2d(channels), nn.ReLU()]

    class Residual(nn.Module):
        def __init__(self, channels: int):
            super().__init__()
            self.conv_block = nn.Sequential(
                nn.ReflectionPad2d(1),
                nn.Conv2d(channels, channels, 3),
                *norm_relu(channels),
                nn.ReflectionPad2d(1),
                nn.Conv2d(channels, channels, 3),
                nn.InstanceNorm2d(channels),
            )

        def forward(self, x):
            return x + self.conv_block(x)

    class Lines(nn.Module):
        def __init__(self):
            super().__init__()
            w1, w2, w4 = width, 2 * width, 4 * width
            self.model0 = nn.Sequential(nn.ReflectionPad2d(3), nn.Conv2d(3, w1, 7), *norm_relu(w1))
            self.model1 = nn.Sequential(
                nn.Conv2d(w1, w2, 3, stride=2, padding=1),
                *norm_relu(w2),
                nn.Conv2d(w2, w4, 3, stride=2, padding=1),
                *norm_relu(w4),
            )
            self.model2 = nn.Sequential(*(Residual(w4) for _ in range(blocks)))
            self.model3 = nn.Sequential(
                nn.ConvTranspose2d(w4, w2, 3, stride=2, padding=1, output_padding=1),
                *norm_relu(w2),
                nn.ConvTranspose2d(w2, w1, 3, stride=2, padding=1, output_padding=1),
                *norm_relu(w1),
            )
            self.model4 = nn.Sequential(nn.ReflectionPad2d(3), nn.Conv2d(w1, 1, 7), nn.Sigmoid())

        def forward(self, image):
            x = self.model4(self.model3(self.model2(self.model1(self.model0(image)))))
            return x[:, 0]

    hint = "give lllyasviel's Annotators sk_model.pth or sk_model2.pth (controlnet-aux's LineartDetector)"
    part = Part(
        module=load_layout(Lines(), source, "sk_model.pth", hint),
        inputs={"image": (1, 3, "height", "width")},
        outputs={"lines": (1, "height", "width")},
        profile={"height": SIDE_PROFILE, "width": SIDE_PROFILE},
        ranges={"image": (0.0, 1.0)},
    )
    details = {
        "task": "lineart",
        "resolution": RESOLUTION,
        "multiple": MULTIPLE,
        "mean": [0.0, 0.0, 0.0],
        "std": [1.0, 1.0, 1.0],
        "resample": "bicubic",
        "output": "inverted",  # white lines on black: 1 - the line probability
        "max_side": SIDE_PROFILE[2],
        "width": width,
        "blocks": blocks,
    }
    return Parts("LineartGenerator", "preprocessor", {"lines": part}, details)


ARCHITECTURES = [
    Architecture("Line art (sk_model.pth / sk_model2.pth)", "preprocessor", is_lineart, build_lineart),
]
