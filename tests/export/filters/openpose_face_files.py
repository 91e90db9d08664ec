"""facenet.pth as lllyasviel's Annotators ship it (controlnet-aux's FaceNet state dict: the layer names as keys),
narrow and seeded, and controlnet-aux's `faceDetect`, `Face.__call__`, `compute_peaks_from_heatmaps` and
`draw_facepose` re-created as the reference: its layer-by-layer forward, OpenCV's resize and circles, torch's
bilinear resize with aligned corners."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def face_reference_network(widths=(4, 8, 8, 16, 8), wide=16, branch=8):
    """controlnet-aux's FaceNet (one attribute per layer, its forward written out) at narrow widths: the published
    64, 128, 256, 512 -> 128 backbone, 512-wide conv6_1_CPM and 128-wide stages, shrunk; 71 heatmaps kept."""
    import torch
    from torch import nn

    c1, c2, c3, c4, out = widths

    class FaceNet(nn.Module):
        def __init__(self):
            super().__init__()
            layers = [
                ("conv1_1", 3, c1), ("conv1_2", c1, c1), ("conv2_1", c1, c2), ("conv2_2", c2, c2),
                ("conv3_1", c2, c3), ("conv3_2", c3, c3), ("conv3_3", c3, c3), ("conv3_4", c3, c3),
                ("conv4_1", c3, c4), ("conv4_2", c4, c4), ("conv4_3", c4, c4), ("conv4_4", c4, c4),
                ("conv5_1", c4, c4), ("conv5_2", c4, c4), ("conv5_3_CPM", c4, out),
            ]  # fmt: skip
            for name, cin, cout in layers:
                setattr(self, name, nn.Conv2d(cin, cout, 3, 1, 1))
            self.conv6_1_CPM = nn.Conv2d(out, wide, 1, 1, 0)
            self.conv6_2_CPM = nn.Conv2d(wide, 71, 1, 1, 0)
            for s in range(2, 7):
                setattr(self, f"Mconv1_stage{s}", nn.Conv2d(71 + out, branch, 7, 1, 3))
                for i in range(2, 6):
                    setattr(self, f"Mconv{i}_stage{s}", nn.Conv2d(branch, branch, 7, 1, 3))
                setattr(self, f"Mconv6_stage{s}", nn.Conv2d(branch, branch, 1, 1, 0))
                setattr(self, f"Mconv7_stage{s}", nn.Conv2d(branch, 71, 1, 1, 0))

        def forward(self, x):
            relu, pool = torch.relu, nn.functional.max_pool2d
            h = relu(self.conv1_2(relu(self.conv1_1(x))))
            h = relu(self.conv2_2(relu(self.conv2_1(pool(h, 2, 2)))))
            h = pool(h, 2, 2)
            for name in ("conv3_1", "conv3_2", "conv3_3", "conv3_4"):
                h = relu(getattr(self, name)(h))
            h = pool(h, 2, 2)
            for name in ("conv4_1", "conv4_2", "conv4_3", "conv4_4", "conv5_1", "conv5_2", "conv5_3_CPM"):
                h = relu(getattr(self, name)(h))
            features = h
            h = self.conv6_2_CPM(relu(self.conv6_1_CPM(h)))
            heatmaps = [h]
            for s in range(2, 7):
                h = torch.cat([h, features], 1)
                for i in range(1, 7):
                    h = relu(getattr(self, f"Mconv{i}_stage{s}")(h))
                h = getattr(self, f"Mconv7_stage{s}")(h)
                heatmaps.append(h)
            return heatmaps

    return FaceNet()


def write_face_file(path: Path, seed: int = 2):
    """A seeded narrow face net saved as facenet.pth (FaceNet's state dict as is); its torch module."""
    import torch

    torch.manual_seed(seed)
    network = face_reference_network().eval()
    with torch.no_grad():
        for name, param in network.named_parameters():
            if name.endswith("weight"):
                param.copy_(torch.randn(param.shape) * (2 / param[0].numel()) ** 0.5)
    torch.save(network.state_dict(), str(path))
    return network


def reference_face_box(joints, height: int, width: int):
    """util.faceDetect on a person's 18 joints in pixels (None where not found): (x, y, side) or None."""
    head, left_eye, right_eye, left_ear, right_ear = (joints[i] for i in (0, 14, 15, 16, 17))
    if head is None or all(k is None for k in (left_eye, right_eye, left_ear, right_ear)):
        return None
    width_ = 0.0
    x0, y0 = head
    for point, factor in ((left_eye, 3.0), (right_eye, 3.0), (left_ear, 1.5), (right_ear, 1.5)):
        if point is not None:
            x1, y1 = point
            d = max(abs(x0 - x1), abs(y0 - y1))
            width_ = max(width_, d * factor)
    x, y = x0 - width_, y0 - width_
    x, y = max(x, 0), max(y, 0)
    width1 = width2 = width_ * 2
    if x + width_ > width:
        width1 = width - x
    if y + width_ > height:
        width2 = height - y
    width_ = min(width1, width2)
    return (int(x), int(y), int(width_)) if width_ >= 20 else None


def reference_face_heatmaps(network, crop: np.ndarray) -> np.ndarray:
    """Face.__call__ on an 8-bit BGR crop [h, w, 3] (uint8): float32 [71, h, w]."""
    import cv2
    import torch
    from torch.nn import functional

    height, width = crop.shape[:2]
    k = 768.0 / float(height + width)
    resized = cv2.resize(crop, (384, 384), interpolation=cv2.INTER_AREA if k < 1 else cv2.INTER_LANCZOS4)
    x = torch.from_numpy(resized).permute([2, 0, 1]) / 256.0 - 0.5
    with torch.no_grad():
        maps = network(x[None])[-1]
        return functional.interpolate(maps, (height, width), mode="bilinear", align_corners=True).numpy()[0]


def reference_face_peaks(heatmaps: np.ndarray) -> np.ndarray:
    """Face.compute_peaks_from_heatmaps on [71, h, w]: per map over 0.05 somewhere, its largest value's (x, y)."""
    found = []
    for part in range(heatmaps.shape[0]):
        values = heatmaps[part].copy()
        binary = np.ascontiguousarray(values > 0.05, dtype=np.uint8)
        if np.sum(binary) == 0:
            continue
        positions = np.where(binary > 0.5)
        best = np.argmax(values[positions])
        found.append([positions[1][best], positions[0][best]])
    return np.array(found)


def reference_draw_face(canvas: np.ndarray, landmarks) -> None:
    """draw_facepose with OpenCV: landmarks [n, 2] fractions of the image (negative where not found)."""
    import cv2

    height, width = canvas.shape[:2]
    for fx, fy in landmarks:
        x, y = int(fx * width), int(fy * height)
        if x > 0.01 and y > 0.01:
            cv2.circle(canvas, (x, y), 3, (255, 255, 255), thickness=-1)
