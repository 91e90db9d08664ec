"""The build key: stable, sensitive to every field that shapes the artifact, blind to the host."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from enginefarm.builder.planner import plan
from enginefarm.builder.recipe import load_recipe
from enginefarm.cache.build_keys import build_key, canonical_json
from enginefarm.cache.manifest import Target

BASE = {
    "model": "sd15",
    "model_version": "1",
    "source": "a" * 64,
    "component": "vae",
    "precision": "fp16",
    "profile": {"x": {"min": [1], "opt": [2], "max": [4]}},
    "target": "openvino:cpu",
    "toolchain": {"openvino": "2026.4.1", "onnx": "1.23.2", "opset": "17", "prep": "1"},
    "options": {},
}


def test_canonical_json_ignores_key_order():
    assert canonical_json({"b": 1, "a": [1, 2]}) == canonical_json({"a": [1, 2], "b": 1}) == b'{"a":[1,2],"b":1}'


def test_key_is_stable():
    assert build_key(BASE) == build_key(json.loads(json.dumps(BASE)))
    assert len(build_key(BASE)) == 64


CHANGES = {
    "model": "sdxl",
    "model_version": "2",
    "source": "b" * 64,
    "component": "unet",
    "precision": "fp32",
    "profile": {"x": {"min": [1], "opt": [2], "max": [8]}},
    "target": "openvino:gpu",
    "toolchain": {**BASE["toolchain"], "openvino": "2026.5.0"},
    "options": {"strip": True},
}


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_each_field_changes_the_key(field):
    assert build_key({**BASE, field: CHANGES[field]}) != build_key(BASE)


@pytest.mark.parametrize("tool", sorted(BASE["toolchain"]))
def test_each_toolchain_version_changes_the_key(tool):
    toolchain = {**BASE["toolchain"], tool: BASE["toolchain"][tool] + ".1"}
    assert build_key({**BASE, "toolchain": toolchain}) != build_key(BASE)


def _planned_keys(recipe):
    return sorted(p.key for p in plan([load_recipe(recipe)], recipe.parent / "dl"))


def test_job_keys_cover_toolchain_and_prep(tiny_recipe):
    (planned,) = plan([load_recipe(tiny_recipe())], tiny_recipe().parent / "dl")
    toolchain = planned.toolchain
    assert {"onnxruntime", "onnx", "onnxsim", "prep", "opset"} <= set(toolchain)
    assert planned.key == planned.job.key(toolchain)
    other = dataclasses.replace(planned.job, target=Target("openvino", "cpu"))
    assert other.key(toolchain) != planned.key


def test_key_does_not_depend_on_the_host(tiny_recipe, tmp_path):
    """Another process, another cwd, home, cache dir, hostname and user: the same keys."""
    recipe = tiny_recipe(precisions=("fp32", "fp16"), targets=("onnxruntime:cpu", "openvino:cpu"))
    here = _planned_keys(recipe)
    code = (
        "import sys, json; from tests.cache.test_build_keys import _planned_keys; from pathlib import Path; "
        "print(json.dumps(_planned_keys(Path(sys.argv[1]))))"
    )
    other_cwd = tmp_path / "elsewhere"
    other_cwd.mkdir()
    env = {
        **os.environ,
        "HOME": str(tmp_path / "otherhome"),
        "ENGINEFARM_HOME": str(tmp_path / "otherefhome"),
        "HOSTNAME": "farm-runner-7",
        "USER": "someone",
        "PYTHONPATH": os.pathsep.join([str(recipe.parents[0]), *sys.path]),
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    out = subprocess.run(
        [sys.executable, "-c", code, str(recipe)], capture_output=True, text=True, cwd=other_cwd, env=env, check=True
    )
    assert json.loads(out.stdout) == here
    assert len(set(here)) == 4
