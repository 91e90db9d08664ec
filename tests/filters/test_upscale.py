"""Upscalers end to end: a narrow RRDBNet in RealESRGAN_x2plus.pth's layout and an SRVGGNetCompact in
realesr-animevideov3.pth's, exported, then built by the real CLI for ONNX Runtime and OpenVINO at fp32 and fp16,
loaded with enginefarm.filters.load and compared with spandrel's torch model on the same file; tiles against the
whole image."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.errors import ConfigError
from enginefarm.export.filters.run import export_filter
from tests.conftest import run_cli
from tests.export.filters.upscaler_files import rrdb_state, save, spandrel_model, srvgg_state

pytestmark = pytest.mark.slow

TARGETS = ("onnxruntime:cpu", "openvino:cpu")
# name → (state, nesting, file name, scale)
FILES = {
    "rrdb-x2": (lambda: rrdb_state(features=16, blocks=2, unshuffle=2, seed=11), "params_ema", "RealESRGAN_x2plus.pth"),
    "srvgg-x4": (lambda: srvgg_state(features=16, convs=4, scale=4, seed=12), "params", "realesr-animevideov3.pth"),
}
SCALES = {"rrdb-x2": 2, "srvgg-x4": 4}
# Exported for sides 64..192 instead of the architecture's 64..512: the export's checks and the build's validation
# are quicker, and a 200-pixel image is already tiled.
SIDES = (64, 128, 192)


@pytest.fixture(scope="module")
def upscalers(tmp_path_factory):
    """name → (the user's file, the store it was built into)."""
    root = tmp_path_factory.mktemp("upscalers")
    env = {"ENGINEFARM_HOME": str(root / "home")}
    files, recipes = {}, []
    for name, (make, nesting, file_name) in FILES.items():
        files[name] = save(make(), root / "files" / file_name, nesting)
        # exported in this process (the CLI's dispatch is tested in tests/export/filters), built by the real CLI
        export = export_filter(files[name], root / name, name, profile={"height": SIDES, "width": SIDES})
        recipes.append(str(export.recipe))
    store = root / "store"
    store.mkdir()
    run_cli("build", *recipes, "--store", str(store), "--no-bench", "-j", "2", env=env, check=True)
    return {name: (files[name], store) for name in FILES}


def _reference(path, image: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = spandrel_model(path)(torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))[None])
    return out[0].numpy().transpose(1, 2, 0)


def _load(upscalers, name: str, precision: str = "fp32", target: str = "onnxruntime:cpu"):
    import enginefarm.filters

    _, store = upscalers[name]
    return enginefarm.filters.load(name, store=str(store), precision=precision, target=target, device="cpu")


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", FILES)
def test_the_built_upscaler_matches_spandrel(upscalers, name, target, precision):
    # odd sides: x2plus packs 2x2 pixels, so the image is padded by reflection and the result cropped (as spandrel)
    image = np.random.default_rng(1).random((71, 90, 3), dtype=np.float32)
    want = _reference(upscalers[name][0], image)
    assert ((want > 0.02) & (want < 0.98)).mean() > 0.9  # the clip below leaves the values the comparison sees
    with _load(upscalers, name, precision, target) as up:
        assert (up.kind, up.scale) == ("upscaler", SCALES[name])
        got = up(image)
    assert got.shape == (71 * up.scale, 90 * up.scale, 3) and got.dtype == np.float32
    assert np.abs(got - np.clip(want, 0, 1)).max() <= (1e-3 if precision == "fp32" else 2e-2)


@pytest.mark.parametrize("name", FILES)
def test_tiles_match_the_whole_image(upscalers, name):
    rng = np.random.default_rng(2)
    with _load(upscalers, name) as up:
        image = rng.random((150, 170, 3), dtype=np.float32)
        whole = up(image)
        assert np.abs(up(image, tile=64) - whole).max() <= 2e-2
        assert np.abs(up(image, tile=96, overlap=8) - whole).max() <= 2e-2
        # larger than the profile's 192: tiled on its own, compared with spandrel's whole-image result
        large = rng.random((210, 150, 3), dtype=np.float32)
        want = np.clip(_reference(upscalers[name][0], large), 0, 1)
        assert np.abs(up(large) - want).max() <= 2e-2
        with pytest.raises(ConfigError, match="outside what"):
            up(image, tile=1000)


def test_another_factor_is_the_models_output_resized_as_real_esrgans_helper_does(upscalers):
    """Easy Diffusion's "upscale by 2" with an x4 model: RealESRGANer.enhance(outscale=2), the output clipped, then
    cv2.resize with INTER_LANCZOS4 to int(side * 2)."""
    cv2 = pytest.importorskip("cv2")
    image = np.random.default_rng(5).random((45, 61, 3), dtype=np.float32)
    with _load(upscalers, "srvgg-x4") as up:
        whole = up(image)
        assert np.array_equal(up(image, outscale=4), whole)
        for factor in (2, 1.5, 3):
            size = (int(61 * factor), int(45 * factor))
            want = np.clip(cv2.resize(whole, size, interpolation=cv2.INTER_LANCZOS4), 0, 1)
            got = up(image, outscale=factor)
            assert got.shape == (size[1], size[0], 3) and np.abs(got - want).max() < 1e-5, factor
        with pytest.raises(ConfigError, match="not a factor"):
            up(image, outscale=0)


def test_memory_beside_the_result_is_one_tiles(upscalers):
    """Tiled, the engine only ever sees a tile: every run's input is within the tile's sides."""
    with _load(upscalers, "srvgg-x4") as up:
        seen = []
        run = up.session.run
        up.session.run = lambda feeds: seen.append(feeds["image"].shape) or run(feeds)  # type: ignore[method-assign]
        up(np.zeros((100, 260, 3), np.float32), tile=64)
    assert len(seen) > 4 and all(shape[2] <= 64 and shape[3] <= 64 for shape in seen)
