"""Profiles in both forms, against real export quirks: unnamed dims ('?', -1) and names like p2o.DynamicDimension.0."""

from __future__ import annotations

import pytest

from enginefarm.builder.planner import plan
from enginefarm.builder.recipe import load_recipe
from enginefarm.errors import RecipeError
from tests import models

HEAD = """
[model]
name = "m"
version = "1"

[defaults]
targets = ["onnxruntime:cpu"]

[components.c]
source = "models/m.onnx"
"""


def profiles_of(path, tmp_path):
    return [p.job.profile for p in plan([load_recipe(path)], tmp_path / "dl")]


def test_paddle_style_names_and_unnamed_dims(tmp_path, write_recipe):
    models.two_inputs(tmp_path / "models" / "m.onnx")
    recipe = write_recipe(
        HEAD
        + """
[components.c.profiles.default]
"p2o.DynamicDimension.0" = [1, 2, 8]

[components.c.profiles.default.inputs.b]
min = [1, 4]
opt = [2, 4]
max = [8, 4]
"""
    )
    (profile,) = profiles_of(recipe, tmp_path)
    assert profile == {
        "a": {"min": [1, 4], "opt": [2, 4], "max": [8, 4]},
        "b": {"min": [1, 4], "opt": [2, 4], "max": [8, 4]},
    }


def test_unnamed_dim_without_per_input_shapes_is_explained(tmp_path, write_recipe):
    models.two_inputs(tmp_path / "models" / "m.onnx")
    recipe = write_recipe(
        HEAD
        + """
[components.c.profiles.default]
"p2o.DynamicDimension.0" = [1, 2, 8]
"""
    )
    with pytest.raises(RecipeError, match=r"input 'b' axis 0 is dynamic, unnamed") as caught:
        profiles_of(recipe, tmp_path)
    assert "inputs.b" in caught.value.hint


def test_per_input_shape_must_respect_fixed_dims(tmp_path, write_recipe):
    models.two_inputs(tmp_path / "models" / "m.onnx")
    recipe = write_recipe(
        HEAD
        + """
[components.c.profiles.default]
"p2o.DynamicDimension.0" = [1, 2, 8]

[components.c.profiles.default.inputs.b]
min = [1, 3]
opt = [2, 3]
max = [8, 3]
"""
    )
    with pytest.raises(RecipeError, match="axis 1 of 'b' is fixed at 4"):
        profiles_of(recipe, tmp_path)


def test_per_input_rank_mismatch(tmp_path, write_recipe):
    models.two_inputs(tmp_path / "models" / "m.onnx")
    recipe = write_recipe(
        HEAD
        + """
[components.c.profiles.default.inputs.a]
min = [1]
opt = [1]
max = [1]
"""
    )
    with pytest.raises(RecipeError, match="rank 1 but input 'a' has rank 2"):
        profiles_of(recipe, tmp_path)


def test_static_model_needs_no_profile(tmp_path, write_recipe):
    models.linear(tmp_path / "models" / "m.onnx", dims=(3, 8))
    (profile,) = profiles_of(write_recipe(HEAD), tmp_path)
    assert profile == {"x": {"min": [3, 8], "opt": [3, 8], "max": [3, 8]}}


def test_several_profiles_make_several_jobs(tmp_path, write_recipe):
    models.linear(tmp_path / "models" / "m.onnx")
    recipe = write_recipe(
        HEAD
        + """
[components.c.profiles.small]
batch = [1, 1, 2]
[components.c.profiles.large]
batch = [4, 8, 16]
"""
    )
    jobs = plan([load_recipe(recipe)], tmp_path / "dl")
    assert sorted(p.job.profile_name for p in jobs) == ["large", "small"]
    assert len({p.key for p in jobs}) == 2
