"""Every bad recipe gets an error naming file, key and reason; the CLI prints it in one line, no traceback."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from enginefarm.builder.planner import plan
from enginefarm.builder.recipe import load_recipe
from enginefarm.errors import EnginefarmError, RecipeError
from tests import models

GOOD = """
[model]
name = "m"
version = "1"

[defaults]
precisions = ["fp32"]
targets = ["onnxruntime:cpu"]

[components.c]
source = "models/linear.onnx"

[components.c.profiles.default]
batch = [1, 2, 4]
"""


@pytest.fixture
def linear_model(tmp_path) -> Path:
    return models.linear(tmp_path / "models" / "linear.onnx")


def expand(path: Path, tmp_path: Path, **filters):
    return plan([load_recipe(path)], tmp_path / "dl", **filters)


def test_good_recipe_plans(linear_model, write_recipe, tmp_path):
    jobs = expand(write_recipe(GOOD), tmp_path)
    assert [(j.job.component, j.job.precision, str(j.job.target)) for j in jobs] == [("c", "fp32", "onnxruntime:cpu")]
    assert jobs[0].job.profile == {"x": {"min": [1, 8], "opt": [2, 8], "max": [4, 8]}}


CASES = [
    # (name, edit of GOOD, expected key, expected words in the reason)
    ("unknown top key", lambda s: s + "\n[extras]\nx = 1\n", "extras", "unknown key"),
    (
        "unknown component key",
        lambda s: s.replace('source = "models/linear.onnx"', 'source = "models/linear.onnx"\nsoruce = "x"'),
        "components.c.soruce",
        "unknown key",
    ),
    (
        "missing source file",
        lambda s: s.replace("models/linear.onnx", "models/nope.onnx"),
        "components.c.source",
        "file not found",
    ),
    (
        "missing source key",
        lambda s: s.replace('source = "models/linear.onnx"', ""),
        "components.c.source",
        "is required",
    ),
    (
        "sha256 mismatch",
        lambda s: s.replace(
            'source = "models/linear.onnx"', 'source = "models/linear.onnx"\nsha256 = "' + "0" * 64 + '"'
        ),
        "components.c.source",
        "does not match its sha256",
    ),
    (
        "https without sha256",
        lambda s: s.replace('"models/linear.onnx"', '"https://example.com/m.onnx"'),
        "components.c.sha256",
        "required",
    ),
    (
        "unknown backend",
        lambda s: s.replace("onnxruntime:cpu", "tensorflow:cpu"),
        "defaults.targets",
        "unknown backend",
    ),
    (
        "unknown device class",
        lambda s: s.replace("onnxruntime:cpu", "openvino:tpu"),
        "defaults.targets",
        "no device class",
    ),
    ("target without device", lambda s: s.replace("onnxruntime:cpu", "openvino"), "defaults.targets", "backend:device"),
    ("unknown precision", lambda s: s.replace('["fp32"]', '["int3"]'), "defaults.precisions", "unknown precision"),
    (
        "min > opt",
        lambda s: s.replace("[1, 2, 4]", "[3, 2, 4]"),
        "components.c.profiles.default.batch",
        "min 3 > opt 2",
    ),
    (
        "opt > max",
        lambda s: s.replace("[1, 2, 4]", "[1, 5, 4]"),
        "components.c.profiles.default.batch",
        "opt 5 > max 4",
    ),
    (
        "profile names a missing dim",
        lambda s: s.replace("batch = [1, 2, 4]", "batch = [1, 2, 4]\nheigth = [1, 1, 1]"),
        "components.c.profiles.default.heigth",
        "no model input has a dim named",
    ),
    (
        "profile names a missing input",
        lambda s: s + "\n[components.c.profiles.default.inputs.image]\nmin = [1, 8]\nopt = [1, 8]\nmax = [1, 8]\n",
        "components.c.profiles.default.inputs.image",
        "has no input 'image'",
    ),
    (
        "empty matrix",
        lambda s: s.replace('targets = ["onnxruntime:cpu"]', "targets = []"),
        "components.c.targets",
        "empty",
    ),
    ("no components", lambda s: s.split("[components.c]")[0] + "[components]\n", "components", "no components"),
    ("not TOML", lambda s: s + "\n[[[", "", "not valid TOML"),
    ("wrong type", lambda s: s.replace('version = "1"', "version = [1]"), "model.version", "string"),
    (
        "validate input missing from model",
        lambda s: s + "\n[components.c.validate]\ninputs = { latent = { low = 0.0, high = 1.0 } }\n",
        "components.c.validate.inputs.latent",
        "has no input",
    ),
    (
        "exclude of an unknown backend",
        lambda s: s.replace(
            'targets = ["onnxruntime:cpu"]',
            'targets = ["onnxruntime:cpu"]\nexclude = [{ target = "onnxrt", precision = "fp16" }]',
        ),
        "defaults.exclude[0].target",
        "unknown backend",
    ),
    (
        "exclude of an unknown precision",
        lambda s: s.replace(
            'targets = ["onnxruntime:cpu"]',
            'targets = ["onnxruntime:cpu"]\nexclude = [{ target = "onnxruntime", precision = "fp8" }]',
        ),
        "defaults.exclude[0].precision",
        "unknown precision",
    ),
    (
        "exclude not a list of tables",
        lambda s: s.replace('targets = ["onnxruntime:cpu"]', 'targets = ["onnxruntime:cpu"]\nexclude = "onnxruntime"'),
        "defaults.exclude",
        "list of tables",
    ),
    (
        "fp16_keep_fp32 names nothing in the model",
        lambda s: s.replace(
            'source = "models/linear.onnx"', 'source = "models/linear.onnx"\nfp16_keep_fp32 = ["LayerNorm"]'
        ),
        "components.c.fp16_keep_fp32",
        "no op or node named 'LayerNorm'",
    ),
    (
        "fp16_keep_fp32 scope with no node in it",
        lambda s: s.replace(
            'source = "models/linear.onnx"', 'source = "models/linear.onnx"\nfp16_keep_fp32 = ["/model/time_proj/"]'
        ),
        "components.c.fp16_keep_fp32",
        "no op or node named '/model/time_proj/'",
    ),
    (
        "dynamic dim without range",
        lambda s: s.replace("batch = [1, 2, 4]", "").replace("[components.c.profiles.default]", ""),
        "components.c.profiles",
        "dynamic",
    ),
]


@pytest.mark.parametrize("name,edit,key,words", CASES, ids=[c[0] for c in CASES])
def test_bad_recipe_names_file_key_and_reason(name, edit, key, words, linear_model, write_recipe, tmp_path):
    path = write_recipe(edit(GOOD))
    with pytest.raises(RecipeError) as caught:
        expand(path, tmp_path)
    error = caught.value
    assert error.recipe == str(path)
    assert error.key == key
    assert words in str(error)
    assert str(error).startswith(f"{path}")


def test_filter_that_matches_nothing_is_an_empty_matrix_error(linear_model, write_recipe, tmp_path):
    with pytest.raises(EnginefarmError, match="no jobs match target=openvino:gpu"):
        expand(write_recipe(GOOD), tmp_path, targets=("openvino:gpu",))


@pytest.mark.parametrize(
    "filters, hint",
    [
        ({"targets": ("openvino:gpu",)}, "the recipes offer targets: onnxruntime:cpu"),
        ({"components": ("nope",)}, "the recipes offer components: c"),
        ({"precisions": ("fp16",)}, "the recipes offer precisions: fp32"),
        ({"job_ids": ("deadbeef",)}, "`enginefarm plan RECIPE` lists the job ids"),
    ],
)
def test_an_empty_selection_hints_at_what_was_asked(linear_model, write_recipe, tmp_path, filters, hint):
    with pytest.raises(EnginefarmError) as caught:
        expand(write_recipe(GOOD), tmp_path, **filters)
    assert caught.value.hint == hint


def test_sha256_match_is_accepted(linear_model, write_recipe, tmp_path):
    digest = hashlib.sha256(linear_model.read_bytes()).hexdigest()
    text = GOOD.replace('source = "models/linear.onnx"', f'source = "file://models/linear.onnx"\nsha256 = "{digest}"')
    assert len(expand(write_recipe(text), tmp_path)) == 1


def test_corrupt_onnx_is_a_recipe_error(write_recipe, tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "linear.onnx").write_bytes(b"\x08\x07garbage that is not protobuf" * 10)
    with pytest.raises(RecipeError, match="not a valid ONNX file"):
        expand(write_recipe(GOOD), tmp_path)


@pytest.mark.parametrize("edit", [CASES[0][1], CASES[10][1], CASES[2][1]])
def test_cli_prints_one_line_and_no_traceback(edit, linear_model, write_recipe, cli, tmp_path):
    path = write_recipe(edit(GOOD))
    proc = cli("plan", str(path))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith(f"error: {path}: ")
    assert all(line.startswith(("error:", "hint:")) for line in lines), proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_recipe_leaves_the_store_untouched(linear_model, write_recipe, cli, tmp_path):
    good = write_recipe(GOOD, "good.toml")
    cli("build", str(good), "--no-bench", check=True)
    store = tmp_path / "store"
    before = sorted((p.relative_to(store), p.read_bytes()) for p in store.rglob("*") if p.is_file())
    bad = write_recipe(GOOD.replace("[1, 2, 4]", "[3, 2, 4]"), "bad.toml")
    assert cli("build", str(bad)).returncode == 1
    after = sorted((p.relative_to(store), p.read_bytes()) for p in store.rglob("*") if p.is_file())
    assert before == after
