"""table5_pidinet.pth as lllyasviel's Annotators ship it (the PiDiNet authors' training checkpoint: `epoch`,
`state_dict` with `module.`-prefixed keys), narrow and seeded, and controlnet-aux's PidiNetDetector steps re-created
as the reference: the network with its pixel-difference convolutions run as PDC functions (not converted), fed BGR.
controlnet-aux itself pulls timm, scikit-image and more; its pidi/model.py is plain torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np

CARV4 = ("cd", "ad", "rd", "cv") * 4


def pdc(kind: str, x, weight, groups: int):
    """A pixel-difference convolution as PiDiNet's training code computes it (3x3 kernels, dilation 1)."""
    import torch
    from torch.nn import functional

    if kind == "cv":
        return functional.conv2d(x, weight, padding=1, groups=groups)
    if kind == "cd":  # each tap's difference to the centre pixel: the plain conv minus the centre times the sum
        centre = functional.conv2d(x, weight.sum(dim=(2, 3), keepdim=True), groups=groups)
        return functional.conv2d(x, weight, padding=1, groups=groups) - centre
    flat = weight.reshape(*weight.shape[:2], 9)
    if kind == "ad":  # each tap's difference to its clockwise neighbour
        neighbour = flat[:, :, [3, 0, 1, 6, 4, 2, 7, 8, 5]]
        return functional.conv2d(x, (flat - neighbour).reshape(weight.shape), padding=1, groups=groups)
    # rd: the 5x5 window's outer ring minus its inner ring, weighted by the 8 outer taps
    window = torch.zeros(*weight.shape[:2], 25)
    window[:, :, [0, 2, 4, 10, 14, 20, 22, 24]] = flat[:, :, 1:]
    window[:, :, [6, 7, 8, 11, 13, 16, 17, 18]] = -flat[:, :, 1:]
    return functional.conv2d(x, window.reshape(*weight.shape[:2], 5, 5), padding=2, groups=groups)


def reference_network(width: int = 6, dilation: int = 4):
    """PiDiNet(width, carv4, dil=dilation, sa=True) with the published module names (table5_pidinet: 60, 24)."""
    import torch
    from torch import nn
    from torch.nn import functional

    class PDCConv(nn.Module):
        def __init__(self, kind, cin, cout, groups):
            super().__init__()
            self.kind, self.groups = kind, groups
            self.weight = nn.Parameter(torch.randn(cout, cin // groups, 3, 3) * 0.3)

        def forward(self, x):
            return pdc(self.kind, x, self.weight, self.groups)

    class PDCBlock(nn.Module):
        def __init__(self, kind, cin, cout, stride):
            super().__init__()
            self.stride = stride
            if stride > 1:
                self.pool = nn.MaxPool2d(2, 2)
                self.shortcut = nn.Conv2d(cin, cout, 1)
            self.conv1 = PDCConv(kind, cin, cin, cin)
            self.conv2 = nn.Conv2d(cin, cout, 1, bias=False)

        def forward(self, x):
            if self.stride > 1:
                x = self.pool(x)
            y = self.conv2(torch.relu(self.conv1(x)))
            return y + (self.shortcut(x) if self.stride > 1 else x)

    class CDCM(nn.Module):
        def __init__(self, cin, cout):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 1)
            self.conv2_1 = nn.Conv2d(cout, cout, 3, dilation=5, padding=5, bias=False)
            self.conv2_2 = nn.Conv2d(cout, cout, 3, dilation=7, padding=7, bias=False)
            self.conv2_3 = nn.Conv2d(cout, cout, 3, dilation=9, padding=9, bias=False)
            self.conv2_4 = nn.Conv2d(cout, cout, 3, dilation=11, padding=11, bias=False)

        def forward(self, x):
            x = self.conv1(torch.relu(x))
            return self.conv2_1(x) + self.conv2_2(x) + self.conv2_3(x) + self.conv2_4(x)

    class CSAM(nn.Module):
        def __init__(self, channels):
            super().__init__()
            self.conv1 = nn.Conv2d(channels, 4, 1)
            self.conv2 = nn.Conv2d(4, 1, 3, padding=1, bias=False)

        def forward(self, x):
            return x * torch.sigmoid(self.conv2(self.conv1(torch.relu(x))))

    class MapReduce(nn.Module):
        def __init__(self, channels):
            super().__init__()
            self.conv = nn.Conv2d(channels, 1, 1)

        def forward(self, x):
            return self.conv(x)

    class PiDiNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.init_block = PDCConv(CARV4[0], 3, width, 1)
            plan = [(1, 3, 1), (2, 4, 2), (3, 4, 4), (4, 4, 4)]  # stage, blocks, width multiple
            cin, layer = width, 1
            for stage, count, multiple in plan:
                for i in range(1, count + 1):
                    stride = 2 if stage > 1 and i == 1 else 1
                    setattr(self, f"block{stage}_{i}", PDCBlock(CARV4[layer], cin, width * multiple, stride))
                    cin, layer = width * multiple, layer + 1
            fuse = (width, 2 * width, 4 * width, 4 * width)
            self.dilations = nn.ModuleList(CDCM(c, dilation) for c in fuse)
            self.attentions = nn.ModuleList(CSAM(dilation) for _ in fuse)
            self.conv_reduces = nn.ModuleList(MapReduce(dilation) for _ in fuse)
            self.classifier = nn.Conv2d(4, 1, 1)

        def forward(self, x):
            height, width_ = x.shape[2:]
            x = self.init_block(x)
            stages = []
            for stage, count in ((1, 3), (2, 4), (3, 4), (4, 4)):
                for i in range(1, count + 1):
                    x = getattr(self, f"block{stage}_{i}")(x)
                stages.append(x)
            edges = [
                functional.interpolate(
                    self.conv_reduces[i](self.attentions[i](self.dilations[i](s))), (height, width_), mode="bilinear"
                )
                for i, s in enumerate(stages)
            ]
            fused = self.classifier(torch.cat(edges, 1))
            return [torch.sigmoid(e) for e in (*edges, fused)]

    return PiDiNet()


def write_pidinet_file(path: Path, seed: int = 0):
    """A seeded narrow PiDiNet saved as table5_pidinet.pth is (epoch, `module.`-prefixed state_dict); its module."""
    import torch

    torch.manual_seed(seed)
    network = reference_network().eval()
    calibrate(network)
    state = {f"module.{k}": v for k, v in network.state_dict().items()}
    torch.save({"epoch": 14, "state_dict": state}, str(path))
    return network


def calibrate(network) -> None:
    """The fused classifier rescaled so a test scene's edge map spans [0, 1] (random weights give a flat ~0.3):
    its logits centred on their 80th percentile, spread to a standard deviation of 4."""
    import torch

    from ...filters.scenes import scene

    photo = torch.from_numpy(scene(99, height=64, width=96)).permute(2, 0, 1)[None].flip(1)
    with torch.no_grad():
        logits = torch.logit(network(photo)[-1].double().clamp(1e-12, 1 - 1e-12))
        scale = 4 / float(logits.std())
        network.classifier.weight *= scale
        network.classifier.bias.copy_((network.classifier.bias - float(logits.quantile(0.8))) * scale)


def pidinet_edges(network, image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """PidiNetDetector's edge map at the detect size: the photo resized to `size` (antialiased bicubic, where
    controlnet-aux uses cv2's INTER_AREA/LANCZOS4 on 8 bits), BGR in [0, 1] into the network, its fused output."""
    import torch

    functional = torch.nn.functional
    x = torch.from_numpy(image).permute(2, 0, 1)[None]
    x = functional.interpolate(x, size=size, mode="bicubic", antialias=True, align_corners=False)
    with torch.no_grad():
        return network(x.flip(1))[-1][0, 0].numpy()


def to_photo_size(edge: np.ndarray, height: int, width: int) -> np.ndarray:
    """The detect-size map back to the photo's size (antialiased bilinear), three channels."""
    import torch

    edge = torch.nn.functional.interpolate(
        torch.from_numpy(edge.astype(np.float32))[None, None], size=(height, width), mode="bilinear", antialias=True
    )
    return edge[0, 0, :, :, None].repeat(1, 1, 3).numpy()
