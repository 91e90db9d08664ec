"""A model's assets (tokenizers, scheduler and component configs) travel with its artifacts: `build` publishes the
recipe's `[model] assets` folder to the store, and an app with only the store runs the model: the assets are fetched
into the device cache and verified byte by byte like any artifact, kept by gc, rebuilt into the index."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_cli

pytest.importorskip("diffusers")


ORT_FP32 = ("--target", "onnxruntime:cpu", "--precision", "fp32", "--no-bench")  # the one job each build here needs


@pytest.fixture(scope="module")
def sd1_store(built):
    """The session's sd1 build (tests/conftest.py: built), and what building its recipe again says."""
    _, out, store = built("sd1")
    proc = run_cli(
        "build",
        str(out / "recipe.toml"),
        "--store",
        str(store),
        *ORT_FP32,
        check=True,
    )
    name = tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]
    return out, store, name, proc.stdout


def _blobs(store: Path) -> set[Path]:
    return {p for p in (store / "blobs").rglob("*") if p.is_file()}


def test_build_publishes_the_assets_once(sd1_store, tmp_path):
    out, store, name, again = sd1_store
    fresh = tmp_path / "fresh-store"
    proc = run_cli("build", str(out / "recipe.toml"), "--store", str(fresh), "--component", "assets", check=True)
    assert f"published {name}/assets v1:" in proc.stdout, proc.stdout
    files = sorted(p.relative_to(out / "assets").as_posix() for p in (out / "assets").rglob("*") if p.is_file())
    assert "tokenizer/tokenizer_config.json" in files and "scheduler/scheduler_config.json" in files
    assert f"{len(files)} files" in proc.stdout
    assert {p.name for p in _blobs(fresh)} <= {
        p.name for p in _blobs(store)
    }  # the same blobs as in the session's store
    assert f"exists    {name}/assets v1:" in again  # building again stores nothing new


def test_building_one_component_publishes_the_assets_too(sd1_store, tmp_path):
    """A big model is built part by part (`--component`): whatever part is built first, an app needs the assets with
    it. Before, only a build without a component filter (or with `--component assets`) published them."""
    out, _, name, _ = sd1_store
    fresh = tmp_path / "parts"
    proc = run_cli(
        "build",
        str(out / "recipe.toml"),
        "--store",
        str(fresh),
        "--component",
        "vae_decoder",
        *ORT_FP32,
        check=True,
    )
    assert f"published {name}/assets v1:" in proc.stdout, proc.stdout
    assert list((fresh / "index").glob("*.json"))  # the decoder and the assets, each in its model's index


def test_a_pipeline_runs_from_the_store_alone_and_matches_the_folder(sd1_store, tmp_path, monkeypatch):
    from enginefarm.diffusion import Pipeline

    out, store, name, _ = sd1_store
    monkeypatch.setenv("ENGINEFARM_HOME", str(tmp_path / "empty-home"))
    from_store = Pipeline.load(name, store=str(store), device="cpu")
    from_folder = Pipeline.load(name, store=str(store), device="cpu", assets=out / "assets")
    assert from_store.assets.folder != out / "assets" and from_store.assets.folder.is_relative_to(
        tmp_path / "empty-home"
    )
    assert from_store.family.id == "sd1"
    side = from_store.assets.native_pixels // from_store.vae_scale_factor
    latents = np.random.default_rng(0).standard_normal((1, from_store.latent_channels, side, side)).astype(np.float32)
    a = from_store("a red fox", steps=3, latents=latents)
    b = from_folder("a red fox", steps=3, latents=latents)
    assert np.array_equal(a, b)


def test_a_tampered_asset_blob_is_refused(sd1_store, tmp_path, monkeypatch):
    import shutil

    from enginefarm.diffusion import Pipeline
    from enginefarm.errors import EnginefarmError

    out, store, name, _ = sd1_store
    copy = tmp_path / "copied-store"
    shutil.copytree(store, copy)
    manifest = next(m for m in (copy / "manifests").glob("*.json") if '"component": "assets"' in m.read_text())
    import json

    record = next(
        f for f in json.loads(manifest.read_text())["files"] if f["path"] == "scheduler/scheduler_config.json"
    )
    blob = next(p for p in (copy / "blobs").rglob(record["stored_sha256"]))
    blob.write_bytes(blob.read_bytes()[:-8] + b"tampered")
    monkeypatch.setenv("ENGINEFARM_HOME", str(tmp_path / "home"))
    with pytest.raises(EnginefarmError) as raised:
        Pipeline.load(name, store=str(copy), device="cpu")
    assert "scheduler/scheduler_config.json" in str(raised.value) and "tampered" in str(raised.value)
    assert not any((tmp_path / "home").rglob("scheduler_config.json"))  # nothing unverified reached the cache


def test_gc_keeps_the_asset_blobs_and_index_rebuilds_them(sd1_store, tmp_path):
    import shutil

    out, store, name, _ = sd1_store
    copy = tmp_path / "copied-store"
    shutil.copytree(store, copy)
    before = {p.name for p in _blobs(copy)}
    run_cli("gc", "--store", str(copy), "--grace", "0s", "--delete", check=True)
    assert {p.name for p in _blobs(copy)} == before
    (copy / "index" / f"{name}.json").unlink()
    run_cli("index", "--store", str(copy), check=True)
    listed = run_cli("ls", "--store", str(copy), "--json", check=True).stdout
    assert '"component": "assets"' in listed and '"target": "assets:any"' in listed


def test_a_missing_assets_folder_is_a_recipe_error(tmp_path, write_recipe, tiny_sd):
    proc = run_cli(
        "plan",
        str(
            write_recipe("""
        [model]
        name = "m"
        version = "1"
        assets = "no-such-folder"
        [components.decoder]
        source = "models/tiny_sd.onnx"
        targets = ["onnxruntime:cpu"]
        """)
        ),
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "model.assets" in proc.stderr and "folder not found" in proc.stderr, proc.stderr


def test_a_model_without_assets_in_the_store_says_how_to_publish_them(tmp_path, tiny_recipe, cli):
    from enginefarm.diffusion import Pipeline
    from enginefarm.errors import ConfigError

    cli("build", str(tiny_recipe()), "--no-bench", check=True)
    with pytest.raises(ConfigError, match="tiny-sd has no assets in the store") as raised:
        Pipeline.load("tiny-sd", device="cpu")
    assert "[model] assets" in raised.value.hint


@pytest.mark.slow  # a build run
def test_the_assets_are_published_before_the_first_job_runs(tmp_path):
    """A build killed (or failing) before its last job left component artifacts and no MODEL/assets, and
    `Pipeline.load` said the model has no assets: they are published before any job runs now."""
    import json

    import onnx
    import onnx.helper as h

    from enginefarm.cache.stores import open_store

    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "model_index.json").write_text('{"_class_name": "StableDiffusionPipeline"}')
    graph = h.make_graph(
        [h.make_node("NoSuchOp", ["x"], ["y"], domain="no.such.domain")],
        "broken",
        [h.make_tensor_value_info("x", 1, ["batch", 4])],
        [h.make_tensor_value_info("y", 1, ["batch", 4])],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("no.such.domain", 1)])
    model.ir_version = 10
    onnx.save(model, str(tmp_path / "net.onnx"))
    (tmp_path / "recipe.toml").write_text(
        '[model]\nname = "early"\nversion = "1"\nassets = "assets"\n\n[defaults]\nprecisions = ["fp32"]\n'
        'targets = ["onnxruntime:cpu"]\n\n[components.net]\nsource = "net.onnx"\n\n'
        "[components.net.profiles.default]\nbatch = [1, 1, 2]\n"
    )
    proc = run_cli(
        "build", str(tmp_path / "recipe.toml"), "--store", str(tmp_path / "store"), "--component", "net", "--no-bench"
    )
    assert proc.returncode == 1 and "0 built, 1 failed" in proc.stdout, proc.stdout + proc.stderr
    index = json.loads(open_store(str(tmp_path / "store")).get_index_bytes("early")[0])
    assert "assets" in json.dumps(index) and '"net"' not in json.dumps(index)  # the assets only: net failed
