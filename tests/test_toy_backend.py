"""A new backend is one module plus one registry line: a toy backend that lives in the test suite
(tests/toy_backend.py), registered through ENGINEFARM_BACKENDS, goes through plan → build (in spawned build workers) →
resolve → load → run without any product file knowing its name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import enginefarm
from enginefarm.backends import BACKENDS, get_backend, registry
from enginefarm.errors import BackendUnavailable, ConfigError

TOY = "toy=tests.toy_backend"
PRODUCT = Path(enginefarm.__file__).resolve().parent.parent


@pytest.fixture
def toy_env(monkeypatch):
    monkeypatch.setenv("ENGINEFARM_BACKENDS", TOY)
    return {"ENGINEFARM_BACKENDS": TOY}


def test_the_toy_comes_from_outside_the_product(toy_env):
    import tests.toy_backend

    assert "toy" not in BACKENDS and registry()["toy"] == "tests.toy_backend"
    assert not Path(tests.toy_backend.__file__).resolve().is_relative_to(PRODUCT / "backends")
    for folder in ("backends", "builder", "runner", "cache", "enginefarm"):
        assert not any("toy" in path.read_text() for path in (PRODUCT / folder).glob("*.py")), folder


def test_plan_build_resolve_load_run(toy_env, cli, tiny_recipe, tmp_path):
    recipe = tiny_recipe(precisions=("fp32", "fp16"), targets=("toy:cpu",))
    planned = json.loads(cli("plan", str(recipe), "--format", "json", env=toy_env, check=True).stdout)
    jobs = planned
    assert {j["target"] for j in jobs} == {"toy:cpu"} and {j["precision"] for j in jobs} == {"fp32", "fp16"}
    assert all(j["runs_on"] == ["ubuntu-latest"] for j in jobs)  # a CPU target: the contract's default runner labels

    built = cli("build", str(recipe), "-j", "2", env=toy_env, check=True)  # -j 2: spawned workers find the toy too
    assert "2 built, 0 failed" in built.stdout

    session = enginefarm.load("tiny-sd/decoder", precision="fp32", device="cpu")
    assert session.artifact.target == "toy:cpu" and session.artifact.precision == "fp32"
    assert session.artifact.provenance["build_notes"] == {"toy_notes": "built by the toy"}  # returned by build(), kept
    assert "portable IR" in session.explain()  # ranked by the kind the toy declares
    latent = np.random.default_rng(1).uniform(-3, 3, (1, 4, 16, 16)).astype(np.float32)
    reference = ort.InferenceSession(str(tmp_path / "models" / "tiny_sd.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"latent": latent}
    )[0]
    out = session.run({"latent": latent})["sample"]
    assert np.allclose(out, reference, atol=1e-4)
    fp16 = enginefarm.load("tiny-sd/decoder", precision="fp16", device="cpu")
    assert fp16.artifact.target == "toy:cpu" and fp16.compute_precision == "fp16"


def test_without_the_registration_the_toy_is_unknown(cli, tiny_recipe):
    recipe = tiny_recipe(targets=("toy:cpu",))
    proc = cli("plan", str(recipe))
    assert proc.returncode != 0 and "unknown backend 'toy'" in proc.stderr and "Traceback" not in proc.stderr


def test_a_device_class_the_toy_lacks_is_a_recipe_error(toy_env, cli, tiny_recipe):
    proc = cli("plan", str(tiny_recipe(targets=("toy:gpu",))), env=toy_env)
    assert proc.returncode != 0 and "toy has no device class 'gpu'" in proc.stderr and "devices: cpu" in proc.stderr


def test_bad_registrations_are_clear_errors(monkeypatch):
    monkeypatch.setenv("ENGINEFARM_BACKENDS", "toy")
    with pytest.raises(ConfigError, match="not name=module"):
        registry()
    with pytest.raises(ConfigError, match="not name=module"):
        get_backend("onnxruntime")  # a built-in name skips the entry-point scan, not the variable's check
    monkeypatch.setenv("ENGINEFARM_BACKENDS", "openvino=tests.toy_backend")
    with pytest.raises(ConfigError, match="built-in"):
        registry()
    with pytest.raises(ConfigError, match="built-in"):
        get_backend("openvino")
    monkeypatch.setenv("ENGINEFARM_BACKENDS", "toy=tests.no_such_module")
    with pytest.raises(BackendUnavailable, match="cannot import tests.no_such_module"):
        get_backend("toy")
    from enginefarm.runner.detect import detect

    assert {"openvino:cpu", "onnxruntime:cpu"} <= set(detect("cpu")[0].targets)  # a broken added backend hides nothing
    monkeypatch.setenv("ENGINEFARM_BACKENDS", "toy=tests.models")  # a module without BACKEND
    with pytest.raises(BackendUnavailable, match="no BACKEND object"):
        get_backend("toy")


def test_the_contract_is_checked_when_a_backend_is_defined():
    import re

    from enginefarm.backends import Backend, Feature

    with pytest.raises(TypeError, match="declares refit but lacks check_refit, refit"):

        class NoRefit(Backend):
            name, devices, device_hint, install = "x", re.compile("cpu"), "cpu", "-"
            features = frozenset({Feature.REFIT})

    with pytest.raises(TypeError, match="has patch_weights but does not declare patch weights"):

        class Undeclared(Backend):
            name, devices, device_hint, install = "x", re.compile("cpu"), "cpu", "-"

            def patch_weights(self, artifact_dir, manifest, weights, outdir):
                return []

    with pytest.raises(TypeError, match="does not set install"):

        class Nameless(Backend):
            name, devices, device_hint = "x", re.compile("cpu"), "cpu"
