"""enginefarm.filters.apply: the safety check first, a flagged image blurred, made black or refused and not
upscaled; an image that passes upscaled by the same engine a direct call uses."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.errors import ConfigError
from enginefarm.filters.apply import apply, blur

from ..conftest import run_cli
from ..export.filters.upscaler_files import save, srvgg_state
from .tiny_filters import diffusers_flags, safety_images, write_safety_folder

torch = pytest.importorskip("torch")
ONE_BUILD = dict(targets=("onnxruntime:cpu",), precisions=("fp32",))


@pytest.fixture(scope="module")
def store_with_filters(tmp_path_factory):
    """A store holding a tiny safety checker ("checker", thresholds placed so some test images are flagged) and a
    tiny x2 upscaler ("up-x2"); and diffusers' decision for each test image."""
    from enginefarm.export.filters.run import export_filter

    root = tmp_path_factory.mktemp("apply")
    images = safety_images()
    checker = write_safety_folder(root / "checker", images)
    flags = diffusers_flags(checker, images)
    save(srvgg_state(features=8, convs=2, scale=2), root / "up-x2.pth")
    recipes = [
        str(export_filter(source, root / f"{name}-export", name=name, **ONE_BUILD).recipe)
        for source, name in ((root / "checker", "checker"), (root / "up-x2.pth", "up-x2"))
    ]
    run_cli("build", *recipes, "--store", str(root / "store"), "--no-bench", "-j", "2", check=True)
    return str(root / "store"), images, flags


@pytest.mark.slow
def test_safety_first_then_upscale_and_a_flagged_image_is_blurred_black_or_refused(store_with_filters):
    import enginefarm.filters

    store, images, flags = store_with_filters
    assert any(flags) and not all(flags)
    passed = images[flags.index(False)]
    flagged = images[flags.index(True)]
    with (
        enginefarm.filters.load("checker", store=store) as checker,
        enginefarm.filters.load("up-x2", store=store) as up,
    ):
        done = apply(passed, safety=checker, upscale=up)
        assert not done.flagged and done.ran == ["safety", "upscale"]
        assert np.array_equal(done.image, up(passed))
        for on_flagged, expected in (("blur", blur(flagged)), ("black", np.zeros_like(flagged)), ("refuse", None)):
            done = apply(flagged, safety=checker, upscale=up, on_flagged=on_flagged)
            assert done.flagged and done.scores["bad_concepts"], done.scores
            assert done.ran == (["safety"] if expected is None else ["safety", on_flagged])
            assert expected is None and done.image is None or np.array_equal(done.image, expected)
    # by name: loaded from the store and closed after
    done = apply(passed, safety="checker", upscale="up-x2", store=store)
    assert done.image.shape == (2 * passed.shape[0], 2 * passed.shape[1], 3)
    with pytest.raises(ConfigError, match="--safety up-x2: an upscaler, not a safety checker"):
        apply(passed, safety="up-x2", store=store)


def test_blur_keeps_a_flat_image_and_removes_detail():
    flat = np.full((40, 30, 3), 0.25, np.float32)
    np.testing.assert_allclose(blur(flat), flat, atol=1e-6)  # no dark rim at the borders
    noisy = np.random.default_rng(0).random((64, 48, 3), dtype=np.float32)
    assert blur(noisy).std() < noisy.std() / 10
    with pytest.raises(ConfigError, match="on_flagged"):
        apply(flat, on_flagged="hide")
