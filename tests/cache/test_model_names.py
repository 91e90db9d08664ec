"""Model and component names that some file system cannot hold (issue 25, "crashes and hangs"): too long for
Windows' 260-character paths, reserved device names (`con`, `nul.txt`), a trailing dot, or a name that differs from a
stored model's only in case. Refused at recipe load and at publish, before anything is written; `enginefarm index`
over a store that already holds one skips it with a warning."""

from __future__ import annotations

import hashlib
import logging

import pytest

from enginefarm.builder.recipe import load_recipe
from enginefarm.cache.artifacts import pack_files, publish, read_index, rebuild_index
from enginefarm.cache.manifest import Manifest
from enginefarm.cache.stores import open_store
from enginefarm.errors import ConfigError, RecipeError
from tests import models

RECIPE = """
[model]
name = "{model}"
version = "1"
[defaults]
precisions = ["fp32"]
targets = ["onnxruntime:cpu"]
[components."{component}"]
source = "linear.onnx"
[components."{component}".profiles.default]
batch = [1, 1, 2]
"""
BAD = {
    "too long": ("a" * 101, "longer than 100 characters"),
    "reserved": ("con", "reserved on Windows"),
    "reserved, any case, with an extension": ("Nul.txt", "reserved on Windows"),
    "reserved port": ("LPT1", "reserved on Windows"),
    "com with extension": ("com9.x", "reserved on Windows"),
    "trailing dot": ("sd.", "ends with '.'"),
}


@pytest.mark.parametrize("where", ["model", "component"])
@pytest.mark.parametrize("name,words", BAD.values(), ids=list(BAD))
def test_a_name_no_file_system_can_hold_is_a_recipe_error(where, name, words, tmp_path):
    models.linear(tmp_path / "linear.onnx")
    path = tmp_path / "recipe.toml"
    path.write_text(
        RECIPE.format(model=name if where == "model" else "m", component=name if where == "component" else "c")
    )
    with pytest.raises(RecipeError, match=words) as caught:
        load_recipe(path)
    assert caught.value.key == ("model.name" if where == "model" else f"components.{name}") and caught.value.hint


@pytest.mark.parametrize("name", ["console", "con-net", "comfy", "sd-1.5", "a" * 100, "lpt10"])
def test_names_that_only_look_reserved_are_fine(name, tmp_path):
    models.linear(tmp_path / "linear.onnx")
    (tmp_path / "recipe.toml").write_text(RECIPE.format(model=name, component="c"))
    assert load_recipe(tmp_path / "recipe.toml").name == name


def _manifest(tmp_path, model: str, seed: str) -> tuple[Manifest, dict]:
    src = tmp_path / f"src-{seed}"
    models.linear(src / "model.onnx")
    files, blobs = pack_files(src, [("model.onnx", "model")], tmp_path / f"blobs-{seed}")
    manifest = Manifest(
        build_key=hashlib.sha256(seed.encode()).hexdigest(),
        model=model,
        model_version="1",
        component="lin",
        precision="fp32",
        profile_name="default",
        profile={"x": {"min": [1, 8], "opt": [1, 8], "max": [4, 8]}},
        target="onnxruntime:cpu",
        toolchain={"onnxruntime": "1"},
        files=tuple(files),
    )
    return manifest, blobs


def _files(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    "model,words",
    [
        ("TINY-SD", "differs only in case from tiny-sd"),
        ("a" * 260, "longer than 100 characters"),
        ("aux", "reserved on Windows"),
    ],
)
def test_publish_refuses_a_name_before_writing_anything(model, words, tmp_path):
    """Before: a 260-character name stored its blobs and manifest, then the index write crashed (File name too long);
    `TINY-SD` beside `tiny-sd` was stored (two models on Linux, one index file on Windows and macOS)."""
    store = open_store(tmp_path / "store")
    publish(store, *_manifest(tmp_path, "tiny-sd", "genuine"))
    before = _files(store.root)
    with pytest.raises(ConfigError, match=words) as caught:
        publish(store, *_manifest(tmp_path, model, "other"))
    assert "\n" not in str(caught.value) and caught.value.hint
    assert _files(store.root) == before


def test_index_skips_a_stored_manifest_whose_name_cannot_be_indexed(tmp_path, cli, caplog):
    """Before: `enginefarm index` crashed with OSError (File name too long) on a store holding such a manifest."""
    store = open_store(tmp_path / "store")
    good, blobs = _manifest(tmp_path, "m", "good")
    publish(store, good, blobs)
    long, _ = _manifest(tmp_path, "b" * 260, "long")
    (store.root / "manifests" / f"{long.build_key}.json").write_bytes(long.to_json())  # as the unfixed publish left it
    with caplog.at_level(logging.WARNING):
        assert rebuild_index(store) == {"m": 1}
    assert any(
        long.build_key[:12] in r.getMessage() and "longer than 100 characters" in r.getMessage() for r in caplog.records
    )
    assert list(read_index(store, "m").entries) == [good.build_key]
    proc = cli("index", "--store", str(store.root))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and "longer than 100 characters" in proc.stderr, (
        proc.stdout + proc.stderr
    )
