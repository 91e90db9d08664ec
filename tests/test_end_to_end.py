"""Recipe → build → local store → load → run, on the real backends, at the profile's edges."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import enginefarm
from enginefarm.cache.artifacts import read_index
from enginefarm.cache.stores import open_store
from enginefarm.errors import InputError
from tests import models
from tests.conftest import builds

TARGETS = ("openvino:cpu", "onnxruntime:cpu")
EDGES = [(1, 8, 8), (1, 16, 16), (2, 32, 32), (2, 8, 32)]


@pytest.fixture(scope="module")
@builds
def farm(tmp_path_factory):
    """All four artifacts of the tiny model, built once through the CLI with benchmarks."""
    from tests.conftest import TINY_RECIPE, run_cli

    root = tmp_path_factory.mktemp("farm")
    models.tiny_sd(root / "models" / "tiny_sd.onnx")
    recipe = root / "recipe.toml"
    recipe.write_text(TINY_RECIPE.format(precisions='["fp32", "fp16"]', targets=str(list(TARGETS)).replace("'", '"')))
    env = {"ENGINEFARM_STORE": str(root / "store"), "ENGINEFARM_HOME": str(root / "buildhome")}
    proc = run_cli("build", str(recipe), "-j", "2", env=env, check=True)
    assert "4 built, 0 failed" in proc.stdout
    again = run_cli("build", str(recipe), env=env, check=True)
    assert "0 built, 0 failed, 4 already stored" in again.stdout
    return root, recipe


def reference(model_path, latent):
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    return session.run(None, {"latent": latent})[0]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_every_artifact_runs_at_the_profile_edges(farm, target, precision, monkeypatch):
    root, _ = farm
    monkeypatch.setenv("ENGINEFARM_STORE", str(root / "store"))
    session = enginefarm.load("tiny-sd/decoder", precision=precision, device="cpu", target=target)
    assert session.artifact.target == target and session.artifact.precision == precision
    tolerance = 1e-3 if precision == "fp32" else 5e-2
    for batch, height, width in EDGES:
        latent = np.random.default_rng(height).uniform(-3, 3, (batch, 4, height, width)).astype(np.float32)
        out = session.run({"latent": latent})["sample"]
        ref = reference(root / "models" / "tiny_sd.onnx", latent)
        assert out.shape == (batch, 3, 2 * height, 2 * width)
        assert np.max(np.abs(out - ref)) <= tolerance * (ref.max() - ref.min())


def test_load_picks_the_fastest_measured_and_explains(farm, monkeypatch):
    root, _ = farm
    monkeypatch.setenv("ENGINEFARM_STORE", str(root / "store"))
    from enginefarm.cache.precision_table import tie_order
    from enginefarm.cache.records import tied

    entries = read_index(open_store(root / "store"), "tiny-sd").entries
    fastest = min(entries.values(), key=lambda e: e.benchmarks[0].p50_ms)
    session = enginefarm.load("tiny-sd/decoder", device="cpu")
    chosen = entries[session.artifact.build_key]
    why = session.explain()
    assert "also considered" in why and why.count("  - ") == 3
    if chosen is fastest:
        assert "fastest measured" in why or "tied with" in why
    else:  # within each other's noise: the tie goes to the more accurate precision
        assert tied(chosen.benchmarks[0], fastest.benchmarks[0]) and "tied with" in why
        assert tie_order(chosen.precision) <= tie_order(fastest.precision)


def test_manifest_records_benchmark_and_device(farm):
    root, _ = farm
    for entry in read_index(open_store(root / "store"), "tiny-sd").entries.values():
        (bench,) = entry.benchmarks
        assert bench.device_class.startswith("cpu-")
        assert bench.load_ms > 0 and bench.first_inference_ms > 0
        assert 0 < bench.p50_ms <= bench.p90_ms
        assert bench.rest["peak_rss_mb"] > 10


def test_inputs_outside_the_profile_get_a_clear_error(farm, monkeypatch):
    root, _ = farm
    monkeypatch.setenv("ENGINEFARM_STORE", str(root / "store"))
    session = enginefarm.load("tiny-sd/decoder", precision="fp32", device="cpu", target="onnxruntime:cpu")
    with pytest.raises(InputError, match=r"outside the artifact's profile \[1, 4, 8, 8\] \.\. \[2, 4, 32, 32\]"):
        session.run({"latent": np.zeros((1, 4, 64, 64), np.float32)})
    with pytest.raises(InputError, match="missing"):
        session.run({"x": np.zeros((1, 4, 8, 8), np.float32)})
    with pytest.raises(InputError, match="'latent' is complex64, the model takes float32") as refused:
        session.run({"latent": np.zeros((1, 4, 8, 8), np.complex64)})
    assert "float64 -> float32" in refused.value.hint
    widened = session.run({"latent": np.ones((1, 4, 8, 8), np.float64)})  # converted, as the hint says
    assert np.array_equal(widened["sample"], session.run({"latent": np.ones((1, 4, 8, 8), np.float32)})["sample"])
    with pytest.raises(
        InputError, match="'latent' is uint8, the model takes float32: converting would keep the values"
    ) as image:
        session.run({"latent": np.full((1, 4, 8, 8), 200, np.uint8)})  # an image as loaded from disk: 0..255
    assert "astype(np.float32) / 255" in image.value.hint
    with pytest.raises(InputError, match=r"run\(\) takes a dict of input name → array, got ndarray") as bare:
        session.run(np.zeros((1, 4, 8, 8), np.float32))
    assert 'session.run({"latent": array})' in bare.value.hint


def test_cli_run_writes_outputs(farm, cli, tmp_path):
    root, _ = farm
    np.save(tmp_path / "latent.npy", np.ones((1, 4, 8, 8), np.float32))
    env = {"ENGINEFARM_STORE": str(root / "store")}
    proc = cli(
        "run",
        "tiny-sd/decoder",
        "--input",
        f"latent={tmp_path / 'latent.npy'}",
        "--output",
        str(tmp_path / "out.npz"),
        "--explain",
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "sample: float32[1, 3, 16, 16]" in proc.stdout and "chose" in proc.stdout
    with np.load(tmp_path / "out.npz") as out:
        assert out["sample"].shape == (1, 3, 16, 16)
    missing = cli("run", "tiny-sd/decoder", "--input", "latent=/nope.npy", env=env)
    assert missing.returncode == 1 and missing.stderr.startswith("error: input file not found")


def test_cli_fetch_ls_and_cache(farm, cli):
    root, _ = farm
    env = {"ENGINEFARM_STORE": str(root / "store")}
    fetched = cli("fetch", "tiny-sd/decoder", "--precision", "fp16", "--target", "openvino:cpu", env=env, check=True)
    assert "openvino:cpu fp16" in fetched.stdout
    listing = cli("ls", "--json", env=env, check=True)
    assert len(__import__("json").loads(listing.stdout)) == 4
    cached = cli("cache", "ls", env=env, check=True)
    assert "openvino:cpu" in cached.stdout
    assert "ok" in cli("cache", "verify", env=env, check=True).stdout


def test_on_device_compile_when_nothing_is_stored(tiny_recipe, tmp_path, monkeypatch):
    recipe = tiny_recipe(precisions=("fp32",), targets=("openvino:cpu", "onnxruntime:cpu"))
    steps: list[str] = []
    session = enginefarm.load("tiny-sd/decoder", device="cpu", recipe=recipe, progress=steps.append)
    assert session.artifact.target == "openvino:cpu"  # IR beats plain ONNX when nothing is measured
    assert "compiled on this device" in session.explain()
    assert any("compiling" in s for s in steps) and "validate" in steps
    out = session.run({"latent": np.zeros((1, 4, 16, 16), np.float32)})["sample"]
    assert out.shape == (1, 3, 32, 32)
    # Cached: the next load (even offline) needs neither the recipe nor a compile.
    monkeypatch.setenv("ENGINEFARM_OFFLINE", "1")
    again = enginefarm.load("tiny-sd/decoder", device="cpu")
    assert again.artifact.build_key == session.artifact.build_key


def test_unnamed_dims_model_end_to_end(tmp_path, write_recipe, cli):
    models.tiny_sd(tmp_path / "models" / "anon.onnx", unnamed_dims=True)
    recipe = write_recipe("""
[model]
name = "anon"
version = "1"
[defaults]
precisions = ["fp32"]
targets = ["openvino:cpu", "onnxruntime:cpu"]
[components.decoder]
source = "models/anon.onnx"
[components.decoder.profiles.default.inputs.latent]
min = [1, 4, 8, 8]
opt = [1, 4, 16, 16]
max = [2, 4, 24, 24]
""")
    cli("build", str(recipe), "--no-bench", check=True)
    for target in ("openvino:cpu", "onnxruntime:cpu"):
        session = enginefarm.load("anon/decoder", device="cpu", target=target)
        assert session.run({"latent": np.zeros((2, 4, 24, 8), np.float32)})["sample"].shape == (2, 3, 48, 16)


def test_unknown_model_is_a_clear_error(cli):
    proc = cli("run", "nope/decoder", "--input", "x.npz")
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: input file not found") or proc.stderr.startswith("error: no artifact")
    import enginefarm as ef

    with pytest.raises(ef.EnginefarmError, match="no artifact of nope/decoder"):
        ef.load("nope/decoder", device="cpu")
