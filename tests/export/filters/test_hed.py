"""HED soft edges (ControlNetHED.pth) as a ControlNet preprocessor: recognised from its keys, built, and its control
image against controlnet-aux's HEDdetector steps re-created around the same torch network."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.errors import ConfigError

from ...conftest import run_cli
from ...filters.scenes import scene
from .hed_files import hed_reference, write_hed_file

torch = pytest.importorskip("torch")
pytest.importorskip("cv2")


def test_hed_is_recognised_and_a_wrong_layout_is_one_line(tmp_path):
    from enginefarm.export.filters.hed import build_hed
    from enginefarm.export.filters.reading import read_filter_source, recognise

    write_hed_file(tmp_path / "ControlNetHED.pth")
    source = read_filter_source(tmp_path / "ControlNetHED.pth")
    architecture = recognise(source)
    parts = architecture.build(source)
    assert architecture.kind == "preprocessor" and parts.details["task"] == "softedge"
    assert parts.details["widths"] == [8, 16, 16, 32, 32] and parts.details["output"] == "as_is"
    state = dict(source.state)
    state.pop("block3.convs.2.weight")
    with pytest.raises(ConfigError, match="not the layout of ControlNetHED.pth"):
        build_hed(type(source)(source.path, state))


@pytest.mark.slow
def test_hed_built_matches_controlnet_aux_steps(tmp_path):
    import enginefarm.filters
    from enginefarm.export.filters.run import export_filter

    network = write_hed_file(tmp_path / "ControlNetHED.pth")
    out = tmp_path / "export"
    export_filter(tmp_path / "ControlNetHED.pth", out, name="hed-tiny", targets=("onnxruntime:cpu",))
    recipe = (out / "recipe.toml").read_text().replace("[64, 512, 1024]", "[64, 128, 256]")
    (out / "recipe.toml").write_text(recipe)
    run_cli("build", str(out / "recipe.toml"), "--store", str(tmp_path / "store"), "--no-bench", check=True)

    photo = scene(11, height=96, width=128)
    expected = hed_reference(network, photo, (128, 192))  # the short side at 128, sides multiples of 64
    assert expected.std() > 0.02
    for precision, tolerance in (("fp32", 1e-3), ("fp16", 2e-2)):
        with enginefarm.filters.load("hed-tiny", store=str(tmp_path / "store"), precision=precision) as hed:
            assert hed.task == "softedge" and hed.detect_size(96, 128, 128) == (128, 192)
            control = hed(photo, detect_resolution=128)
        assert control.shape == (96, 128, 3)
        deviation = float(np.abs(control - expected).max())
        assert deviation < tolerance, (precision, deviation)
        print(f"hed {precision}: {deviation:.1e}")
