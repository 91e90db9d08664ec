"""The scheduled release-refresh workflow: valid against GitHub's schema, and its steps work when run by hand."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.releases import artifact

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "ci" / "github" / "release-refresh.yml"


def test_workflow_matches_githubs_schema():
    proc = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_refresh_steps_work_with_only_the_timestamp_key(tmp_path, cli):
    """Run the workflow's shell steps, with a local store standing in for S3 and the secret from a real init."""
    from enginefarm.cache.stores import open_store

    store = tmp_path / "store"
    artifact(open_store(store), tmp_path, "a")
    offline = tmp_path / "offline-keys"
    cli("release", "init", "--store", str(store), "--keys", str(offline), check=True)
    before = cli("release", "ls", "--store", str(store), "--json", check=True).stdout
    workflow = yaml.safe_load(WORKFLOW.read_text())
    steps = workflow["jobs"]["refresh"]["steps"]
    secret = next(offline.glob("timestamp-*.key")).read_text()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "enginefarm").write_text(f'#!/bin/sh\nexec {sys.executable} -m enginefarm.cli "$@"\n')
    (bin_dir / "enginefarm").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "RUNNER_TEMP": str(tmp_path / "runner"),
        "TIMESTAMP_KEY": secret,
        "ENGINEFARM_STORE": str(store),
        "ENGINEFARM_CHANNELS": "stable",
    }
    (tmp_path / "runner").mkdir()
    for step in steps:
        if "run" in step and not step["run"].startswith("pip install"):
            proc = subprocess.run(["bash", "-e", "-c", step["run"]], env=env, capture_output=True, text=True)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            if step.get("name") == "Refresh":
                assert "renewed timestamp of stable: v2" in proc.stdout
    import json

    roles = lambda text: json.loads(text)["roles"]  # noqa: E731
    assert (
        roles(cli("release", "ls", "--store", str(store), "--json", check=True).stdout)["timestamp"]["version"]
        == roles(before)["timestamp"]["version"] + 1
    )
    assert not (tmp_path / "runner" / "keys").exists()
