"""RetinaFace in torch at facexlib's key layout (detection_Resnet50_Final.pth, detection_mobilenet0.25_Final.pth),
sized from a state dict's shapes: a ResNet-50 or MobileNet-0.25 body, a 3-level FPN, an SSH context module per level
and 1×1 heads for scores, boxes and 5 landmarks per anchor. The module takes the image as the runtime holds it (RGB in
[0, 1]) and does facexlib's preparation itself: BGR, 0-255, the mean (104, 117, 123) taken off."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

# the mean facexlib takes off the BGR image in 0-255
BGR_MEAN = (104.0, 117.0, 123.0)
# MobileNet-0.25's strides, stage by stage (the keys do not say them): stage1's first conv, then each depthwise block
MOBILENET_STRIDES = {"stage1": (2, 1, 2, 1, 2, 1), "stage2": (2, 1, 1, 1, 1, 1), "stage3": (2, 1)}


def _conv(weight: torch.Tensor, stride: int = 1, groups: int = 1, bias: bool = False) -> nn.Conv2d:
    out_ch, in_per_group, k, _ = weight.shape
    return nn.Conv2d(in_per_group * groups, out_ch, k, stride, k // 2, groups=groups, bias=bias)


def _conv_bn(state, prefix: str, stride: int = 1, leaky: float | None = None, groups: int = 1) -> nn.Sequential:
    """facexlib's conv_bn family: `prefix.0` conv, `prefix.1` BatchNorm, then LeakyReLU unless `leaky` is None."""
    weight = state[f"{prefix}.0.weight"]
    layers: list[nn.Module] = [_conv(weight, stride, groups), nn.BatchNorm2d(weight.shape[0])]
    if leaky is not None:
        layers.append(nn.LeakyReLU(leaky))
    return nn.Sequential(*layers)


class Bottleneck(nn.Module):
    """torchvision's ResNet bottleneck (stride on the 3×3), sized from `prefix`'s weights."""

    def __init__(self, state, prefix: str, stride: int):
        super().__init__()
        self.conv1 = _conv(state[f"{prefix}.conv1.weight"])
        self.bn1 = nn.BatchNorm2d(state[f"{prefix}.bn1.weight"].shape[0])
        self.conv2 = _conv(state[f"{prefix}.conv2.weight"], stride)
        self.bn2 = nn.BatchNorm2d(state[f"{prefix}.bn2.weight"].shape[0])
        self.conv3 = _conv(state[f"{prefix}.conv3.weight"])
        self.bn3 = nn.BatchNorm2d(state[f"{prefix}.bn3.weight"].shape[0])
        self.downsample = None
        if f"{prefix}.downsample.0.weight" in state:
            weight = state[f"{prefix}.downsample.0.weight"]
            self.downsample = nn.Sequential(nn.Conv2d(weight.shape[1], weight.shape[0], 1, stride, bias=False))
            self.downsample.append(nn.BatchNorm2d(weight.shape[0]))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + (self.downsample(x) if self.downsample is not None else x))


class ResNetBody(nn.Module):
    def __init__(self, state):
        super().__init__()
        self.conv1 = nn.Conv2d(3, state["body.conv1.weight"].shape[0], 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(state["body.conv1.weight"].shape[0])
        for index in range(1, 5):
            blocks = 1 + max(int(k.split(".")[2]) for k in state if k.startswith(f"body.layer{index}."))
            stride = 1 if index == 1 else 2
            layer = nn.Sequential(
                *(Bottleneck(state, f"body.layer{index}.{b}", stride if b == 0 else 1) for b in range(blocks))
            )
            setattr(self, f"layer{index}", layer)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        c2 = self.layer2(self.layer1(x))
        c3 = self.layer3(c2)
        return c2, c3, self.layer4(c3)


class MobileNetBody(nn.Module):
    def __init__(self, state):
        super().__init__()
        for stage, strides in MOBILENET_STRIDES.items():
            blocks: list[nn.Module] = []
            for index, stride in enumerate(strides):
                prefix = f"body.{stage}.{index}"
                if stage == "stage1" and index == 0:
                    blocks.append(_conv_bn(state, prefix, stride, leaky=0.1))
                    continue
                depthwise = state[f"{prefix}.0.weight"]
                pointwise = state[f"{prefix}.3.weight"]
                blocks.append(
                    nn.Sequential(
                        _conv(depthwise, stride, groups=depthwise.shape[0]),
                        nn.BatchNorm2d(depthwise.shape[0]),
                        nn.LeakyReLU(0.1),
                        _conv(pointwise),
                        nn.BatchNorm2d(pointwise.shape[0]),
                        nn.LeakyReLU(0.1),
                    )
                )
            setattr(self, stage, nn.Sequential(*blocks))

    def forward(self, x):
        c2 = self.stage1(x)
        c3 = self.stage2(c2)
        return c2, c3, self.stage3(c3)


class FPN(nn.Module):
    def __init__(self, state, leaky: float):
        super().__init__()
        for name in ("output1", "output2", "output3"):
            setattr(self, name, _conv_bn(state, f"fpn.{name}", leaky=leaky))
        self.merge1 = _conv_bn(state, "fpn.merge1", leaky=leaky)
        self.merge2 = _conv_bn(state, "fpn.merge2", leaky=leaky)

    def forward(self, c2, c3, c4):
        p4 = self.output3(c4)
        p3 = self.merge2(self.output2(c3) + F.interpolate(p4, size=c3.shape[2:], mode="nearest"))
        p2 = self.merge1(self.output1(c2) + F.interpolate(p3, size=c2.shape[2:], mode="nearest"))
        return p2, p3, p4


class SSH(nn.Module):
    def __init__(self, state, prefix: str, leaky: float):
        super().__init__()
        self.conv3X3 = _conv_bn(state, f"{prefix}.conv3X3")
        self.conv5X5_1 = _conv_bn(state, f"{prefix}.conv5X5_1", leaky=leaky)
        self.conv5X5_2 = _conv_bn(state, f"{prefix}.conv5X5_2")
        self.conv7X7_2 = _conv_bn(state, f"{prefix}.conv7X7_2", leaky=leaky)
        self.conv7x7_3 = _conv_bn(state, f"{prefix}.conv7x7_3")

    def forward(self, x):
        five = self.conv5X5_1(x)
        seven = self.conv7X7_2(five)
        return F.relu(torch.cat([self.conv3X3(x), self.conv5X5_2(five), self.conv7x7_3(seven)], dim=1))


class Head(nn.Module):
    def __init__(self, weight: torch.Tensor, values: int):
        super().__init__()
        self.conv1x1 = _conv(weight, bias=True)
        self.values = values

    def forward(self, x):
        out = self.conv1x1(x).permute(0, 2, 3, 1)
        return out.reshape(out.shape[0], -1, self.values)


class RetinaFace(nn.Module):
    """image [1, 3, H, W] RGB in [0, 1] → loc [1, P, 4], conf [1, P, 2] (softmax), landmarks [1, P, 10], P anchors
    in facexlib's order (level, row, column, anchor size)."""

    def __init__(self, state):
        super().__init__()
        self.body = ResNetBody(state) if "body.conv1.weight" in state else MobileNetBody(state)
        leaky = 0.1 if state["fpn.output1.0.weight"].shape[0] <= 64 else 0.0
        self.fpn = FPN(state, leaky)
        self.ssh1, self.ssh2, self.ssh3 = (SSH(state, f"ssh{i}", leaky) for i in (1, 2, 3))
        heads = {"ClassHead": 2, "BboxHead": 4, "LandmarkHead": 10}
        for name, values in heads.items():
            setattr(self, name, nn.ModuleList(Head(state[f"{name}.{i}.conv1x1.weight"], values) for i in range(3)))
        self.register_buffer("mean", torch.tensor(BGR_MEAN).view(1, 3, 1, 1), persistent=False)

    def forward(self, image):
        x = image.flip(1) * 255.0 - self.mean
        features = [ssh(p) for ssh, p in zip((self.ssh1, self.ssh2, self.ssh3), self.fpn(*self.body(x)), strict=True)]
        loc = torch.cat([head(f) for head, f in zip(self.BboxHead, features, strict=True)], dim=1)
        conf = torch.cat([head(f) for head, f in zip(self.ClassHead, features, strict=True)], dim=1)
        landmarks = torch.cat([head(f) for head, f in zip(self.LandmarkHead, features, strict=True)], dim=1)
        return loc, F.softmax(conf, dim=-1), landmarks
