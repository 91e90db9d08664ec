"""The preprocessors' numpy steps: resizing as torch's antialiased interpolate does, the detect size rule."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.errors import ConfigError
from enginefarm.filters.info import FilterInfo
from enginefarm.filters.preprocess import Preprocessor, min_max, resize

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(
    ("source", "target"), [((100, 130), (518, 672)), ((700, 300), (518, 224)), ((33, 47), (20, 90)), ((9, 9), (9, 9))]
)
@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
def test_resize_is_torchs_antialiased_interpolate(source, target, mode):
    image = np.random.default_rng(0).random((*source, 3), dtype=np.float32)
    ours = resize(image, target, mode)
    x = torch.from_numpy(image).permute(2, 0, 1)[None]
    theirs = torch.nn.functional.interpolate(x, size=target, mode=mode, antialias=True, align_corners=False)
    assert ours.shape == (*target, 3)
    np.testing.assert_allclose(ours, theirs[0].permute(1, 2, 0).numpy(), atol=1e-4)


def test_detect_size_and_min_max():
    info = FilterInfo("depth", "preprocessor", "DepthAnything", ("depth",), {"resolution": 518, "multiple": 14})
    depth = Preprocessor(info, {})
    assert depth.detect_size(768, 1024) == (518, 686)  # the short side at 518, the long side to a multiple of 14
    assert depth.detect_size(256, 256) == (518, 518)
    assert depth.detect_size(1000, 100, 64) == (644, 70)
    capped = Preprocessor(FilterInfo("d", "preprocessor", "x", ("depth",), {**info.details, "max_side": 1036}), {})
    assert capped.detect_size(500, 2000) == (252, 1036)  # a long side past the engine's largest is shrunk to fit
    with pytest.raises(ConfigError, match="below"):
        depth.detect_size(64, 64, 10)
    assert np.array_equal(min_max(np.array([2.0, 4.0, 3.0])), np.array([0.0, 1.0, 0.5], np.float32))
    assert not min_max(np.full(4, 7.0)).any()
