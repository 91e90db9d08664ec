"""The planner: the job matrix, its statuses, and GitHub matrices under the 256-job cap."""

from __future__ import annotations

import json

from enginefarm.builder.planner import GITHUB_MATRIX_CAP, plan, runner_labels
from enginefarm.builder.recipe import load_recipe
from enginefarm.cache.manifest import Target
from enginefarm.cache.stores import open_store


def test_matrix_is_component_x_precision_x_profile_x_target(tiny_recipe, tmp_path):
    recipe = tiny_recipe(precisions=("fp32", "fp16"), targets=("openvino:cpu", "onnxruntime:cpu", "tensorrt:sm_89"))
    planned = plan([load_recipe(recipe)], tmp_path / "dl")
    assert len(planned) == 6
    statuses = {str(p.job.target): p.status for p in planned}
    assert statuses["openvino:cpu"] == "to build"
    assert statuses["tensorrt:sm_89"].startswith("unavailable here: ")
    assert all(p.key for p in planned if p.availability.can_build)
    assert len({p.job.id for p in planned}) == 6


def test_status_becomes_built_after_a_build(tiny_recipe, cli, tmp_path):
    recipe = tiny_recipe()
    cli("build", str(recipe), "--no-bench", check=True)
    (planned,) = plan([load_recipe(recipe)], tmp_path / "dl", store=open_store(tmp_path / "store"))
    assert planned.status == "built"
    table = cli("plan", str(recipe), check=True).stdout
    assert "built" in table and planned.key[:12] in table


def test_github_matrices_split_under_the_cap(tiny_sd, write_recipe, cli):
    profiles = "\n".join(f"[components.decoder.profiles.p{i}]\nbatch = [1, 1, {i + 1}]\nheight = [8, 8, 8]\nwidth = [8, 8, 8]\n" for i in range(70))
    recipe = write_recipe(f"""
[model]
name = "big"
version = "1"
[defaults]
precisions = ["fp32", "fp16"]
targets = ["openvino:cpu", "onnxruntime:cpu"]
[components.decoder]
source = "models/tiny_sd.onnx"
{profiles}
""")
    out = json.loads(cli("plan", str(recipe), "--format", "github", check=True).stdout)
    assert out["count"] == 280
    sizes = [len(m["include"]) for m in out["matrices"]]
    assert sum(sizes) == 280 and max(sizes) <= GITHUB_MATRIX_CAP and len(sizes) == 2
    row = out["matrices"][0]["include"][0]
    assert {"id", "key", "target", "recipe", "runs_on"} <= set(row)
    as_json = json.loads(cli("plan", str(recipe), "--format", "json", "--target", "openvino:cpu", "--precision", "fp16", check=True).stdout)
    assert len(as_json) == 70 and {r["target"] for r in as_json} == {"openvino:cpu"}


def test_runner_labels_per_target():
    assert runner_labels(Target("tensorrt", "sm_89")) == ["self-hosted", "nvidia", "sm_89"]
    assert runner_labels(Target("migraphx", "gfx1100")) == ["self-hosted", "amd", "gfx1100"]
    assert runner_labels(Target("openvino", "cpu")) == ["ubuntu-latest"]


def test_build_one_job_by_id(tiny_recipe, cli, tmp_path):
    recipe = tiny_recipe(precisions=("fp32", "fp16"))
    planned = plan([load_recipe(recipe)], tmp_path / "dl")
    wanted = next(p for p in planned if p.job.precision == "fp16")
    proc = cli("build", str(recipe), "--job", wanted.job.id, "--no-bench", check=True)
    assert "1 built" in proc.stdout
    assert list(open_store(tmp_path / "store").list_manifest_keys()) == [wanted.key]
