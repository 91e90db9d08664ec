"""examples/txt2img.py, an app's whole path on the runtime library: the tiny SD 1.x exported and built by the farm,
then the example run from the store alone; its PNG is the Pipeline's image, and a user's mistake is one line."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("diffusers")

ROOT = Path(__file__).resolve().parents[1]


def _example(store: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ENGINEFARM_STORE": str(store), "ENGINEFARM_HOME": str(tmp_path / "apphome")}
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / "txt2img.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def test_the_example_writes_the_pipelines_image_from_the_store_alone(built, tmp_path):
    from enginefarm.diffusion import Pipeline, read_png

    _, out, store = built("sd1")
    name = tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]
    png = tmp_path / "fox.png"
    proc = _example(
        store,
        tmp_path,
        name,
        "a red fox in the snow",
        "--steps",
        "3",
        "--seed",
        "3",
        "--scheduler",
        "ddim",
        "--precision",
        "fp32",
        "--target",
        "onnxruntime:cpu",
        "--budget",
        "auto",
        "--out",
        str(png),
    )
    assert proc.returncode == 0, proc.stderr
    for label in ("step 1/3", "step 3/3", "load unet", "text:", "denoise:", "decode:", f"wrote {png} (64x64)"):
        assert label in proc.stdout, proc.stdout
    with Pipeline.load(name, store=str(store), precision="fp32", target="onnxruntime:cpu", device="cpu") as pipe:
        expected = pipe("a red fox in the snow", steps=3, seed=3, scheduler="ddim")
    as_bytes = lambda image: (np.clip(image, 0, 1) * 255 + 0.5).astype(np.uint8)  # noqa: E731
    assert np.array_equal(as_bytes(read_png(png)), as_bytes(expected))


def test_the_example_says_what_is_wrong_in_one_line(built, tmp_path):
    _, _, store = built("sd1")
    proc = _example(store, tmp_path, "no-such-model", "a fox", "--out", str(tmp_path / "x.png"))
    assert proc.returncode == 1 and proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    assert not (tmp_path / "x.png").exists()
