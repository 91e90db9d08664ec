"""Openpose in numpy around the farm-built body network: the steps of controlnet-aux's `Body.__call__` and
`OpenposeDetector` (CMU's openpose as pytorch-openpose ports it). The photo at the detect resolution is shrunk so its
height is 184 (OpenCV's area resize), padded to the stride, run; the network's 19 heatmaps and 38 part affinity
fields are enlarged back (Lanczos-4, as OpenCV); each heatmap smoothed (a Gaussian of sigma 3, as scipy's
`gaussian_filter`) and its local maxima over 0.1 are the joints' candidates; each limb's candidate pairs are scored by
the field along the segment between them and matched greedily; limbs sharing joints make people. The people are
drawn as ControlNet's openpose models expect (`pose_draw`).

    pose = enginefarm.filters.load("openpose", store=STORE)
    control = pose(photo)                  # float [H, W, 3] in [0, 1]: the pose image, black background
    found = detect_poses(pose, photo)      # the joints themselves (candidate and subset, as controlnet-aux's)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from enginefarm.errors import ConfigError

from .pose_draw import draw_body
from .resampling import apply_matrices, back_matrix, gaussian_filter, resize, resize_matrix

JOINTS = 18
PEAK_THRESHOLD = 0.1  # a smoothed heatmap's value a joint must pass
FIELD_THRESHOLD = 0.05  # the field's value along a limb at a sample point that counts
SAMPLES = 10  # points sampled along a candidate limb
SIGMA = 3.0
# each limb: its joints (1-based, as openpose numbers them) and its x, y field channels
LIMBS = (
    (2, 3), (2, 6), (3, 4), (4, 5), (6, 7), (7, 8), (2, 9), (9, 10), (10, 11), (2, 12), (12, 13), (13, 14),
    (2, 1), (1, 15), (15, 17), (1, 16), (16, 18), (3, 17), (6, 18),
)  # fmt: skip
FIELDS = (
    (12, 13), (20, 21), (14, 15), (16, 17), (22, 23), (24, 25), (0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11),
    (28, 29), (30, 31), (34, 35), (32, 33), (36, 37), (18, 19), (26, 27),
)  # fmt: skip
NEW_PERSON_LIMBS = 17  # the last two limbs (ear-shoulder) join people but never start one


@dataclass(frozen=True)
class Poses:
    """What the body network found at the detect size (`height`, `width`): `candidate` [N, 4] rows x, y, score, id
    (every joint candidate, joint by joint) and `subset` [P, 20]: per person the candidate index of each of the 18
    joints (-1: not found), the total score and the number of joints, as controlnet-aux's `Body` returns them."""

    candidate: np.ndarray
    subset: np.ndarray
    height: int
    width: int
    hands: list[tuple[np.ndarray | None, np.ndarray | None]] | None = None  # per person (left, right), with a hand net
    faces: list[np.ndarray | None] | None = None  # per person [n, 2] landmark fractions, with a face net

    def people(self) -> list[list[tuple[float, float] | None]]:
        """Per person, the 18 joints as (x, y) fractions of the width and height, None where not found."""
        found = []
        for row in self.subset:
            joints: list[tuple[float, float] | None] = []
            for index in row[:JOINTS].astype(int):
                if index == -1:
                    joints.append(None)
                    continue
                x, y = self.candidate[index, :2]
                joints.append((float(x) / float(self.width), float(y) / float(self.height)))
            found.append(joints)
        return found


def pose_control(
    preprocessor, image: np.ndarray, detect_resolution: int | None = None, hand=None, face=None, body: bool = True
) -> np.ndarray:
    """The openpose control image float32 [H, W, 3] in [0, 1] of a photo float [H, W, 3] in [0, 1]; with `hand`
    (a loaded openpose_hand filter) each person's hands too, with `face` (openpose_face) their faces; `body` False
    leaves the bodies undrawn (controlnet-aux's include_body)."""
    from .openpose_face import draw_face
    from .openpose_hand import draw_hand

    poses = detect_poses(preprocessor, image, detect_resolution, hand, face)
    canvas = np.zeros((poses.height, poses.width, 3), np.uint8)
    for index, joints in enumerate(poses.people()):  # person by person: body, hands, face, as controlnet-aux
        if body:
            draw_body(canvas, joints)
        for found in (poses.hands or [])[index : index + 1]:
            draw_hand(canvas, found[0])
            draw_hand(canvas, found[1])
        for landmarks in (poses.faces or [])[index : index + 1]:
            draw_face(canvas, landmarks)
    return np.clip(resize(canvas.astype(np.float32) / 255, image.shape[:2], "bilinear"), 0, 1)


def detect_poses(preprocessor, image: np.ndarray, detect_resolution: int | None = None, hand=None, face=None) -> Poses:
    """The people in a photo float [H, W, 3] in [0, 1], at the preprocessor's detect size; with `hand` (a loaded
    openpose_hand filter) their hands, with `face` (openpose_face) their faces."""
    image = np.asarray(image, dtype=np.float32)[:, :, :3]
    size = preprocessor.detect_size(image.shape[0], image.shape[1], detect_resolution)
    photo = resize(image, size, "bicubic")
    heatmaps, pafs = body_maps(preprocessor, photo)
    candidate, subset = decode(heatmaps, pafs)
    poses = Poses(candidate, subset, size[0], size[1])
    if hand is None and face is None:
        return poses
    from .openpose_face import detect_face
    from .openpose_hand import detect_hands

    photo8 = np.floor(np.clip(photo[:, :, ::-1], 0, 1) * 255 + 0.5)  # the 8-bit BGR image controlnet-aux crops
    hands, faces = [], []
    for row in subset:
        joints = [
            None if i == -1 else (float(candidate[i, 0]), float(candidate[i, 1])) for i in row[:JOINTS].astype(int)
        ]
        if hand is not None:
            hands.append(detect_hands(hand, photo8, joints))
        if face is not None:
            faces.append(detect_face(face, photo8, joints))
    found_hands = hands if hand is not None else None
    return Poses(candidate, subset, size[0], size[1], found_hands, faces if face is not None else None)


def body_maps(preprocessor, photo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float [h, w, 19] heatmaps and [h, w, 38] fields of a photo float [h, w, 3] in [0, 1] at the detect size."""
    details = preprocessor.info.details
    stride = int(details.get("stride", 8))
    height, width = photo.shape[:2]
    scale = float(details.get("box", 368)) * float(details.get("scale", 0.5)) / height
    net_size = (int(height * scale), int(width * scale))
    # OpenCV's INTER_AREA or Lanczos-4, chosen for both sides at once by how the sides' sum changes
    area = sum(net_size) < height + width
    shrunk = apply_matrices(photo, resize_matrix(height, net_size[0], area), resize_matrix(width, net_size[1], area))
    padded = [-(-side // stride) * stride for side in net_size]
    largest = preprocessor._engine_largest()
    if max(padded) > largest:
        raise ConfigError(
            f"{preprocessor.name}: a {width}x{height} photo is {padded[1]} pixels wide for its network, which takes "
            f"up to {largest}",
            hint="crop the photo nearer to 4:1, or build the filter with a wider profile (its recipe's width)",
        )
    # the network reads BGR as u / 256 - 0.5 of 8-bit values u; the padding is OpenCV's 128 gray, 0 there
    x = np.zeros((padded[0], padded[1], 3), np.float32)
    x[: net_size[0], : net_size[1]] = shrunk[:, :, ::-1] * (255 / 256) - 0.5
    session = preprocessor.sessions[preprocessor.info.components[0]]
    outputs = session.run({"image": np.ascontiguousarray(x.transpose(2, 0, 1)[None])})
    maps = padded[0] // stride, padded[1] // stride
    area = height + width < sum(net_size)
    rows = back_matrix(maps[0], stride, net_size[0], height, area)
    cols = back_matrix(maps[1], stride, net_size[1], width, area)
    heatmaps = apply_matrices(np.asarray(outputs["heatmaps"], np.float32)[0].transpose(1, 2, 0), rows, cols)
    pafs = apply_matrices(np.asarray(outputs["pafs"], np.float32)[0].transpose(1, 2, 0), rows, cols)
    return heatmaps, pafs


def find_peaks(heatmaps: np.ndarray) -> list[np.ndarray]:
    """Per joint, float64 [n, 4] rows x, y, score, id: the smoothed heatmap's local maxima (no 4-neighbour larger)
    over the threshold, row by row; the score is the unsmoothed map's, ids count on across joints."""
    peaks, counter = [], 0
    for joint in range(JOINTS):
        raw = heatmaps[:, :, joint].astype(np.float64)
        smooth = gaussian_filter(raw)
        padded = np.pad(smooth, 1)  # zeros beyond the edges, as controlnet-aux's shifted copies
        centre = padded[1:-1, 1:-1]
        is_peak = (
            (centre >= padded[:-2, 1:-1]) & (centre >= padded[2:, 1:-1]) & (centre >= padded[1:-1, :-2])
            & (centre >= padded[1:-1, 2:]) & (centre > PEAK_THRESHOLD)
        )  # fmt: skip
        ys, xs = np.nonzero(is_peak)
        ids = np.arange(counter, counter + len(xs))
        peaks.append(np.stack([xs, ys, raw[ys, xs], ids], 1).astype(np.float64).reshape(-1, 4))
        counter += len(xs)
    return peaks


def connect(pafs: np.ndarray, peaks: list[np.ndarray], height: int) -> list[np.ndarray | None]:
    """Per limb, float64 [m, 5] rows: id of joint A, id of joint B, score, index in A's and B's candidates; the
    pairs whose field agrees with their direction, best first, each candidate used once (None: a joint unseen)."""
    connections: list[np.ndarray | None] = []
    for (first, second), channels in zip(LIMBS, FIELDS, strict=True):
        a, b = peaks[first - 1], peaks[second - 1]
        if not len(a) or not len(b):
            connections.append(None)
            continue
        start, end = a[:, None, :2], b[None, :, :2]  # [nA, nB, 2]
        vector = end - start
        norm = np.maximum(np.sqrt(vector[..., 0] * vector[..., 0] + vector[..., 1] * vector[..., 1]), 0.001)
        unit = vector / norm[..., None]
        steps = _linspace(np.broadcast_to(start, vector.shape), vector, np.broadcast_to(end, vector.shape))
        xs, ys = np.round(steps[:, :, 0]).astype(int), np.round(steps[:, :, 1]).astype(int)
        along = pafs[ys, xs, channels[0]] * unit[..., 0:1] + pafs[ys, xs, channels[1]] * unit[..., 1:2]
        total = along[..., 0].astype(np.float64)
        for k in range(1, SAMPLES):  # in order, as Python's sum adds them
            total = total + along[..., k]
        score = total / SAMPLES + np.minimum(0.5 * height / norm - 1, 0)
        good = (np.count_nonzero(along > FIELD_THRESHOLD, axis=-1) > 0.8 * SAMPLES) & (score > 0)
        pairs = np.argwhere(good)  # i-major, as the reference's nested loops
        order = np.argsort(-score[good], kind="stable")
        rows: list[list[float]] = []
        used_a: set[int] = set()
        used_b: set[int] = set()
        for i, j in pairs[order]:
            if i in used_a or j in used_b:
                continue
            rows.append([a[i, 3], b[j, 3], score[i, j], i, j])
            used_a.add(int(i))
            used_b.add(int(j))
            if len(rows) >= min(len(a), len(b)):
                break
        connections.append(np.array(rows, np.float64).reshape(-1, 5))
    return connections


def _linspace(start: np.ndarray, delta: np.ndarray, stop: np.ndarray) -> np.ndarray:
    """[..., SAMPLES] points from start to stop, each pair's own np.linspace(start, stop, SAMPLES) to the last bit
    (np.linspace over arrays takes another rounding path for all pairs when one of them has a zero step)."""
    steps = np.arange(SAMPLES, dtype=np.float64) * (delta[..., None] / (SAMPLES - 1)) + start[..., None]
    steps[..., -1] = stop
    return steps


def assemble(connections: list[np.ndarray | None], candidate: np.ndarray) -> np.ndarray:
    """float64 [P, 20]: people grown limb by limb from the connections (a limb joining two people merges them when
    they share no joint), then those with fewer than 4 joints or a mean score under 0.4 dropped."""
    subset = -np.ones((0, JOINTS + 2))
    for k, rows in enumerate(connections):
        if rows is None:
            continue
        index_a, index_b = LIMBS[k][0] - 1, LIMBS[k][1] - 1
        for id_a, id_b, score, _, _ in rows:
            owners = [p for p in range(len(subset)) if subset[p][index_a] == id_a or subset[p][index_b] == id_b][:2]
            # two people sharing a joint: the first takes joint B even when it has it (counted again), as the
            # reference does; one person takes it only when it is new
            shared = len(owners) == 2 and _overlap(subset, owners)
            if (len(owners) == 1 and subset[owners[0]][index_b] != id_b) or shared:
                p = owners[0]
                subset[p][index_b] = id_b
                subset[p][-1] += 1
                subset[p][-2] += candidate[int(id_b), 2] + score
            elif len(owners) == 2:
                p, q = owners
                subset[p][:-2] += subset[q][:-2] + 1
                subset[p][-2:] += subset[q][-2:]
                subset[p][-2] += score
                subset = np.delete(subset, q, 0)
            elif not owners and k < NEW_PERSON_LIMBS:
                row = -np.ones(JOINTS + 2)
                row[index_a], row[index_b] = id_a, id_b
                row[-1] = 2
                row[-2] = candidate[int(id_a), 2] + candidate[int(id_b), 2] + score
                subset = np.vstack([subset, row])
    keep = [p for p in range(len(subset)) if not (subset[p][-1] < 4 or subset[p][-2] / subset[p][-1] < 0.4)]
    return subset[keep]


def _overlap(subset: np.ndarray, owners: list[int]) -> bool:
    """Whether two people share a joint slot (then the limb only extends the first)."""
    both = (subset[owners[0]] >= 0).astype(int) + (subset[owners[1]] >= 0).astype(int)
    return bool(np.any(both[:-2] == 2))


def decode(heatmaps: np.ndarray, pafs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(candidate [N, 4], subset [P, 20]) from heatmaps [h, w, >=18] and fields [h, w, 38] at the detect size."""
    peaks = find_peaks(heatmaps)
    candidate = np.concatenate(peaks, 0) if peaks else np.zeros((0, 4))
    return candidate, assemble(connect(pafs, peaks, heatmaps.shape[0]), candidate)
