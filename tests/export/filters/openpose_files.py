"""body_pose_model.pth and hand_pose_model.pth as lllyasviel's Annotators ship them (the CMU nets' layer names as
keys: controlnet-aux's `bodypose_model` / `handpose_model` with its `util.transfer` prefix-stripping), narrow and
seeded, and controlnet-aux's `Body.__call__`, `Hand.__call__`, `handDetect`, `draw_bodypose` and `draw_handpose`
re-created as the reference: its loops, scipy's gaussian_filter and label, OpenCV's resizes, blur and drawing.
(controlnet-aux itself imports timm, scikit-image and more at import; its openpose code is torch, numpy, scipy, cv2.)"""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path

import numpy as np

LIMBS = [[2, 3], [2, 6], [3, 4], [4, 5], [6, 7], [7, 8], [2, 9], [9, 10], [10, 11], [2, 12], [12, 13], [13, 14],
         [2, 1], [1, 15], [15, 17], [1, 16], [16, 18], [3, 17], [6, 18]]  # fmt: skip
MAP_INDEX = [[31, 32], [39, 40], [33, 34], [35, 36], [41, 42], [43, 44], [19, 20], [21, 22], [23, 24], [25, 26],
             [27, 28], [29, 30], [47, 48], [49, 50], [53, 54], [51, 52], [55, 56], [37, 38], [45, 46]]  # fmt: skip
COLORS = [[255, 0, 0], [255, 85, 0], [255, 170, 0], [255, 255, 0], [170, 255, 0], [85, 255, 0], [0, 255, 0],
          [0, 255, 85], [0, 255, 170], [0, 255, 255], [0, 170, 255], [0, 85, 255], [0, 0, 255], [85, 0, 255],
          [170, 0, 255], [255, 0, 255], [255, 0, 170], [255, 0, 85]]  # fmt: skip


def reference_network(backbone=(4, 8, 8, 16, 8), branch=8, wide=16):
    """controlnet-aux's bodypose_model (make_layers over OrderedDicts, model0 / modelS_B) at narrow widths: the
    published 64, 128, 256, 512 -> 128 backbone and 128-wide branches (512 at conv5_4) shrunk."""
    import torch
    from torch import nn

    c1, c2, c3, c4, out = backbone
    no_relu = {f"Mconv7_stage{s}_L{b}" for s in range(2, 6) for b in (1, 2)} | {"conv5_5_CPM_L1", "conv5_5_CPM_L2"}
    no_relu.add("Mconv7_stage6_L1")  # controlnet-aux's list names it twice and leaves Mconv7_stage6_L2 out

    def make(block):
        layers = []
        for name, v in block.items():
            if "pool" in name:
                layers.append((name, nn.MaxPool2d(kernel_size=v[0], stride=v[1], padding=v[2])))
                continue
            layers.append((name, nn.Conv2d(v[0], v[1], kernel_size=v[2], stride=v[3], padding=v[4])))
            if name not in no_relu:
                layers.append(("relu_" + name, nn.ReLU(inplace=True)))
        return nn.Sequential(OrderedDict(layers))

    backbone_block = OrderedDict([
        ("conv1_1", [3, c1, 3, 1, 1]), ("conv1_2", [c1, c1, 3, 1, 1]), ("pool1_stage1", [2, 2, 0]),
        ("conv2_1", [c1, c2, 3, 1, 1]), ("conv2_2", [c2, c2, 3, 1, 1]), ("pool2_stage1", [2, 2, 0]),
        ("conv3_1", [c2, c3, 3, 1, 1]), ("conv3_2", [c3, c3, 3, 1, 1]), ("conv3_3", [c3, c3, 3, 1, 1]),
        ("conv3_4", [c3, c3, 3, 1, 1]), ("pool3_stage1", [2, 2, 0]),
        ("conv4_1", [c3, c4, 3, 1, 1]), ("conv4_2", [c4, c4, 3, 1, 1]),
        ("conv4_3_CPM", [c4, 2 * out, 3, 1, 1]), ("conv4_4_CPM", [2 * out, out, 3, 1, 1]),
    ])  # fmt: skip

    class BodyPoseModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.model0 = make(backbone_block)
            for b, channels in ((1, 38), (2, 19)):
                setattr(self, f"model1_{b}", make(OrderedDict(
                    [(f"conv5_{i}_CPM_L{b}", [out if i == 1 else branch, branch, 3, 1, 1]) for i in (1, 2, 3)]
                    + [(f"conv5_4_CPM_L{b}", [branch, wide, 1, 1, 0]), (f"conv5_5_CPM_L{b}", [wide, channels, 1, 1, 0])]
                )))  # fmt: skip
                for s in range(2, 7):
                    layers = [(f"Mconv1_stage{s}_L{b}", [38 + 19 + out, branch, 7, 1, 3])]
                    layers += [(f"Mconv{i}_stage{s}_L{b}", [branch, branch, 7, 1, 3]) for i in range(2, 6)]
                    layers += [(f"Mconv6_stage{s}_L{b}", [branch, branch, 1, 1, 0])]
                    layers += [(f"Mconv7_stage{s}_L{b}", [branch, channels, 1, 1, 0])]
                    setattr(self, f"model{s}_{b}", make(OrderedDict(layers)))

        def forward(self, x):
            features = self.model0(x)
            flow = features
            for s in range(1, 7):
                pafs = getattr(self, f"model{s}_1")(flow)
                heatmaps = getattr(self, f"model{s}_2")(flow)
                flow = torch.cat([pafs, heatmaps, features], 1)
            return pafs, heatmaps

    return BodyPoseModel()


def write_body_file(path: Path, seed: int = 0):
    """A seeded narrow body net saved as body_pose_model.pth, keyed as the published file (`conv1_1.weight`: the
    module's names without their first part, what util.transfer maps back); its torch module."""
    import torch

    torch.manual_seed(seed)
    network = reference_network().eval()
    with torch.no_grad():
        for name, param in network.named_parameters():
            if name.endswith("weight"):
                param.copy_(torch.randn(param.shape) * (2 / param[0].numel()) ** 0.5)
    state = {name.split(".", 1)[1]: value for name, value in network.state_dict().items()}
    torch.save(state, str(path))
    return network


def reference_maps(network, image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Body.__call__'s maps of a float BGR image [h, w, 3] in 0..255 (one scale, 0.5): resized with OpenCV
    (INTER_AREA down, Lanczos-4 up), padded with 128, u / 256 - 0.5 into the network, the maps enlarged by the
    stride (Lanczos-4), cropped and resized to the image's size. float64 heatmaps [h, w, 19], fields [h, w, 38]."""
    import cv2
    import torch

    def smart(x, height, width):
        k = float(height + width) / float(x.shape[0] + x.shape[1])
        mode = cv2.INTER_AREA if k < 1 else cv2.INTER_LANCZOS4
        if x.ndim == 3 and x.shape[2] not in (1, 3):
            return np.stack([cv2.resize(x[:, :, i], (width, height), interpolation=mode) for i in range(x.shape[2])], 2)
        return cv2.resize(x, (width, height), interpolation=mode)

    height, width = image.shape[:2]
    scale = 0.5 * 368 / height
    shrunk = smart(image.astype(np.float32), int(height * scale), int(width * scale))
    ph, pw = (-(-side // 8) * 8 for side in shrunk.shape[:2])
    padded = np.full((ph, pw, 3), 128.0, np.float32)
    padded[: shrunk.shape[0], : shrunk.shape[1]] = shrunk
    x = torch.from_numpy(np.ascontiguousarray(padded.transpose(2, 0, 1)[None] / 256 - 0.5)).float()
    with torch.no_grad():
        pafs, heatmaps = (t[0].numpy().transpose(1, 2, 0) for t in network(x))
    found = []
    for maps in (heatmaps, pafs):
        maps = smart(np.ascontiguousarray(maps), maps.shape[0] * 8, maps.shape[1] * 8)
        maps = maps[: shrunk.shape[0], : shrunk.shape[1]]
        found.append(smart(np.ascontiguousarray(maps), height, width).astype(np.float64))
    return found[0], found[1]


def reference_decode(heatmap_avg: np.ndarray, paf_avg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Body.__call__'s peaks, limbs and people (controlnet-aux 0.0.10), step for step: (candidate, subset)."""
    from scipy.ndimage import gaussian_filter  # type: ignore[import-untyped]

    all_peaks, peak_counter = [], 0
    for part in range(18):
        map_ori = heatmap_avg[:, :, part]
        one = gaussian_filter(map_ori, sigma=3)
        left, right, up, down = (np.zeros(one.shape) for _ in range(4))
        left[1:, :], right[:-1, :], up[:, 1:], down[:, :-1] = one[:-1, :], one[1:, :], one[:, :-1], one[:, 1:]
        binary = np.logical_and.reduce((one >= left, one >= right, one >= up, one >= down, one > 0.1))
        peaks = list(zip(np.nonzero(binary)[1], np.nonzero(binary)[0], strict=True))
        with_score = [x + (map_ori[x[1], x[0]],) for x in peaks]
        ids = range(peak_counter, peak_counter + len(peaks))
        all_peaks.append([with_score[i] + (ids[i],) for i in range(len(ids))])
        peak_counter += len(peaks)

    connection_all: list = []
    special_k, mid_num = [], 10
    for k in range(len(MAP_INDEX)):
        score_mid = paf_avg[:, :, [x - 19 for x in MAP_INDEX[k]]]
        cand_a, cand_b = all_peaks[LIMBS[k][0] - 1], all_peaks[LIMBS[k][1] - 1]
        n_a, n_b = len(cand_a), len(cand_b)
        if n_a == 0 or n_b == 0:
            special_k.append(k)
            connection_all.append([])
            continue
        candidates = []
        for i in range(n_a):
            for j in range(n_b):
                vec = np.subtract(cand_b[j][:2], cand_a[i][:2])
                norm = max(0.001, math.sqrt(vec[0] * vec[0] + vec[1] * vec[1]))
                vec = np.divide(vec, norm)
                startend = list(zip(np.linspace(cand_a[i][0], cand_b[j][0], num=mid_num),
                                    np.linspace(cand_a[i][1], cand_b[j][1], num=mid_num), strict=True))  # fmt: skip
                vec_x = np.array([score_mid[int(round(p[1])), int(round(p[0])), 0] for p in startend])
                vec_y = np.array([score_mid[int(round(p[1])), int(round(p[0])), 1] for p in startend])
                mid = np.multiply(vec_x, vec[0]) + np.multiply(vec_y, vec[1])
                score = sum(mid) / len(mid) + min(0.5 * heatmap_avg.shape[0] / norm - 1, 0)
                if len(np.nonzero(mid > 0.05)[0]) > 0.8 * len(mid) and score > 0:
                    candidates.append([i, j, score, score + cand_a[i][2] + cand_b[j][2]])
        candidates = sorted(candidates, key=lambda x: x[2], reverse=True)
        connection = np.zeros((0, 5))
        for i, j, s, _ in candidates:
            if i not in connection[:, 3] and j not in connection[:, 4]:
                connection = np.vstack([connection, [cand_a[i][3], cand_b[j][3], s, i, j]])
                if len(connection) >= min(n_a, n_b):
                    break
        connection_all.append(connection)

    subset = -1 * np.ones((0, 20))
    candidate = np.array([item for sublist in all_peaks for item in sublist])
    for k in range(len(MAP_INDEX)):
        if k in special_k:
            continue
        part_as, part_bs = connection_all[k][:, 0], connection_all[k][:, 1]
        index_a, index_b = np.array(LIMBS[k]) - 1
        for i in range(len(connection_all[k])):
            found, subset_idx = 0, [-1, -1]
            for j in range(len(subset)):
                if subset[j][index_a] == part_as[i] or subset[j][index_b] == part_bs[i]:
                    subset_idx[found] = j
                    found += 1
            if found == 1:
                j = subset_idx[0]
                if subset[j][index_b] != part_bs[i]:
                    subset[j][index_b] = part_bs[i]
                    subset[j][-1] += 1
                    subset[j][-2] += candidate[part_bs[i].astype(int), 2] + connection_all[k][i][2]
            elif found == 2:
                j1, j2 = subset_idx
                membership = ((subset[j1] >= 0).astype(int) + (subset[j2] >= 0).astype(int))[:-2]
                if len(np.nonzero(membership == 2)[0]) == 0:
                    subset[j1][:-2] += subset[j2][:-2] + 1
                    subset[j1][-2:] += subset[j2][-2:]
                    subset[j1][-2] += connection_all[k][i][2]
                    subset = np.delete(subset, j2, 0)
                else:
                    subset[j1][index_b] = part_bs[i]
                    subset[j1][-1] += 1
                    subset[j1][-2] += candidate[part_bs[i].astype(int), 2] + connection_all[k][i][2]
            elif not found and k < 17:
                row = -1 * np.ones(20)
                row[index_a], row[index_b] = part_as[i], part_bs[i]
                row[-1] = 2
                row[-2] = sum(candidate[connection_all[k][i, :2].astype(int), 2]) + connection_all[k][i][2]
                subset = np.vstack([subset, row])
    delete = [i for i in range(len(subset)) if subset[i][-1] < 4 or subset[i][-2] / subset[i][-1] < 0.4]
    return candidate, np.delete(subset, delete, axis=0)


def reference_draw(candidate: np.ndarray, subset: np.ndarray, height: int, width: int) -> np.ndarray:
    """draw_poses / draw_bodypose with OpenCV on a black uint8 canvas, keypoints normalised as detect_poses does."""
    import cv2

    canvas = np.zeros((height, width, 3), np.uint8)
    for person in subset:
        keypoints = [None if i == -1 else (candidate[i][0] / float(width), candidate[i][1] / float(height))
                     for i in person[:18].astype(int)]  # fmt: skip
        for (k1, k2), color in zip(LIMBS[:17], COLORS, strict=False):
            a, b = keypoints[k1 - 1], keypoints[k2 - 1]
            if a is None or b is None:
                continue
            ys = np.array([a[0], b[0]]) * float(width)
            xs = np.array([a[1], b[1]]) * float(height)
            length = ((xs[0] - xs[1]) ** 2 + (ys[0] - ys[1]) ** 2) ** 0.5
            angle = math.degrees(math.atan2(xs[0] - xs[1], ys[0] - ys[1]))
            polygon = cv2.ellipse2Poly(
                (int(np.mean(ys)), int(np.mean(xs))), (int(length / 2), 4), int(angle), 0, 360, 1
            )
            cv2.fillConvexPoly(canvas, polygon, [int(float(c) * 0.6) for c in color])  # type: ignore[call-overload]
        for keypoint, color in zip(keypoints, COLORS, strict=True):
            if keypoint is not None:
                cv2.circle(canvas, (int(keypoint[0] * width), int(keypoint[1] * height)), 4, color, thickness=-1)
    return canvas


# a standing person's 18 joints (x, y in pixels of a 256 x 192 image): nose, neck, right shoulder/elbow/wrist, left
# shoulder/elbow/wrist, right hip/knee/ankle, left hip/knee/ankle, right/left eye, right/left ear
PERSON = [(64, 40), (64, 64), (48, 64), (40, 96), (36, 128), (80, 64), (88, 96), (92, 128), (52, 128), (50, 176),
          (50, 220), (76, 128), (78, 176), (78, 220), (58, 34), (70, 34), (52, 38), (76, 38)]  # fmt: skip


def synthetic_maps(people, height: int = 256, width: int = 192, missing=()):
    """Heatmaps [h, w, 19] with a Gaussian blob (sigma 4, peak 0.9) at each joint and fields [h, w, 38] holding each
    limb's unit vector within 3 pixels of its segment: what a trained body net gives for clear people. `missing`:
    (person, joint) pairs left out."""
    yy, xx = np.mgrid[:height, :width].astype(np.float64)
    heatmaps = np.zeros((height, width, 19))
    pafs = np.zeros((height, width, 38))
    for p, joints in enumerate(people):
        for j, (x, y) in enumerate(joints):
            if (p, j) not in missing:
                heatmaps[:, :, j] = np.maximum(heatmaps[:, :, j], 0.9 * np.exp(-((xx - x) ** 2 + (yy - y) ** 2) / 32))
        for (a, b), (cx, cy) in zip(LIMBS, MAP_INDEX, strict=True):
            (x0, y0), (x1, y1) = joints[a - 1], joints[b - 1]
            length = max(math.hypot(x1 - x0, y1 - y0), 1e-6)
            ux, uy = (x1 - x0) / length, (y1 - y0) / length
            t = np.clip(((xx - x0) * ux + (yy - y0) * uy) / length, 0, 1)
            near = np.hypot(xx - (x0 + t * (x1 - x0)), yy - (y0 + t * (y1 - y0))) <= 3
            pafs[near, cx - 19], pafs[near, cy - 19] = ux, uy
    heatmaps[:, :, 18] = np.clip(1 - heatmaps[:, :, :18].max(axis=2), 0, 1)
    return heatmaps, pafs


def hand_reference_network(widths=(4, 8, 8, 16, 8), branch=8, wide=16):
    """controlnet-aux's handpose_model (model1_0 / model1_1 / model2..6, make_layers) at narrow widths: the published
    64, 128, 256, 512 -> 128 backbone, 512-wide conv6_1_CPM and 128-wide stages, shrunk."""
    import torch
    from torch import nn

    c1, c2, c3, c4, out = widths
    no_relu = {"conv6_2_CPM"} | {f"Mconv7_stage{s}" for s in range(2, 7)}

    def make(block):
        layers = []
        for name, v in block:
            if "pool" in name:
                layers.append((name, nn.MaxPool2d(kernel_size=v[0], stride=v[1], padding=v[2])))
                continue
            layers.append((name, nn.Conv2d(v[0], v[1], kernel_size=v[2], stride=v[3], padding=v[4])))
            if name not in no_relu:
                layers.append(("relu_" + name, nn.ReLU(inplace=True)))
        return nn.Sequential(OrderedDict(layers))

    backbone = [
        ("conv1_1", [3, c1, 3, 1, 1]), ("conv1_2", [c1, c1, 3, 1, 1]), ("pool1_stage1", [2, 2, 0]),
        ("conv2_1", [c1, c2, 3, 1, 1]), ("conv2_2", [c2, c2, 3, 1, 1]), ("pool2_stage1", [2, 2, 0]),
        ("conv3_1", [c2, c3, 3, 1, 1]), ("conv3_2", [c3, c3, 3, 1, 1]), ("conv3_3", [c3, c3, 3, 1, 1]),
        ("conv3_4", [c3, c3, 3, 1, 1]), ("pool3_stage1", [2, 2, 0]),
        ("conv4_1", [c3, c4, 3, 1, 1]), ("conv4_2", [c4, c4, 3, 1, 1]), ("conv4_3", [c4, c4, 3, 1, 1]),
        ("conv4_4", [c4, c4, 3, 1, 1]), ("conv5_1", [c4, c4, 3, 1, 1]), ("conv5_2", [c4, c4, 3, 1, 1]),
        ("conv5_3_CPM", [c4, out, 3, 1, 1]),
    ]  # fmt: skip

    class HandPoseModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.model1_0 = make(backbone)
            self.model1_1 = make([("conv6_1_CPM", [out, wide, 1, 1, 0]), ("conv6_2_CPM", [wide, 22, 1, 1, 0])])
            for s in range(2, 7):
                layers = [(f"Mconv1_stage{s}", [22 + out, branch, 7, 1, 3])]
                layers += [(f"Mconv{i}_stage{s}", [branch, branch, 7, 1, 3]) for i in range(2, 6)]
                layers += [(f"Mconv6_stage{s}", [branch, branch, 1, 1, 0]), (f"Mconv7_stage{s}", [branch, 22, 1, 1, 0])]
                setattr(self, f"model{s}", make(layers))

        def forward(self, x):
            features = self.model1_0(x)
            heatmaps = self.model1_1(features)
            for s in range(2, 7):
                heatmaps = getattr(self, f"model{s}")(torch.cat([heatmaps, features], 1))
            return heatmaps

    return HandPoseModel()


def write_hand_file(path: Path, seed: int = 1):
    """A seeded narrow hand net saved as hand_pose_model.pth (keys without their module prefix); its torch module."""
    import torch

    torch.manual_seed(seed)
    network = hand_reference_network().eval()
    with torch.no_grad():
        for name, param in network.named_parameters():
            if name.endswith("weight"):
                param.copy_(torch.randn(param.shape) * (2 / param[0].numel()) ** 0.5)
    torch.save({name.split(".", 1)[1]: value for name, value in network.state_dict().items()}, str(path))
    return network


def reference_hand_boxes(joints, height: int, width: int):
    """util.handDetect on a person's 18 joints in pixels (None where not found): [(x, y, side, is_left)]."""
    found = []
    for s, e, w, is_left in ((5, 6, 7, True), (2, 3, 4, False)):
        if joints[s] is None or joints[e] is None or joints[w] is None:
            continue
        (x1, y1), (x2, y2), (x3, y3) = joints[s], joints[e], joints[w]
        x = x3 + 0.33 * (x3 - x2)
        y = y3 + 0.33 * (y3 - y2)
        side = 1.5 * max(math.sqrt((x3 - x2) ** 2 + (y3 - y2) ** 2), 0.9 * math.sqrt((x2 - x1) ** 2 + (y2 - y1) ** 2))
        x -= side / 2
        y -= side / 2
        x, y = max(x, 0), max(y, 0)
        side_x = width - x if x + side > width else side
        side_y = height - y if y + side > height else side
        side = min(side_x, side_y)
        if side >= 20:
            found.append((int(x), int(y), int(side), is_left))
    return found


def reference_hand(network, crop: np.ndarray) -> np.ndarray:
    """Hand.__call__ on an 8-bit BGR crop [s, s, 3] (uint8): int [21, 2] joint (x, y) in the crop's pixels."""
    import cv2
    import torch
    from scipy.ndimage import gaussian_filter, label

    def smart(x, height, width):
        k = float(height + width) / float(x.shape[0] + x.shape[1])
        mode = cv2.INTER_AREA if k < 1 else cv2.INTER_LANCZOS4
        if x.ndim == 3 and x.shape[2] not in (1, 3):
            return np.stack([cv2.resize(x[:, :, i], (width, height), interpolation=mode) for i in range(x.shape[2])], 2)
        return cv2.resize(x, (width, height), interpolation=mode)

    side_in = crop.shape[0]
    blurred = cv2.GaussianBlur(crop, (0, 0), 0.8)
    average = np.zeros((128, 128, 22))
    for scale in (0.5, 1.0, 1.5, 2.0):
        side = int(scale * 368)
        image = smart(blurred, side, side)
        x = torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)[None].astype(np.float32) / 256 - 0.5))
        with torch.no_grad():
            maps = network(x)[0].numpy().transpose(1, 2, 0)
        maps = smart(np.ascontiguousarray(maps), maps.shape[0] * 8, maps.shape[1] * 8)[:side, :side]
        average += smart(np.ascontiguousarray(maps), 128, 128) / 4
    peaks = []
    for part in range(21):
        raw = average[:, :, part].copy()
        binary = gaussian_filter(raw, sigma=3) > 0.05
        if not binary.any():
            peaks.append([0, 0])
            continue
        labels, count = label(binary, structure=np.ones((3, 3)))
        best = np.argmax([np.sum(raw[labels == i]) for i in range(1, count + 1)]) + 1
        raw[labels != best] = 0
        y, x = np.unravel_index(np.argmax(raw), raw.shape)
        peaks.append([int(float(x) * side_in / 128), int(float(y) * side_in / 128)])
    return np.array(peaks)


def reference_draw_hand(canvas: np.ndarray, joints) -> None:
    """draw_handpose with OpenCV: joints [21, 2] fractions of the image (negative where not found)."""
    import colorsys

    import cv2

    height, width = canvas.shape[:2]
    bones = [[0, 1], [1, 2], [2, 3], [3, 4], [0, 5], [5, 6], [6, 7], [7, 8], [0, 9], [9, 10], [10, 11], [11, 12],
             [0, 13], [13, 14], [14, 15], [15, 16], [0, 17], [17, 18], [18, 19], [19, 20]]  # fmt: skip
    for index, (a, b) in enumerate(bones):
        x1, y1 = int(joints[a][0] * width), int(joints[a][1] * height)
        x2, y2 = int(joints[b][0] * width), int(joints[b][1] * height)
        if x1 > 0.01 and y1 > 0.01 and x2 > 0.01 and y2 > 0.01:
            color = np.array(colorsys.hsv_to_rgb(index / float(len(bones)), 1.0, 1.0)) * 255
            cv2.line(canvas, (x1, y1), (x2, y2), color.tolist(), thickness=2)
    for x, y in joints:
        x, y = int(x * width), int(y * height)
        if x > 0.01 and y > 0.01:
            cv2.circle(canvas, (x, y), 4, (0, 0, 255), thickness=-1)
