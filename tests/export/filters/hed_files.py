"""ControlNetHED.pth as lllyasviel's Annotators ship it (controlnet-aux's ControlNetHED_Apache2 state dict: `norm`,
`blockB.convs.N`, `blockB.projection`), narrow and seeded, and controlnet-aux's HEDdetector steps re-created as the
reference (controlnet-aux itself pulls timm, scikit-image and more; its HED code is plain torch and numpy)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

LAYERS = (2, 2, 3, 3, 3)  # convolutions per block, as the published network has them


def reference_network(widths=(8, 16, 16, 32, 32)):
    """controlnet-aux's ControlNetHED_Apache2 with the published block structure at `widths` channels."""
    import torch

    class DoubleConvBlock(torch.nn.Module):
        def __init__(self, input_channel, output_channel, layer_number):
            super().__init__()
            self.convs = torch.nn.Sequential()
            self.convs.append(torch.nn.Conv2d(input_channel, output_channel, kernel_size=(3, 3), padding=1))
            for _ in range(1, layer_number):
                self.convs.append(torch.nn.Conv2d(output_channel, output_channel, kernel_size=(3, 3), padding=1))
            self.projection = torch.nn.Conv2d(output_channel, 1, kernel_size=(1, 1))

        def forward(self, x, down_sampling=False):
            h = x
            if down_sampling:
                h = torch.nn.functional.max_pool2d(h, kernel_size=(2, 2), stride=(2, 2))
            for conv in self.convs:
                h = torch.nn.functional.relu(conv(h))
            return h, self.projection(h)

    class ControlNetHED(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.Parameter(torch.zeros(size=(1, 3, 1, 1)))
            cins = (3, *widths[:-1])
            for b in range(5):
                setattr(self, f"block{b + 1}", DoubleConvBlock(cins[b], widths[b], LAYERS[b]))

        def forward(self, x):
            h = x - self.norm
            projections = []
            for b in range(5):
                h, projection = getattr(self, f"block{b + 1}")(h, down_sampling=b > 0)
                projections.append(projection)
            return projections

    return ControlNetHED()


def write_hed_file(path: Path, seed: int = 0):
    """A seeded narrow network saved as ControlNetHED.pth (torch.save of the bare state dict); its torch module."""
    import torch

    torch.manual_seed(seed)
    network = reference_network().eval()
    with torch.no_grad():
        network.norm.copy_(torch.tensor([[[[123.0]], [[117.0]], [[104.0]]]]))
        for name, param in network.named_parameters():
            if name.endswith("weight"):
                fan_in = param[0].numel()
                param.copy_(
                    torch.randn(param.shape) * (2 / fan_in) ** 0.5 / (60.0 if name == "block1.convs.0.weight" else 1)
                )
    torch.save(network.state_dict(), str(path))
    return network


def hed_reference(network, image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """HEDdetector's steps on a float photo: resized to `size` (antialiased bicubic, where controlnet-aux uses
    cv2's INTER_AREA/LANCZOS4 on 8 bits), 0..255 into the network, each edge map resized with cv2.resize
    INTER_LINEAR, the sigmoid of their mean; back to the photo's size (antialiased bilinear), three channels."""
    import cv2
    import torch

    functional = torch.nn.functional
    height, width = image.shape[:2]
    x = torch.from_numpy(image).permute(2, 0, 1)[None]
    x = functional.interpolate(x, size=size, mode="bicubic", antialias=True, align_corners=False) * 255
    with torch.no_grad():
        edges = [e.numpy().astype(np.float32)[0, 0] for e in network(x)]
    edges = np.stack([cv2.resize(e, (size[1], size[0]), interpolation=cv2.INTER_LINEAR) for e in edges], axis=2)
    edge = torch.from_numpy(1 / (1 + np.exp(-np.mean(edges, axis=2).astype(np.float64)))).float()
    edge = functional.interpolate(edge[None, None], size=(height, width), mode="bilinear", antialias=True)
    return edge[0, 0, :, :, None].repeat(1, 1, 3).numpy()


def lineart_reference_network(width: int = 8, blocks: int = 2):
    """controlnet-aux's line-art Generator(3, 1, blocks) at `width` channels (the published: 64, 3 blocks)."""
    from torch import nn

    def norm_relu(channels):
        return [nn.InstanceNorm2d(channels), nn.ReLU(inplace=True)]

    class ResidualBlock(nn.Module):
        def __init__(self, features):
            super().__init__()
            self.conv_block = nn.Sequential(
                nn.ReflectionPad2d(1),
                nn.Conv2d(features, features, 3),
                *norm_relu(features),
                nn.ReflectionPad2d(1),
                nn.Conv2d(features, features, 3),
                nn.InstanceNorm2d(features),
            )

        def forward(self, x):
            return x + self.conv_block(x)

    class Generator(nn.Module):
        def __init__(self):
            super().__init__()
            self.model0 = nn.Sequential(nn.ReflectionPad2d(3), nn.Conv2d(3, width, 7), *norm_relu(width))
            down, features = [], width
            for _ in range(2):
                down += [nn.Conv2d(features, features * 2, 3, stride=2, padding=1), *norm_relu(features * 2)]
                features *= 2
            self.model1 = nn.Sequential(*down)
            self.model2 = nn.Sequential(*(ResidualBlock(features) for _ in range(blocks)))
            up = []
            for _ in range(2):
                up += [
                    nn.ConvTranspose2d(features, features // 2, 3, stride=2, padding=1, output_padding=1),
                    *norm_relu(features // 2),
                ]
                features //= 2
            self.model3 = nn.Sequential(*up)
            self.model4 = nn.Sequential(nn.ReflectionPad2d(3), nn.Conv2d(width, 1, 7), nn.Sigmoid())

        def forward(self, x):
            return self.model4(self.model3(self.model2(self.model1(self.model0(x)))))

    return Generator()


def write_lineart_file(path: Path, seed: int = 0):
    """A seeded narrow line-art generator saved as sk_model.pth (a bare state dict); its torch module."""
    import torch

    torch.manual_seed(seed)
    network = lineart_reference_network().eval()
    torch.save(network.state_dict(), str(path))
    return network


def lineart_reference(network, image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """LineartDetector's steps on a float photo: resized to `size` (antialiased bicubic), [0, 1] into the network,
    its line map back to the photo's size (antialiased bilinear) and inverted, three channels."""
    import torch

    functional = torch.nn.functional
    x = torch.from_numpy(image).permute(2, 0, 1)[None]
    x = functional.interpolate(x, size=size, mode="bicubic", antialias=True, align_corners=False)
    with torch.no_grad():
        line = network(x)
    line = functional.interpolate(line, size=image.shape[:2], mode="bilinear", antialias=True)
    return (1 - line[0, 0, :, :, None]).repeat(1, 1, 3).numpy()
