"""The GitHub Actions farm workflow: valid against GitHub's schema, and its steps work when run by hand."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml

from enginefarm.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "ci" / "github" / "farm.yml"


def test_workflow_matches_githubs_schema():
    proc = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _enginefarm_lines() -> list[str]:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    lines = []
    for job in workflow["jobs"].values():
        for step in job["steps"]:
            lines += [
                line.strip() for line in step.get("run", "").splitlines() if line.strip().startswith("enginefarm ")
            ]
    return lines


def test_every_enginefarm_command_and_option_in_the_workflow_exists():
    lines = _enginefarm_lines()
    assert {line.split()[1] for line in lines} >= {"plan", "build", "report", "doctor"}
    for line in lines:
        words = line.split()
        command = cli_main.commands[words[1]]
        known = {opt for param in command.params if isinstance(param, click.Option) for opt in param.opts}
        for word in words[2:]:
            if word.startswith("--"):
                assert word in known, f"`{line}` uses {word}, which `enginefarm {words[1]}` does not have"


def test_the_workflow_runs_end_to_end_by_hand(tiny_recipe, tmp_path, cli):
    """Do what the three jobs do, in order, with a local store standing in for S3."""
    recipe = tiny_recipe(precisions=("fp32",), targets=("onnxruntime:cpu", "openvino:cpu", "tensorrt:sm_89"))
    (tmp_path / "farm-store").mkdir()  # the farm's bucket exists before its first build
    env = {"ENGINEFARM_STORE": str(tmp_path / "farm-store")}
    runners = ROOT / "ci" / "runners.toml"
    plan = json.loads(
        cli("plan", str(recipe), "--runners", str(runners), "--format", "github", env=env, check=True).stdout
    )
    matrix = plan["matrix"]["include"]
    assert plan["jobs"] == 3 and all({"name", "runs-on", "jobs", "recipes", "extras"} <= set(e) for e in matrix)
    cpu = [e for e in matrix if e["runs-on"] == ["ubuntu-latest"]]
    gpu = [e for e in matrix if "nvidia" in e["runs-on"]]
    assert len(cpu) == 2 and len(gpu) == 1 and "tensorrt" in gpu[0]["extras"]  # one entry per job while under the cap
    for index, entry in enumerate(cpu):  # the GPU entry would run on its own runner
        script = (
            f'args=""; for id in {entry["jobs"]}; do args="$args --job $id"; done; '
            f"{shlex.quote(sys.executable)} -m enginefarm.cli build {entry['recipes']} $args --report "
            f"report-{index}.json"
        )
        proc = subprocess.run(
            ["bash", "-c", script], cwd=tmp_path, env={**os.environ, **env}, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
    rerun = json.loads(
        cli("plan", str(recipe), "--runners", str(runners), "--format", "github", env=env, check=True).stdout
    )
    assert rerun["jobs"] == 1, "a re-run plans only what is not built yet"
    (tmp_path / "reports").mkdir()
    for report in tmp_path.glob("report-*.json"):
        report.rename(tmp_path / "reports" / report.name)
    out = cli(
        "report",
        "--reports",
        str(tmp_path / "reports"),
        "--recipe",
        str(recipe),
        "--runners",
        str(runners),
        "--out",
        str(tmp_path / "farm-report"),
        env=env,
        check=True,
    )
    assert "2 built, 0 failed, 1 missing" in out.stdout
    assert "tensorrt:sm_89" in (tmp_path / "farm-report" / "summary.md").read_text()


@pytest.mark.parametrize("runners_file", [ROOT / "ci" / "runners.toml"])
def test_example_runners_file_loads(runners_file):
    from enginefarm.builder.ci_runners import load_runners

    runners = load_runners(runners_file)
    assert {t for r in runners for t in r.targets} >= {
        "onnxruntime:cpu",
        "openvino:cpu",
        "tensorrt:sm_89",
        "migraphx:gfx1100",
        "coreml:apple",
    }
