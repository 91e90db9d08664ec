"""The precision table is the one place a precision is described: the gate, resolution, recipes and the backends read
it, and no other module keeps a list of precisions of its own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import enginefarm
from enginefarm.backends import BACKENDS, get_backend
from enginefarm.builder.recipe import ValidateSpec, load_recipe
from enginefarm.builder.validate import Thresholds
from enginefarm.cache import precision_table
from enginefarm.errors import RecipeError
from enginefarm.runner.load import load
from enginefarm.runner.request import Request
from tests import models

ROOT = Path(enginefarm.__file__).resolve().parent.parent
PRODUCT = ("backends", "builder", "cache", "diffusion", "enginefarm", "export", "families", "runner")
# Where a list of precisions or a comparison with one is no second table: the table itself; the backends, whose
# SDK calls differ per precision (they declare `computes`); the ONNX preparation that casts to each; a model
# family's own choice of precisions (families/table.py).
MAY_NAME_PRECISIONS = ("cache/precision_table.py", "backends/", "families/table.py")
MAY_COMPARE = MAY_NAME_PRECISIONS + ("builder/prep.py", "builder/job.py")  # job: OpenVINO's fp16 keep-list


def test_rows_are_consistent():
    rows = list(precision_table.TABLE.values())
    assert precision_table.NAMES[0] == precision_table.REFERENCE
    assert [p.tie_order for p in rows] == sorted({p.tie_order for p in rows}), "distinct, in table order"
    assert len({p.onnx_type for p in rows}) == len(rows)
    assert not precision_table.get(precision_table.REFERENCE).reduced
    for p in rows:  # a coarser precision is judged no stricter than a finer one
        finer = [q for q in rows if q.epsilon < p.epsilon]
        assert all(q.min_cosine >= p.min_cosine and q.max_abs_rel <= p.max_abs_rel for q in finer), p.name
    assert precision_table.tie_order("fp8") == len(rows), "a precision from a newer builder sorts last"


def test_onnx_types_are_onnx_s():
    onnx = pytest.importorskip("onnx")
    assert {p.name: p.onnx_type for p in precision_table.TABLE.values()} == {
        "fp32": onnx.TensorProto.FLOAT,
        "fp16": onnx.TensorProto.FLOAT16,
        "bf16": onnx.TensorProto.BFLOAT16,
    }


@pytest.mark.parametrize("name", precision_table.NAMES)
def test_the_gate_reads_its_defaults_from_the_table(name):
    row = precision_table.get(name)
    found = Thresholds.for_job(name, ValidateSpec())
    assert found.epsilon == row.epsilon and found.max_abs_rel == row.max_abs_rel
    assert found.min_cosine <= row.min_cosine


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_backend_computes_precisions_of_the_table_only(name):
    backend = get_backend(name)
    assert precision_table.REFERENCE in backend.computes and backend.computes <= set(precision_table.NAMES)
    assert set(backend.lacks) <= set(precision_table.NAMES) - backend.computes
    device = backend.example_device
    for missing in set(precision_table.NAMES) - backend.computes:
        assert backend.precision_refusal(missing, device), f"{name} builds {missing} although it does not compute it"


def test_an_unknown_precision_names_the_table(tmp_path):
    models.linear(tmp_path / "models" / "linear.onnx")
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(
        '[model]\nname = "m"\nversion = "1"\n[defaults]\nprecisions = ["fp8"]\n'
        'targets = ["onnxruntime:cpu"]\n[components.c]\nsource = "models/linear.onnx"\n'
        "[components.c.profiles.default]\nbatch = [1, 2, 4]\n"
    )
    with pytest.raises(RecipeError) as caught:
        load_recipe(recipe)
    assert "unknown precision 'fp8'" in str(caught.value)
    assert caught.value.hint == "use one of: " + ", ".join(precision_table.NAMES)
    with pytest.raises(enginefarm.errors.ConfigError) as asked:
        load(Request("m/c", precision="fp8", store=str(tmp_path / "store")))
    assert precision_table.hint() in asked.value.hint


def _product_files():
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(encoding="utf-8"))


def test_no_module_keeps_its_own_list_of_precisions():
    names = set(precision_table.NAMES)
    lists, compares = [], []
    for rel, tree in _product_files():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
                items = node.keys if isinstance(node, ast.Dict) else node.elts
                if len({i.value for i in items if isinstance(i, ast.Constant) and i.value in names}) >= 2:
                    lists.append(f"{rel}:{node.lineno}")
            if isinstance(node, ast.Compare) and any(
                isinstance(c, ast.Constant) and c.value in names for c in (node.left, *node.comparators)
            ):
                compares.append(f"{rel}:{node.lineno}")
    assert [w for w in lists if not w.startswith(MAY_NAME_PRECISIONS)] == [], "read cache/precision_table.py instead"
    assert [w for w in compares if not w.startswith(MAY_COMPARE)] == [], "read cache/precision_table.py instead"
    assert lists and compares, "the scan finds the backends' own (it would pass on nothing otherwise)"
