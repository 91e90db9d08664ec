"""HED soft edges (ControlNetHED.pth) and line art (sk_model.pth) as ControlNet preprocessors: recognised from their
keys, built (one build for both), and their control images against controlnet-aux's HEDdetector and LineartDetector
steps re-created around the same torch networks."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.errors import ConfigError

from ...conftest import run_cli
from ...filters.scenes import scene
from ...filters.test_softedge import aux_scribble
from .hed_files import hed_reference, lineart_reference, write_hed_file, write_lineart_file

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


def test_lineart_is_recognised_with_its_width_and_blocks(tmp_path):
    from enginefarm.export.filters.reading import read_filter_source, recognise

    network = write_lineart_file(tmp_path / "sk_model.pth")
    source = read_filter_source(tmp_path / "sk_model.pth")
    parts = recognise(source).build(source)
    assert parts.kind == "preprocessor" and parts.details["task"] == "lineart"
    assert (parts.details["width"], parts.details["blocks"], parts.details["output"]) == (8, 2, "inverted")
    x = torch.rand(1, 3, 64, 128)
    with torch.no_grad():
        assert torch.equal(parts.parts["lines"].module(x), network(x)[:, 0])


@pytest.mark.slow
def test_hed_and_lineart_built_match_controlnet_aux_steps(tmp_path):
    import enginefarm.filters
    from enginefarm.export.filters.run import export_filter

    networks = {
        "hed-tiny": (write_hed_file(tmp_path / "ControlNetHED.pth"), hed_reference, "softedge"),
        "lineart-tiny": (write_lineart_file(tmp_path / "sk_model.pth"), lineart_reference, "lineart"),
    }
    recipes = []
    for name, source in (("hed-tiny", "ControlNetHED.pth"), ("lineart-tiny", "sk_model.pth")):
        out = tmp_path / name
        export_filter(tmp_path / source, out, name=name, targets=("onnxruntime:cpu",))
        recipe = (out / "recipe.toml").read_text().replace("[64, 512, 1024]", "[64, 128, 256]")
        (out / "recipe.toml").write_text(recipe)
        recipes.append(str(out / "recipe.toml"))
    run_cli("build", *recipes, "--store", str(tmp_path / "store"), "--no-bench", "-j", "2", check=True)

    photo = scene(11, height=96, width=128)
    for name, (network, reference, task) in networks.items():
        expected = reference(network, photo, (128, 192))  # the short side at 128, sides multiples of 64
        assert expected.std() > 0.02
        for precision, tolerance in (("fp32", 1e-3), ("fp16", 2e-2)):
            with enginefarm.filters.load(name, store=str(tmp_path / "store"), precision=precision) as preprocessor:
                assert preprocessor.task == task and preprocessor.detect_size(96, 128, 128) == (128, 192)
                control = preprocessor(photo, detect_resolution=128)
            assert control.shape == (96, 128, 3)
            deviation = float(np.abs(control - expected).max())
            assert deviation < tolerance, (name, precision, deviation)
            print(f"{name} {precision}: {deviation:.1e}")

    # HED takes the soft-edge modes (Easy Diffusion's scribble_hed): against controlnet-aux's cv2 steps
    hed_edges = hed_reference(networks["hed-tiny"][0], photo, (128, 192))[:, :, 0]
    options = dict(store=str(tmp_path / "store"), precision="fp32", detect_resolution=128)
    strokes = enginefarm.filters.control_from(photo, "hed-tiny:scribble", **options)[:, :, 0]
    assert 0.01 < strokes.mean() < 0.9 and (strokes * 255 != aux_scribble(hed_edges * 255)).mean() < 1e-3
