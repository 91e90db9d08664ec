"""`enginefarm generate` with filters from the model's store: a control image made from a photo (--control-from
canny), the result upscaled (--upscale), a flagged image refused or made black (--safety, --on-flagged), and a
missing or wrong filter told in one line before anything runs."""

from __future__ import annotations

import os
import shutil
import tomllib

import numpy as np
import pytest

from tests.conftest import run_cli

from ..export.filters.upscaler_files import save, srvgg_state
from ..filters.scenes import scene

pytest.importorskip("diffusers")
ONE_BUILD = dict(targets=("onnxruntime:cpu",), precisions=("fp32",))


@pytest.fixture(scope="module")
def with_upscaler(built, tmp_path_factory):
    """(model name, a store holding the tiny controlnet-sd1 and a tiny x2 upscaler "up-x2"): the shared build's store
    copied as hard links (a build replaces files, never writes into them), the upscaler exported and built into it."""
    from enginefarm.export.filters.run import export_filter

    _, out, shared = built("controlnet-sd1")
    name = tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]
    root = tmp_path_factory.mktemp("generate-filters")
    store = root / "store"
    shutil.copytree(shared, store, copy_function=os.link)
    upscaler = save(srvgg_state(features=8, convs=2, scale=2), root / "up-x2.pth")
    checker = _flagging_checker(root / "flag-all")
    recipes = [
        str(export_filter(source, root / f"{name}-export", name=name, **ONE_BUILD).recipe)
        for source, name in ((upscaler, "up-x2"), (checker, "flag-all"))
    ]
    run_cli("build", *recipes, "--store", str(store), "--no-bench", "-j", "2", check=True)
    return name, store


def _flagging_checker(folder):
    """A tiny safety checker whose thresholds (-1, below any cosine) flag every image."""
    import torch
    from transformers import CLIPImageProcessor

    from ..filters.tiny_filters import safety_checker

    checker = safety_checker()
    with torch.no_grad():
        checker.concept_embeds_weights.fill_(-1.0)
        checker.special_care_embeds_weights.fill_(-1.0)
    checker.save_pretrained(folder)
    CLIPImageProcessor().save_pretrained(folder)
    return folder


def _generate(name, store, out, *args):
    return run_cli("generate", name, "a red fox", "--store", str(store), "--steps", "2", "--out", str(out), *args)


@pytest.mark.slow
def test_control_from_canny_and_upscale(with_upscaler, tmp_path):
    import enginefarm.filters
    from enginefarm.diffusion import read_png, write_png
    from enginefarm.filters.canny import canny_control

    name, store = with_upscaler
    photo = tmp_path / "photo.png"
    write_png(photo, scene(3, height=64, width=64))
    filtered = _generate(
        name, store, tmp_path / "a.png", "--control-image", str(photo), "--control-from", "canny", "--upscale", "up-x2"
    )
    assert filtered.returncode == 0, filtered.stderr
    # the same image by hand: the photo's edges as the control image, no filters
    edges = tmp_path / "edges.png"
    write_png(edges, canny_control(read_png(photo)))
    plain = _generate(name, store, tmp_path / "b.png", "--control-image", str(edges))
    assert plain.returncode == 0, plain.stderr
    generated, upscaled = read_png(tmp_path / "b.png"), read_png(tmp_path / "a.png")
    assert generated.shape == (64, 64, 3) and upscaled.shape == (128, 128, 3)
    with enginefarm.filters.load("up-x2", store=str(store)) as up:
        expected = up(generated)
    # b.png holds the generated image in 8 bits, a.png was upscaled from its floats: the PNGs' rounding apart
    assert np.abs(upscaled - expected).max() < 2e-2
    assert np.abs(upscaled - np.repeat(np.repeat(generated, 2, 0), 2, 1)).mean() > 1e-2  # the network, not a resize
    from enginefarm.diffusion.metadata import read_parameters

    stored = read_parameters(tmp_path / "a.png")
    assert stored["upscale"] == "up-x2" and stored["control_from"] == "canny"
    # another factor than the model's: its output resized with Lanczos, as Real-ESRGAN's helper does
    by = _generate(name, store, tmp_path / "e.png", "--control-image", str(edges), "--upscale", "up-x2",
                   "--upscale-by", "1.5")  # fmt: skip
    assert by.returncode == 0, by.stderr
    resized = read_png(tmp_path / "e.png")
    with enginefarm.filters.load("up-x2", store=str(store)) as up:
        assert resized.shape == (96, 96, 3) and np.abs(resized - up(generated, outscale=1.5)).max() < 2e-2
    assert read_parameters(tmp_path / "e.png")["upscale_by"] == 1.5

    # a flagged image: refused (nothing written, exit 1), or made black and not upscaled
    common = ("--control-image", str(edges), "--safety", "flag-all", "--upscale", "up-x2")
    refused = _generate(name, store, tmp_path / "c.png", *common, "--on-flagged", "refuse")
    assert refused.returncode == 1 and not (tmp_path / "c.png").exists(), refused.stderr
    assert "flagged by the safety checker flag-all (refused: not written)" in refused.stdout
    black = _generate(name, store, tmp_path / "d.png", *common, "--on-flagged", "black")
    assert black.returncode == 0 and "(black image written)" in black.stdout, black.stderr
    assert np.array_equal(read_png(tmp_path / "d.png"), np.zeros((64, 64, 3), np.float32))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--face-fix", "gfpgan"), "error: --face-fix gfpgan: gfpgan is not in the store"),
        (("--upscale", "CONTROLNET"), "error: CONTROLNET is not a filter: its assets have no filter.json"),
        (("--face-fix", "up-x2"), "error: --face-fix up-x2: an upscaler, not a face restorer"),
        (("--control-from", "canny"), "error: --control-from needs a photo"),
        (("--control-from", "scribble_pidsafe"), "error: --control-from pidinet: pidinet is not in the store"),
    ],
)
def test_a_missing_or_wrong_filter_is_one_line_before_generating(with_upscaler, tmp_path, args, message):
    name, store = with_upscaler
    args = tuple(name if a == "CONTROLNET" else a for a in args)
    proc = _generate(name, store, tmp_path / "x.png", *args)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-2] == message.replace("CONTROLNET", name), proc.stderr
    assert not (tmp_path / "x.png").exists()
