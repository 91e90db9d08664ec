"""The planner: the job matrix, its statuses, and GitHub matrices under the 256-job cap."""

from __future__ import annotations

import json
from pathlib import Path

from enginefarm.builder import memory
from enginefarm.builder.ci_matrix import GITHUB_MATRIX_CAP, github_matrix
from enginefarm.builder.ci_runners import runner_labels
from enginefarm.builder.planner import plan
from enginefarm.builder.recipe import load_recipe
from enginefarm.cache.manifest import Target
from enginefarm.cache.stores import open_store
from tests.conftest import profile_tables

ROOT = Path(__file__).resolve().parents[2]


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
    profiles = profile_tables(70)
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
    assert out["jobs"] == 280
    entries = out["matrix"]["include"]
    assert len(entries) == out["entries"] <= GITHUB_MATRIX_CAP
    ids = [job for entry in entries for job in entry["jobs"].split()]
    assert len(ids) == len(set(ids)) == 280
    assert {tuple(e["runs-on"]) for e in entries} == {("ubuntu-latest",)}
    assert {"name", "runs-on", "jobs", "recipes", "extras", "memory_gb"} == set(entries[0])
    assert entries[0]["memory_gb"] == memory.gb(memory.need_bytes(tiny_sd.stat().st_size))  # what the runner must have
    as_json = json.loads(
        cli(
            "plan", str(recipe), "--format", "json", "--target", "openvino:cpu", "--precision", "fp16", check=True
        ).stdout
    )
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


RUNNERS = """
[[runner]]
name = "cpu"
labels = ["ubuntu-latest"]
targets = ["onnxruntime:cpu", "openvino:cpu"]
ram_gb = 16

[[runner]]
name = "rtx3060"
labels = ["self-hosted", "nvidia", "sm_86"]
targets = ["tensorrt:sm_86", "tensorrt:ampere+"]
ram_gb = 32
vram_gb = 12

[[runner]]
name = "a6000"
labels = ["self-hosted", "nvidia", "sm_86", "big"]
targets = ["tensorrt:sm_86", "tensorrt:ampere+"]
ram_gb = 128
vram_gb = 48
"""


def test_memory_aware_routing(tiny_recipe, tmp_path, cli):
    runners = tmp_path / "runners.toml"
    runners.write_text(RUNNERS)
    recipe = tiny_recipe(targets=("onnxruntime:cpu", "tensorrt:sm_86", "tensorrt:sm_89"))
    text = recipe.read_text().replace(
        "[components.decoder.validate]",
        "[components.decoder.resources]\nhost_ram_gb = 24\ngpu_vram_gb = 16\n\n[components.decoder.validate]",
    )
    recipe.write_text(text)
    rows = {
        r["target"]: r
        for r in json.loads(cli("plan", str(recipe), "--runners", str(runners), "--format", "json", check=True).stdout)
    }
    assert rows["tensorrt:sm_86"]["runs_on"] == ["self-hosted", "nvidia", "sm_86", "big"]  # the 12 GB card is too small
    assert rows["onnxruntime:cpu"]["status"].startswith(
        "no runner has enough memory: needs 24 GB RAM (largest onnxruntime:cpu runner: 16)"
    )
    assert rows["tensorrt:sm_89"]["status"] == "no runner builds tensorrt:sm_89"
    github = json.loads(cli("plan", str(recipe), "--runners", str(runners), "--format", "github", check=True).stdout)
    assert [e["runs-on"] for e in github["matrix"]["include"]] == [["self-hosted", "nvidia", "sm_86", "big"]]
    assert len(github["skipped"]) == 2
    only = json.loads(
        cli(
            "plan",
            str(recipe),
            "--runners",
            str(runners),
            "--runner-labels",
            "self-hosted,nvidia,sm_86,big",
            "--format",
            "json",
            check=True,
        ).stdout
    )
    assert [r["target"] for r in only] == ["tensorrt:sm_86"]


def test_bad_runners_file_is_a_clear_error(tiny_recipe, tmp_path, cli):
    runners = tmp_path / "runners.toml"
    runners.write_text('[[runner]]\nlabels = ["x"]\ntargets = ["onnxruntime:cpu"]\nvram = 3\n')
    proc = cli("plan", str(tiny_recipe()), "--runners", str(runners))
    assert proc.returncode == 1 and proc.stderr.startswith(f"error: {runners}: runner[0].vram: unknown key")


def test_matrix_batches_jobs_when_over_the_cap(tiny_recipe, tmp_path):
    recipe = tiny_recipe(precisions=("fp32", "fp16"), targets=("onnxruntime:cpu", "openvino:cpu"))
    planned = plan([load_recipe(recipe)], tmp_path / "dl")
    out = github_matrix(planned, cap=3)
    assert out["entries"] <= 3 and out["jobs"] == 4
    assert sorted(j for e in out["matrix"]["include"] for j in e["jobs"].split()) == sorted(p.job.id for p in planned)


def test_the_all_vendors_recipe_plans_every_target(tiny_sd, tmp_path, cli):
    """One recipe lists targets for every vendor; plan says what builds here and which runner the rest needs."""
    recipe = tmp_path / "all.toml"
    recipe.write_text((ROOT / "recipes" / "tiny_sd_all_vendors.toml").read_text())
    rows = json.loads(
        cli("plan", str(recipe), "--runners", str(ROOT / "ci" / "runners.toml"), "--format", "json", check=True).stdout
    )
    status = {r["target"]: r["status"] for r in rows}
    assert len(status) == 9
    assert status["onnxruntime:cpu"] == status["openvino:cpu"] == "to build"
    assert status["tensorrt:sm_89"].endswith("needs a runner with self-hosted, nvidia, sm_89")
    assert status["migraphx:gfx1100"].endswith("needs a runner with self-hosted, amd, gfx1100")
    # TensorRT-RTX builds on the CPU runner when its SDK is installed (the test extra brings it); it runs on a GPU.
    rtx = next(r for r in rows if r["target"] == "tensorrt-rtx:ampere+")
    assert rtx["status"].startswith("to build here (builds here without a GPU (TensorRT-RTX ") and rtx["runs_on"] == [
        "ubuntu-latest"
    ]
    # Core ML converts on any OS where the coreml extra is installed (the test extra brings it); it runs only on a Mac.
    from enginefarm.backends import coreml

    here = coreml.BACKEND.available("apple")
    if here.can_load:
        assert status["coreml:apple"] == "to build"
    elif here.can_build:
        assert status["coreml:apple"].startswith("to build here (Core ML runs only on macOS (this is ")
    else:
        assert status["coreml:apple"].endswith("needs a runner with macos-14")
