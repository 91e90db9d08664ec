"""The build report's pictures: one prompt and seed rendered through every backend × precision a model was built for,
each beside its difference from the fp32 reference with the numbers under it; checked in a real browser."""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest

from tests.builder.test_report import browser_or_skip
from tests.conftest import run_cli

pytest.importorskip("diffusers")


@pytest.fixture(scope="module")
def pictured(built, tmp_path_factory):
    _, out, store = built("sd1")
    report = tmp_path_factory.mktemp("report")
    proc = run_cli(
        "report",
        "--store",
        str(store),
        "--out",
        str(report),
        "--pictures",
        "--picture-steps",
        "3",
        "--seed",
        "5",
        check=True,
    )
    return report, proc


def test_every_backend_and_precision_is_rendered_beside_its_difference(pictured):
    from enginefarm.diffusion import read_png

    report, _ = pictured
    page = (report / "report.html").read_text()
    assert "<h2>Pictures</h2>" in page and "differences against onnxruntime:cpu fp32" in page
    combos = [(t, p) for t in ("onnxruntime-cpu", "openvino-cpu") for p in ("fp32", "fp16")]
    images = {c: read_png(report / f"picture-sd1-{c[0]}-{c[1]}.png") for c in combos}
    reference = images[("onnxruntime-cpu", "fp32")]
    assert not (report / "picture-sd1-onnxruntime-cpu-fp32-diff.png").exists()  # the reference has no difference
    for combo, image in images.items():
        assert image.shape == reference.shape and image.std() > 0.01  # a real picture, not a blank one
        if combo == ("onnxruntime-cpu", "fp32"):
            continue
        diff = read_png(report / f"picture-sd1-{combo[0]}-{combo[1]}-diff.png")
        # The difference image is |image - reference| × 10 (to 8-bit rounding of both PNGs).
        np.testing.assert_allclose(diff, np.clip(np.abs(image - reference) * 10, 0, 1), atol=12 / 255)
        caption = re.search(rf"<b>{combo[0].replace('-', ':')} {combo[1]}</b><br>max abs ([0-9.]+)", page)
        assert caption and abs(float(caption.group(1)) - np.abs(image - reference).max()) < 3 / 255
    assert len(re.findall(r"<figure><img alt='sd1 on ", page)) == 4
    summary = (report / "summary.md").read_text()
    assert summary.count("| sd1 | ") == 4


def test_the_pictures_show_in_headless_chromium(pictured, tmp_path):
    report, _ = pictured
    browser = browser_or_skip()
    shot = tmp_path / "report.png"
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--no-first-run",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1200,1600",
            (report / "report.html").as_uri(),
        ],
        capture_output=True,
        timeout=120,
    )
    from enginefarm.diffusion import read_png

    page = read_png(shot)
    # The pictures sit right under the status table. The page is otherwise white, grey and pale green: the rendered
    # images (random weights: coloured noise) are what makes its pixels colourful, and broken images would not be.
    colourful = (page.max(axis=2) - page.min(axis=2)) > 0.25
    assert colourful.mean() > 0.03, colourful.mean()


def test_a_store_without_assets_says_why_there_are_no_pictures(tiny_recipe, cli, tmp_path):
    cli("build", str(tiny_recipe()), "--no-bench", check=True)
    proc = cli("report", "--out", str(tmp_path / "r"), "--pictures", check=True)
    assert "no model in the store has its assets published" in proc.stderr
    assert "<h2>Pictures</h2>" not in (tmp_path / "r" / "report.html").read_text()
