"""The build report: status grid with reasons, validation scores, latency plots, build times and sizes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import models
from tests.conftest import TINY_RECIPE, builds, run_cli, tiny_store_env


@pytest.fixture(scope="module")
@builds
def reported(tmp_path_factory):
    """fp32 builds on both CPU backends, an fp16 ORT job forced to fail validation, and a TensorRT job missing: the
    report of them, made once (the tests only read it)."""
    root = tmp_path_factory.mktemp("report")
    models.tiny_sd(root / "models" / "tiny_sd.onnx")
    (root / "store").mkdir()
    env = tiny_store_env(root)

    def recipe(precision: str, targets: str, name: str) -> Path:
        path = root / name
        path.write_text(TINY_RECIPE.format(precisions=f'["{precision}"]', targets=targets))
        return path

    good = recipe("fp32", '["onnxruntime:cpu", "openvino:cpu", "tensorrt:sm_89"]', "good.toml")
    run_cli("build", str(good), "--report", str(root / "r1.json"), env=env, check=True)
    bad = recipe("fp16", '["onnxruntime:cpu"]', "bad.toml")
    bad.write_text(bad.read_text().replace("inputs = {", "min_cosine = 1.0\nmax_abs_rel = 0.0\ninputs = {"))
    assert run_cli("build", str(bad), "--report", str(root / "r2.json"), env=env).returncode == 1
    out = run_cli(
        "report",
        "--reports",
        str(root / "r1.json"),
        "--reports",
        str(root / "r2.json"),
        "--recipe",
        str(good),
        "--out",
        str(root / "report"),
        env=env,
        check=True,
    )
    assert "2 built, 1 failed, 1 missing" in out.stdout
    return root / "report"


def test_html_has_the_status_grid_with_reasons(reported):
    page = (reported / "report.html").read_text()
    assert (
        page.count("<td class='built'>") == 2
        and page.count("<td class='failed'>") == 1
        and page.count("<td class='missing'>") == 1
    )
    assert "validation failed" in page and "cosine" in page
    assert "tensorrt:sm_89" in page and "unavailable here" in page
    for heading in ("Status", "Latency", "Validation and benchmarks", "Build times and sizes"):
        assert f"<h2>{heading}</h2>" in page


def test_latency_plot_is_a_png_embedded_and_on_disk(reported):
    png = (reported / "latency-tiny-sd-decoder.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
    page = (reported / "report.html").read_text()
    assert len(re.findall(r"src='data:image/png;base64,[A-Za-z0-9+/=]{1000,}'", page)) == 1
    assert "<link" not in page and "<script" not in page, "the page must be self-contained"


def test_markdown_summary(reported):
    summary = (reported / "summary.md").read_text()
    assert "built **2**, failed **1**, missing **1**" in summary
    assert "| tiny-sd/decoder | fp32 |" in summary and "❌ failed" in summary
    sizes = [
        line for line in summary.splitlines() if line.startswith("| tiny-sd/decoder v1 | ") and line.count("|") == 10
    ]
    assert len(sizes) == 2
    for line in sizes:  # each build's peak memory, and its time and peak per stage
        assert re.search(
            r"\| \d+ \| prep \d+ s / \d+ MB · compile \d+ s / \d+ MB · reference .* · publish \d+ s / \d+ MB \|$", line
        ), line


def browser_or_skip() -> str:
    """Debian's chromium. CI installs it (.ci/run), so there a missing browser fails instead of skipping."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        reason = "Debian's chromium is not installed (apt-get install chromium)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}: .ci/run installs it")
        pytest.skip(reason)
    return browser


def test_report_renders_in_headless_chromium(reported, tmp_path):
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
            (reported / "report.html").as_uri(),
        ],
        capture_output=True,
        timeout=120,
    )
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 20000
