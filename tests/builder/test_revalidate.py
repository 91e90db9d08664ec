"""Re-validation without rebuild: a change to [validate] re-checks stored artifacts; the verdict is kept and obeyed."""

from __future__ import annotations

import json

import numpy as np
import pytest

import enginefarm
from enginefarm.cache.artifacts import read_index
from enginefarm.cache.stores import open_store
from tests import models

RECIPE = """
[model]
name = "lin"
version = "1"
[defaults]
targets = ["onnxruntime:cpu", "openvino:cpu"]
[components.c]
source = "m.onnx"
[components.c.profiles.default]
batch = [1, 2, 4]
"""


@pytest.fixture
def built(tmp_path, write_recipe, cli):
    models.linear(tmp_path / "m.onnx")
    recipe = write_recipe(RECIPE)
    cli("build", str(recipe), "--no-bench", check=True)
    return recipe


def _entries(tmp_path) -> dict:
    return {e.target: e.to_dict() for e in read_index(open_store(tmp_path / "store"), "lin").entries.values()}


def test_build_revalidates_when_validate_changes_and_rebuilds_nothing(built, tmp_path, cli):
    before = _entries(tmp_path)
    proc = cli("build", str(built), "--no-bench", check=True)
    assert proc.stdout.count("exists") == 2 and "re-validated" not in proc.stdout

    built.write_text(built.read_text() + "[components.c.validate]\nseed = 7\n")  # other inputs: judge again
    assert cli("plan", str(built), check=True).stdout.count("to re-validate") == 2
    proc = cli("build", str(built), "--no-bench", "--report", str(tmp_path / "r.json"), check=True)
    assert "0 built, 0 failed, 2 already stored (2 re-validated)" in proc.stdout
    assert {r["status"] for r in json.loads((tmp_path / "r.json").read_text())} == {"revalidated"}
    after = _entries(tmp_path)
    assert {t: e["build_key"] for t, e in after.items()} == {
        t: e["build_key"] for t, e in before.items()
    }  # same engines
    assert all(
        e["validation"]["revalidated"] and e["validation"]["settings"] != before[t]["validation"]["settings"]
        for t, e in after.items()
    )
    assert "exists" in cli("build", str(built), "--no-bench", check=True).stdout  # judged under these settings now


def test_a_failed_recheck_is_recorded_obeyed_and_survives_an_index_rebuild(tmp_path, write_recipe, cli):
    models.linear(tmp_path / "m.onnx")
    # ONNX Runtime fp32 reproduces the reference exactly; OpenVINO fp16 rounds its weights
    built = write_recipe(
        RECIPE.replace(
            "[defaults]",
            '[defaults]\nprecisions = ["fp32", "fp16"]\n'
            'exclude = [{ target = "onnxruntime", precision = "fp16" }, { target = "openvino", precision = "fp32" }]',
        )
    )
    cli("build", str(built), "--no-bench", check=True)
    enginefarm.load("lin/c", target="openvino:cpu").run(
        {"x": np.ones((1, 8), np.float32)}
    )  # now in the local cache too
    # zero tolerance and an absolute noise floor of 1e-12 refuse any rounding
    built.write_text(built.read_text() + "[components.c.validate]\nmax_abs_rel = 0.0\nnoise_floor = 1e-12\n")
    proc = cli("validate", str(built))
    assert proc.returncode == 1
    assert "1 passed, 1 failed" in proc.stdout and "failed re-validation (stored, no longer served)" in proc.stderr
    verdict = _entries(tmp_path)["openvino:cpu"]["validation"]
    assert verdict["passed"] is False and "max_abs" in verdict["failure"]

    session = enginefarm.load("lin/c")  # the cached copy carries its build-time verdict: the store's newer one wins
    assert session.artifact.target == "onnxruntime:cpu"
    assert "failed validation when re-checked" in session.explain()
    assert "FAILED (re-checked): not served" in cli("ls", env={"COLUMNS": "300"}, check=True).stdout

    store = tmp_path / "store"
    (store / "index" / "lin.json").unlink()
    cli("index", "--store", str(store), check=True)
    assert _entries(tmp_path)["openvino:cpu"]["validation"]["passed"] is False  # kept in the store, not only the index

    built.write_text(built.read_text().replace("max_abs_rel = 0.0\nnoise_floor = 1e-12\n", ""))
    proc = cli("validate", str(built), check=True)
    assert "2 passed, 0 failed" in proc.stdout
    assert enginefarm.load("lin/c", precision="fp16").artifact.target == "openvino:cpu"


def test_validate_says_what_is_not_stored(tmp_path, write_recipe, cli):
    models.linear(tmp_path / "m.onnx")
    proc = cli("validate", str(write_recipe(RECIPE)), check=True)
    assert proc.stdout.count("not in the store") == 2 and "0 passed, 0 failed, 2 not stored" in proc.stdout
