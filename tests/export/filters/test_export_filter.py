"""`enginefarm export FILE` for a filter: the recipe and filter.json it writes, what it refuses, and --overwrite."""

from __future__ import annotations

import json
import tomllib

import pytest

from enginefarm.builder.memory import BASE, image_activation_bytes, job_need_bytes
from enginefarm.errors import ConfigError
from enginefarm.export.filters.run import export_filter
from tests.conftest import run_cli

from .upscaler_files import save, srvgg_state

pytestmark = pytest.mark.slow  # exports through the CLI


def test_the_command_writes_onnx_recipe_and_filter_json(tmp_path):
    path = save(srvgg_state(convs=2, scale=4), tmp_path / "realesr-animevideov3.pth", "params")
    out = tmp_path / "out"
    args = ("--targets", "onnxruntime:cpu", "--precisions", "fp32")
    proc = run_cli("export", str(path), "--out", str(out), "--name", "anime-x4", *args, check=True)
    assert "SRVGGNetCompact" in proc.stdout and "build it with" in proc.stdout
    recipe = tomllib.loads((out / "recipe.toml").read_text())
    assert recipe["model"]["name"] == "anime-x4" and recipe["model"]["assets"] == "assets"
    assert recipe["defaults"] == {"precisions": ["fp32"], "targets": ["onnxruntime:cpu"]}
    component = recipe["components"]["upscaler"]
    assert component["source"] == "upscaler.onnx" and (out / "upscaler.onnx").is_file()
    assert component["profiles"]["default"] == {"batch": [1, 1, 1], "height": [64, 256, 512], "width": [64, 256, 512]}
    assert component["validate"]["inputs"] == {"image": {"low": 0.0, "high": 1.0}}
    # its memory need follows its width at the output's size (16 features x 4²), not SD's VAE rule
    assert component["resources"] == {"activation_channels": 16 * 4 * 4}
    from enginefarm.builder.planner import expand
    from enginefarm.builder.recipe import load_recipe

    (job,) = expand(load_recipe(out / "recipe.toml"), tmp_path / "downloads")
    held = image_activation_bytes(16 * 4 * 4, 512 * 512 / 1e6)  # at the profile's largest tile
    assert abs(job_need_bytes(job) - (BASE + held)) < 50e6  # + the tiny weights; not SD's fitted VAE rule
    info = json.loads((out / "assets" / "filter.json").read_text())
    assert info == {
        "kind": "upscaler",
        "architecture": "SRVGGNetCompact",
        "components": ["upscaler"],
        "details": {"scale": 4, "multiple": 1, "convs": 2, "features": 16},
    }
    # a full folder is kept unless --overwrite; diffusion-only options are refused for a filter
    again = run_cli("export", str(path), "--out", str(out), *args)
    assert again.returncode != 0 and "exists and is not empty" in again.stderr
    latent = run_cli("export", str(path), "--out", str(tmp_path / "other"), "--latent", "8,8,8")
    assert latent.returncode != 0 and "--latent is for diffusion models" in latent.stderr
    assert "Traceback" not in again.stderr + latent.stderr


def test_a_profile_replaces_the_architectures_range_and_unknown_dims_are_refused(tmp_path):
    path = save(srvgg_state(convs=1, scale=2), tmp_path / "small.pth", "params")
    result = export_filter(path, tmp_path / "out", profile={"height": (32, 48, 96)}, precisions=("fp32",))
    assert result.name == "small" and result.kind == "upscaler"
    assert set(result.parts[0].deviations) == {"batch 1, height 48, width 256", "batch 1, height 96, width 64"}
    profile = tomllib.loads(result.recipe.read_text())["components"]["upscaler"]["profiles"]["default"]
    assert profile["height"] == [32, 48, 96] and profile["width"] == [64, 256, 512]
    with pytest.raises(ConfigError, match="no profile dim 'depth'"):
        export_filter(path, tmp_path / "again", profile={"depth": (1, 2, 3)})
    assert not (tmp_path / "again").exists()
