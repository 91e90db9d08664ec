"""Our code around the TensorRT Python API, against the fake SDK in tests/fakes (the real one needs an NVIDIA GPU).
What is checked is what we ask TensorRT for and what we do with its answers; the fake records every call."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from enginefarm.backends import availability, get_backend
from enginefarm.builder.build import build
from enginefarm.builder.executor import run_jobs
from enginefarm.builder.planner import expand
from enginefarm.builder.recipe import load_recipe
from enginefarm.cache.manifest import Target
from enginefarm.cache.stores.local import LocalStore
from enginefarm.errors import BackendUnavailable, ConfigError, IntegrityError, RecipeError
from tests.conftest import TINY_RECIPE


def recipe(
    write_recipe, tiny_sd, targets=("tensorrt:sm_89",), precisions=("fp16",), options: str = "", backend="tensorrt"
):
    as_toml = lambda items: "[" + ", ".join(f'"{i}"' for i in items) + "]"  # noqa: E731
    text = TINY_RECIPE.format(precisions=as_toml(precisions), targets=as_toml(targets))
    if options:
        text += f"\n[components.decoder.options.{backend}]\n{options}\n"
    return write_recipe(text)


def jobs_of(path, tmp_path):
    return expand(load_recipe(path), tmp_path / "downloads")


def build_one(job, tmp_path):
    store = LocalStore(tmp_path / "store")
    result = build(job, store, tmp_path / "work", bench=False)
    return result, store


def unpacked(tmp_path, store, manifest) -> Path:
    """The artifact as the device cache materializes it: verified files in one folder."""
    from enginefarm.cache.device_cache import DeviceCache

    cache = DeviceCache(tmp_path / "home")
    cache.fetch(store, manifest)
    return cache.verified_dir(manifest.build_key)


def test_build_asks_for_the_profile_of_each_input_strongly_typed_and_stripped(
    fake_nvidia, write_recipe, tiny_sd, tmp_path
):
    (job,) = jobs_of(recipe(write_recipe, tiny_sd), tmp_path)
    result, _ = build_one(job, tmp_path)
    assert result.status == "built", result.reason
    (call,) = fake_nvidia.calls("build_serialized_network")
    assert call["profile"] == {"latent": [[1, 4, 8, 8], [1, 4, 16, 16], [2, 4, 32, 32]]}
    # opt_profiles = "edges" (the default): the opt, then its height, width or both at the max; one min and max
    assert [p["latent"][1] for p in call["profiles"]] == [
        [1, 4, 16, 16],
        [1, 4, 32, 16],
        [1, 4, 16, 32],
        [1, 4, 32, 32],
    ]
    assert {(tuple(p["latent"][0]), tuple(p["latent"][2])) for p in call["profiles"]} == {
        ((1, 4, 8, 8), (2, 4, 32, 32))
    }
    assert call["strongly_typed"] is True  # fp16 comes from the prepared fp16 ONNX, not the deprecated FP16 flag
    assert "FP16" not in call["flags"]
    assert set(call["flags"]) == {"STRIP_PLAN", "REFIT_IDENTICAL"}
    assert call["hardware_compatibility_level"] == "NONE"
    (parsed,) = fake_nvidia.calls("parse_from_file")
    assert parsed["path"].endswith("prepared-fp16.onnx")
    manifest = result.manifest
    assert {f.path: f.role for f in manifest.files} == {"model.plan": "engine", "weights.onnx": "weights"}
    assert manifest.options == {
        "strip_weights": True,
        "refittable": False,
        "version_compatible": False,
        "weight_streaming": False,
        "opt_profiles": "edges",
    }
    assert manifest.provenance["build_notes"]["optimization_profiles"] == 4
    assert manifest.validation["passed"] and manifest.validation["compute_precision"] == "fp16"
    assert manifest.constraints["runtime"] == {"tensorrt": "==10.13.0.35"}
    assert manifest.constraints["engine"]["arch"] == "sm_89"


def test_options_set_their_flags_and_change_the_key(fake_nvidia, write_recipe, tiny_sd, tmp_path):
    (plain,) = jobs_of(recipe(write_recipe, tiny_sd), tmp_path)
    options = "version_compatible = true\nrefittable = true\nstrip_weights = false"
    (tuned,) = jobs_of(recipe(write_recipe, tiny_sd, options=options), tmp_path)
    assert plain.key(plain.toolchain()) != tuned.key(tuned.toolchain())
    result, store = build_one(tuned, tmp_path)
    assert result.status == "built", result.reason
    (call,) = fake_nvidia.calls("build_serialized_network")
    assert set(call["flags"]) == {"VERSION_COMPATIBLE", "REFIT"}
    assert [f.path for f in result.manifest.files] == ["model.plan"]  # weights stay in the plan
    assert result.manifest.constraints["runtime"] == {"tensorrt": ">=10.13.0.35,<11"}
    # A version-compatible plan embeds the lean runtime: the loader must allow host code, or TensorRT refuses it.
    assert all(c["host_code_allowed"] for c in fake_nvidia.calls("deserialize_cuda_engine"))


def test_ampere_plus_is_the_hardware_compatibility_level(fake_nvidia, write_recipe, tiny_sd, tmp_path):
    (job,) = jobs_of(recipe(write_recipe, tiny_sd, targets=("tensorrt:ampere+",)), tmp_path)
    result, _ = build_one(job, tmp_path)
    assert result.status == "built", result.reason
    assert fake_nvidia.calls("build_serialized_network")[0]["hardware_compatibility_level"] == "AMPERE_PLUS"
    assert result.manifest.constraints["engine"]["hardware_compatibility"] == "ampere+"


def test_bad_options_are_recipe_errors_naming_file_and_key(fake_nvidia, write_recipe, tiny_sd):
    with pytest.raises(RecipeError, match=r"recipe.toml: components.decoder.options.tensorrt.fast_math: unknown key"):
        load_recipe(recipe(write_recipe, tiny_sd, options="fast_math = true"))
    with pytest.raises(RecipeError, match=r"components.decoder.options.tensorrt.refittable: must be a bool, got 'yes'"):
        load_recipe(recipe(write_recipe, tiny_sd, options='refittable = "yes"'))
    with pytest.raises(RecipeError, match=r"components.decoder.options.tensorrt-rtx.version_compatible: unknown key"):
        load_recipe(recipe(write_recipe, tiny_sd, options="version_compatible = true", backend="tensorrt-rtx"))


def test_timing_cache_is_fetched_combined_and_published_write_once(fake_nvidia, write_recipe, tiny_sd, tmp_path):
    first, second = jobs_of(recipe(write_recipe, tiny_sd, precisions=("fp16", "fp32")), tmp_path)
    store = LocalStore(tmp_path / "store")
    assert build(first, store, tmp_path / "work", bench=False).status == "built"
    prefix = "tensorrt-timing/sm_89/trt-10.13.0.35"
    (published,) = store.list_cache_objects(prefix)
    data = store.get_cache_object(published)
    assert published == f"{prefix}/{hashlib.sha256(data).hexdigest()}"  # content-addressed
    assert not fake_nvidia.calls("timing_cache_combine")  # nothing to merge yet
    mtime = (tmp_path / "store" / "caches" / published).stat().st_mtime_ns

    assert build(second, store, tmp_path / "work", bench=False).status == "built"
    (combined,) = fake_nvidia.calls("timing_cache_combine")
    assert combined["entries"] == json.loads(data[len(b"FAKETIMING") :])  # the first build's measurements, merged
    assert combined["ignore_mismatch"] is False
    assert len(store.list_cache_objects(prefix)) == 2
    assert store.get_cache_object(published) == data  # never rewritten
    assert (tmp_path / "store" / "caches" / published).stat().st_mtime_ns == mtime


def test_a_timing_cache_that_does_not_match_its_name_is_not_used(fake_nvidia, write_recipe, tiny_sd, tmp_path):
    (job,) = jobs_of(recipe(write_recipe, tiny_sd), tmp_path)
    store = LocalStore(tmp_path / "store")
    store.put_cache_object("tensorrt-timing/sm_89/trt-10.13.0.35/" + "0" * 64, b'FAKETIMING["poisoned"]')
    assert build(job, store, tmp_path / "work", bench=False).status == "built"
    assert not fake_nvidia.calls("timing_cache_combine")


def test_only_the_newest_timing_caches_are_merged(fake_nvidia, write_recipe, tiny_sd, tmp_path):
    """Each object is a merged superset of what its builder saw, so reading the newest few is enough; reading them
    all would make every build slower as the farm ages (and `enginefarm gc` prunes the rest)."""
    from enginefarm.cache.artifacts import CACHE_NEWEST_KEPT

    (job,) = jobs_of(recipe(write_recipe, tiny_sd), tmp_path)
    store = LocalStore(tmp_path / "store")
    prefix = "tensorrt-timing/sm_89/trt-10.13.0.35"
    for i in range(CACHE_NEWEST_KEPT + 3):
        data = f'FAKETIMING["e{i}"]'.encode()
        store.put_cache_object(f"{prefix}/{hashlib.sha256(data).hexdigest()}", data)
        path = tmp_path / "store" / "caches" / prefix / hashlib.sha256(data).hexdigest()
        os.utime(path, (1000 + i, 1000 + i))  # e0 is the oldest
    assert build(job, store, tmp_path / "work", bench=False).status == "built"
    merged = [entry for call in fake_nvidia.calls("timing_cache_combine") for entry in call["entries"]]
    assert sorted(merged) == sorted(f"e{i}" for i in range(3, CACHE_NEWEST_KEPT + 3))


def test_the_timing_cache_is_per_gpu_arch(fake_nvidia, write_recipe, tiny_sd, tmp_path):
    (job,) = jobs_of(recipe(write_recipe, tiny_sd, targets=("tensorrt:ampere+",)), tmp_path)
    store = LocalStore(tmp_path / "store")
    store.put_cache_object(
        "tensorrt-timing/sm_86/trt-10.13.0.35/" + hashlib.sha256(b'FAKETIMING["x"]').hexdigest(), b'FAKETIMING["x"]'
    )
    assert build(job, store, tmp_path / "work", bench=False).status == "built"  # built on the 4090 (sm_89)
    assert not fake_nvidia.calls("timing_cache_combine")
    assert store.list_cache_objects("tensorrt-timing/sm_89")


def test_stripped_plan_is_refitted_from_the_shipped_weights_on_load(fake_nvidia, write_recipe, tiny_sd, tmp_path):
    (job,) = jobs_of(recipe(write_recipe, tiny_sd, precisions=("fp32",)), tmp_path)
    result, store = build_one(job, tmp_path)
    folder = unpacked(tmp_path, store, result.manifest)
    fake_nvidia.clear()
    session = get_backend("tensorrt").load(folder, result.manifest, "sm_89")
    (refit,) = fake_nvidia.calls("refit_from_file")
    assert Path(refit["path"]) == folder / "weights.onnx"
    (deserialized,) = fake_nvidia.calls("deserialize_cuda_engine")
    assert deserialized["sha256"] == next(f.sha256 for f in result.manifest.files if f.role == "engine")
    assert fake_nvidia.calls("get_engine_validity")[0]["size"] == 8192  # the header only, before deserializing
    latent = np.random.default_rng(0).uniform(-1, 1, (1, 4, 8, 8)).astype(np.float32)
    reference = _ort(tiny_sd, latent)
    assert np.allclose(session.run({"latent": latent})["sample"], reference, atol=1e-5)
    assert (
        session.input_names == ["latent"] and session.output_names == ["sample"] and session.compute_precision == "fp32"
    )


def test_an_invalid_plan_is_never_deserialized(fake_nvidia, write_recipe, tiny_sd, tmp_path):
    (job,) = jobs_of(recipe(write_recipe, tiny_sd), tmp_path)
    result, store = build_one(job, tmp_path)
    folder = unpacked(tmp_path, store, result.manifest)
    fake_nvidia.set(FAKE_TRT_INVALID="1")
    fake_nvidia.clear()
    with pytest.raises(BackendUnavailable, match="not valid on this system.*VERSION_MISMATCH, UNSUPPORTED_CC"):
        get_backend("tensorrt").load(folder, result.manifest, "sm_89")
    assert fake_nvidia.calls("get_engine_validity") and not fake_nvidia.calls("deserialize_cuda_engine")


def test_without_get_engine_validity_the_plan_still_loads(fake_nvidia, write_recipe, tiny_sd, tmp_path):
    (job,) = jobs_of(recipe(write_recipe, tiny_sd), tmp_path)
    result, store = build_one(job, tmp_path)
    fake_nvidia.set(FAKE_TRT_NO_VALIDITY="1")
    fake_nvidia.clear()
    session = get_backend("tensorrt").load(unpacked(tmp_path, store, result.manifest), result.manifest, "sm_89")
    assert fake_nvidia.calls("deserialize_cuda_engine") and not fake_nvidia.calls("get_engine_validity")
    assert session.run({"latent": np.zeros((1, 4, 8, 8), np.float32)})["sample"].shape == (1, 3, 16, 16)


def test_a_plan_for_another_tensorrt_or_gpu_is_refused_before_deserializing(
    fake_nvidia, write_recipe, tiny_sd, tmp_path
):
    (job,) = jobs_of(recipe(write_recipe, tiny_sd), tmp_path)
    result, store = build_one(job, tmp_path)
    folder = unpacked(tmp_path, store, result.manifest)
    fake_nvidia.set(
        FAKE_TRT_VERSION="10.14.1.48", FAKE_TRT_NO_VALIDITY="1"
    )  # a newer TensorRT, without get_engine_validity
    fake_nvidia.clear()
    with pytest.raises(BackendUnavailable, match=r"needs tensorrt ==10.13.0.35, this is 10.14.1.48"):
        get_backend("tensorrt").load(folder, result.manifest, "sm_89")
    fake_nvidia.set(FAKE_TRT_VERSION=None, FAKE_NVML_GPUS="NVIDIA GeForce RTX 3060:8.6")
    with pytest.raises(
        BackendUnavailable,
        match=r"sm_89 needs a matching NVIDIA GPU; this machine has NVIDIA GeForce RTX 3060 \(sm_86\)",
    ):
        get_backend("tensorrt").load(folder, result.manifest, "sm_89")
    assert not fake_nvidia.calls("deserialize_cuda_engine")


def test_unverified_plan_bytes_are_refused(fake_nvidia, write_recipe, tiny_sd, tmp_path):
    (job,) = jobs_of(recipe(write_recipe, tiny_sd), tmp_path)
    result, store = build_one(job, tmp_path)
    folder = Path(tmp_path / "copy")
    import shutil

    shutil.copytree(unpacked(tmp_path, store, result.manifest), folder)
    plan = folder / "model.plan"
    plan.write_bytes(plan.read_bytes()[:-1] + b"X")  # one byte changed after verification
    fake_nvidia.clear()
    with pytest.raises(IntegrityError, match="does not match its manifest; refusing to deserialize"):
        get_backend("tensorrt").load(folder, result.manifest, "sm_89")
    outside = tmp_path / "elsewhere.plan"
    outside.write_bytes(b"anything")
    plan.unlink()
    plan.symlink_to(outside)
    with pytest.raises(IntegrityError, match="outside its artifact folder"):
        get_backend("tensorrt").load(folder, result.manifest, "sm_89")
    assert not fake_nvidia.calls("deserialize_cuda_engine") and not fake_nvidia.calls("get_engine_validity")


def test_refit_replaces_named_weights_and_keeps_nothing_from_earlier_refits(
    fake_nvidia, write_recipe, tiny_sd, tmp_path
):
    import onnx
    from onnx import numpy_helper

    (job,) = jobs_of(recipe(write_recipe, tiny_sd, precisions=("fp32",), options="refittable = true"), tmp_path)
    result, store = build_one(job, tmp_path)
    assert "REFIT" in fake_nvidia.calls("build_serialized_network")[0]["flags"]
    folder = unpacked(tmp_path, store, result.manifest)
    backend = get_backend("tensorrt")
    init = onnx.load(str(tiny_sd)).graph.initializer[0]
    changed = {init.name: (numpy_helper.to_array(init) * 2).astype(np.float32)}
    latent = np.random.default_rng(1).uniform(-1, 1, (1, 4, 8, 8)).astype(np.float32)
    refitted = backend.refit(folder, result.manifest, changed, "sm_89").run({"latent": latent})["sample"]
    assert np.allclose(refitted, _ort(tiny_sd, latent, changed), atol=1e-5)
    assert not np.allclose(refitted, _ort(tiny_sd, latent), atol=1e-3)
    # The next stack starts again from the artifact's own weights.
    again = backend.refit(folder, result.manifest, {}, "sm_89").run({"latent": latent})["sample"]
    assert np.allclose(again, _ort(tiny_sd, latent), atol=1e-5)
    with pytest.raises(ConfigError, match="no refittable weights"):
        backend.refit(folder, result.manifest, {"no_such_weight": np.zeros(3, np.float32)}, "sm_89")


def test_refit_needs_a_refittable_plan(fake_nvidia, write_recipe, tiny_sd, tmp_path):
    (job,) = jobs_of(recipe(write_recipe, tiny_sd), tmp_path)
    result, store = build_one(job, tmp_path)
    with pytest.raises(ConfigError, match="not built refittable"):
        get_backend("tensorrt").refit(
            unpacked(tmp_path, store, result.manifest), result.manifest, {"w": np.zeros(1, np.float32)}, "sm_89"
        )


@pytest.mark.parametrize(
    "crash,why",
    [("segfault", "killed by SIGSEGV"), ("exit", "exit code 3"), ("oom", "killed by SIGKILL: out of memory?")],
)
def test_an_sdk_crash_fails_its_job_and_the_farm_goes_on(fake_nvidia, write_recipe, tiny_sd, tmp_path, crash, why):
    fake_nvidia.set(FAKE_TRT_CRASH=crash, FAKE_TRT_CRASH_IF="fp16")
    jobs = jobs_of(recipe(write_recipe, tiny_sd, precisions=("fp16", "fp32")), tmp_path)
    results = {
        r.what["precision"]: r
        for r in run_jobs(jobs, str(tmp_path / "store"), tmp_path / "work", parallel=1, bench=False)
    }
    assert results["fp16"].status == "failed" and why in results["fp16"].reason
    assert results["fp32"].status == "built", results["fp32"].reason


def test_available_says_why_not(fake_nvidia, monkeypatch):
    assert availability(Target("tensorrt", "sm_89")).can_load
    assert availability(Target("tensorrt", "ampere+")).can_build
    wrong = availability(Target("tensorrt", "sm_86"))
    assert (
        not wrong.can_build
        and "sm_86 needs a matching NVIDIA GPU; this machine has NVIDIA GeForce RTX 4090 (sm_89)" in wrong.reason
    )
    fake_nvidia.set(FAKE_NVML_GPUS="NVIDIA GeForce GTX 1660:7.5")
    old = availability(Target("tensorrt", "ampere+"))
    assert not old.can_build and "GTX 1660 (sm_75)" in old.reason
    fake_nvidia.set(FAKE_NVML_GPUS="")
    none = availability(Target("tensorrt", "sm_89"))
    assert (
        not none.can_build
        and "TensorRT 10.13.0.35 is installed, but NVML did not start: Driver Not Loaded" in none.reason
    )


def test_without_the_sdk_the_reason_names_nvidias_index_and_the_gpu():
    reason = availability(Target("tensorrt", "sm_89")).reason
    assert "tensorrt is not installed" in reason and "NVIDIA's package index, which must be reachable" in reason
    assert "; and nvidia-ml-py is not installed" in reason or "; and NVML did not start" in reason  # no GPU here either


def test_enginefarm_load_picks_and_runs_the_tensorrt_artifact(fake_nvidia, write_recipe, tiny_sd, tmp_path, cli):
    import enginefarm

    path = recipe(write_recipe, tiny_sd, targets=("tensorrt:sm_89", "onnxruntime:cpu"), precisions=("fp32",))
    cli("build", str(path), "--store", str(tmp_path / "store"), check=True)
    session = enginefarm.load("tiny-sd/decoder", store=str(tmp_path / "store"))
    assert session.artifact.target == "tensorrt:sm_89"
    assert "exact-arch engine" in session.explain()
    latent = np.ones((1, 4, 8, 8), np.float32)
    assert np.allclose(session.run({"latent": latent})["sample"], _ort(tiny_sd, latent), atol=1e-5)
    bench = session.artifact.benchmarks[0]
    assert bench["device"]["class"] == "nvidia-sm_89"  # ranks against the device's bench class


def test_plan_and_doctor_explain_a_missing_sdk(write_recipe, tiny_sd, cli):
    out = cli(
        "plan", str(recipe(write_recipe, tiny_sd, targets=("tensorrt:sm_89", "tensorrt-rtx:ampere+"))), check=True
    ).stdout
    assert "unavailable here: tensorrt is not installed" in " ".join(out.split())
    doctor = " ".join(cli("doctor", check=True).stdout.split())
    assert "NVIDIA's package index" in doctor


def _ort(model: Path, latent: np.ndarray, weights: dict | None = None) -> np.ndarray:
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    proto = onnx.load(str(model))
    for init in proto.graph.initializer:
        if weights and init.name in weights:
            init.CopyFrom(numpy_helper.from_array(weights[init.name], init.name))
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"latent": latent})[0]


def test_options_of_one_backend_leave_other_targets_keys_alone(fake_nvidia, write_recipe, tiny_sd, tmp_path):
    targets = ("tensorrt:sm_89", "tensorrt-rtx:ampere+", "onnxruntime:cpu")
    plain = {
        str(j.target): j.key(j.toolchain()) for j in jobs_of(recipe(write_recipe, tiny_sd, targets=targets), tmp_path)
    }
    tuned = {
        str(j.target): j
        for j in jobs_of(recipe(write_recipe, tiny_sd, targets=targets, options="refittable = true"), tmp_path)
    }
    assert (
        tuned["onnxruntime:cpu"].options == {}
        and tuned["onnxruntime:cpu"].key(tuned["onnxruntime:cpu"].toolchain()) == plain["onnxruntime:cpu"]
    )
    assert tuned["tensorrt-rtx:ampere+"].key(tuned["tensorrt-rtx:ampere+"].toolchain()) == plain["tensorrt-rtx:ampere+"]
    assert tuned["tensorrt:sm_89"].key(tuned["tensorrt:sm_89"].toolchain()) != plain["tensorrt:sm_89"]


def test_resolution_filters_on_the_constraints_the_backend_emits(fake_nvidia, write_recipe, tiny_sd, tmp_path):
    from enginefarm.cache.index import IndexEntry
    from enginefarm.hardware.devices import nvidia_device
    from enginefarm.runner.detect import with_targets
    from enginefarm.runner.resolve import resolve

    (job,) = jobs_of(recipe(write_recipe, tiny_sd, options="version_compatible = true"), tmp_path)
    result, _ = build_one(job, tmp_path)
    entries = [(IndexEntry.of(result.manifest), "store")]
    rtx_4090 = with_targets(nvidia_device("NVIDIA GeForce RTX 4090", 8, 9, "550.54.14", 24564))

    def why(device) -> str:
        (candidate,) = resolve("tiny-sd/decoder", entries, None, [device]).candidates
        return candidate.reason

    assert why(rtx_4090) == ""
    fake_nvidia.set(FAKE_TRT_VERSION="10.14.1.48")  # version-compatible: a newer 10.x loads it
    assert why(rtx_4090) == ""
    fake_nvidia.set(FAKE_TRT_VERSION="11.0.0.1")
    assert why(rtx_4090) == "needs tensorrt >=10.13.0.35,<11, this has 11.0.0.1"
    fake_nvidia.set(FAKE_TRT_VERSION=None)
    windows = replace(rtx_4090, info={**rtx_4090.info, "os": "windows"})
    assert why(windows) == "built for linux, this is windows"


def test_stopping_the_farm_stops_a_tensorrt_build_in_progress(fake_nvidia, write_recipe, tiny_sd, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    import psutil

    pidfile = tmp_path / "build.pid"
    fake_nvidia.set(FAKE_TRT_CRASH="hang", FAKE_TRT_PIDFILE=str(pidfile))
    proc = subprocess.Popen(
        [sys.executable, "-m", "enginefarm.cli", "build", str(recipe(write_recipe, tiny_sd)), "--no-bench"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not pidfile.exists():
        assert proc.poll() is None and time.monotonic() < deadline, (
            proc.communicate()[1] if proc.poll() is not None else "the build never started"
        )
        time.sleep(0.05)
    build = psutil.Process(int(pidfile.read_text()))
    try:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
        gone, alive = psutil.wait_procs([build], timeout=30)
        assert not alive, "the TensorRT build process outlived the farm that started it"
    finally:
        for process in (build, psutil.Process(proc.pid) if proc.poll() is None else None):
            try:
                process and process.kill()
            except psutil.NoSuchProcess:
                pass
