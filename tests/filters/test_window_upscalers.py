"""The window-attention upscalers (SwinIR, HAT, DAT) end to end: narrow one-group nets in the published files' key
layouts, exported, built by the real CLI at fp32 and fp16 in one build (SwinIR for ONNX Runtime and OpenVINO, HAT
for ONNX Runtime, DAT for OpenVINO: the build's time is the suite's), loaded with
enginefarm.filters.load and compared with spandrel's torch model on the same file. They run in tiles of exactly
their exported side. (The ESRGAN variants, whose ops the RRDBNet builds of test_upscale cover, are checked against
spandrel in tests/export/filters/test_window_upscalers.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.errors import ConfigError
from enginefarm.export.filters.run import export_filter
from tests.conftest import run_cli
from tests.export.filters.upscaler_files import (
    dat_state,
    hat_state,
    save,
    spandrel_model,
    swinir_state,
)

pytestmark = pytest.mark.slow

ORT, OPENVINO = "onnxruntime:cpu", "openvino:cpu"
# name → the targets it is built for
TARGETS = {"swinir": (ORT, OPENVINO), "hat": (ORT,), "dat": (OPENVINO,)}
# name → (state, nesting, the published file's name, scale); one residual group of two blocks each (a shifted
# window included), so the export and the build stay quick
FILES = {
    "swinir": (
        lambda: swinir_state(depths=(2,), heads=(2,), seed=21),
        "params_ema",
        "003_realSR_BSRGAN_DFOWMFC_s64w8_SwinIR-L_x4_GAN.pth",
        4,
    ),
    "hat": (lambda: hat_state(depths=(2,), heads=(2,), seed=22), "params_ema", "Real_HAT_GAN_SRx4.pth", 4),
    "dat": (lambda: dat_state(depth=(2,), heads=(2,), scale=2, seed=23), "params", "DAT_x2.pth", 2),
}
TILE = 64
TOLERANCE = {"fp32": 1e-3, "fp16": 2e-2}


@pytest.fixture(scope="module")
def window_upscalers(tmp_path_factory):
    """name → (the user's file, the store all were built into)."""
    root = tmp_path_factory.mktemp("window_upscalers")
    env = {"ENGINEFARM_HOME": str(root / "home")}
    files, recipes = {}, []
    for name, (make, nesting, file_name, _) in FILES.items():
        files[name] = save(make(), root / "files" / file_name, nesting)
        recipes.append(str(export_filter(files[name], root / name, name, targets=TARGETS[name]).recipe))
    store = root / "store"
    store.mkdir()
    run_cli("build", *recipes, "--store", str(store), "--no-bench", "-j", "2", env=env, check=True)
    return {name: (files[name], store) for name in FILES}


def _reference(path, image: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = spandrel_model(path)(torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))[None])
    return out[0].numpy().transpose(1, 2, 0)


def _load(window_upscalers, name: str, precision: str = "fp32", target: str | None = None):
    import enginefarm.filters

    _, store = window_upscalers[name]
    target = target or TARGETS[name][0]
    return enginefarm.filters.load(name, store=str(store), precision=precision, target=target, device="cpu")


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize(("name", "target"), [(name, target) for name in FILES for target in TARGETS[name]])
def test_the_built_upscaler_matches_spandrel(window_upscalers, name, target, precision):
    image = np.random.default_rng(3).random((TILE, TILE, 3), dtype=np.float32)
    want = np.clip(_reference(window_upscalers[name][0], image), 0, 1)
    assert ((want > 0.02) & (want < 0.98)).mean() > 0.5  # the clip leaves most values the comparison sees
    with _load(window_upscalers, name, precision, target) as up:
        assert (up.kind, up.scale) == ("upscaler", FILES[name][3])
        got = up(image)
    assert got.shape == (TILE * up.scale, TILE * up.scale, 3)
    assert np.abs(got - want).max() <= TOLERANCE[precision]


@pytest.mark.parametrize("name", FILES)
def test_attention_nets_run_in_tiles_of_exactly_their_side(window_upscalers, name):
    """A smaller image is padded by reflection to the window (as spandrel pads it) and then to the tile: what
    spandrel gives for the padded image, cropped. A larger one runs in tiles of exactly that side, started on the
    window and overlapping by half a tile, within 2e-2 of spandrel's whole-image result. Another tile is one line."""
    rng = np.random.default_rng(4)
    path = window_upscalers[name][0]
    with _load(window_upscalers, name) as up:
        assert up.fixed_tile == TILE
        small = rng.random((37, 50, 3), dtype=np.float32)
        window = np.pad(small, ((0, -37 % up.multiple), (0, -50 % up.multiple), (0, 0)), mode="reflect")
        padded = np.pad(window, ((0, TILE - window.shape[0]), (0, TILE - window.shape[1]), (0, 0)), mode="reflect")
        want = np.clip(_reference(path, padded)[: 37 * up.scale, : 50 * up.scale], 0, 1)
        assert np.abs(up(small) - want).max() <= 1e-3
        seen, run = [], up.session.run
        up.session.run = lambda feeds: seen.append(feeds["image"].shape) or run(feeds)  # type: ignore[method-assign]
        # a smooth image, sides on the window (so the whole image is not padded): its tiles' seams are what differs
        y, x = np.mgrid[0:112, 0:96] / 20.0
        large = np.stack([0.5 + 0.4 * np.sin(x + k) * np.cos(y - k) for k in range(3)], -1).astype(np.float32)
        got = up(large)
        assert len(seen) >= 4 and all(shape[2:] == (TILE, TILE) for shape in seen)
        assert got.shape == (112 * up.scale, 96 * up.scale, 3)
        assert np.abs(got - np.clip(_reference(path, large), 0, 1)).max() <= 2e-2
        with pytest.raises(ConfigError, match=f"exactly {TILE} pixels"):
            up(large, tile=96)
