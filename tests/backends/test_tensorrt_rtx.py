"""TensorRT-RTX. Every engine these tests build, the real SDK builds (it needs no GPU); what needs a GPU (deserialize,
run, refit, the runtime cache, builds with GPU-only options) runs against the fake SDK in tests/fakes, which
test_nvidia_sdk_conformance.py keeps honest."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from enginefarm.backends import availability, get_backend, tensorrt_rtx
from enginefarm.builder.build import build
from enginefarm.builder.ci_matrix import github_matrix
from enginefarm.builder.ci_runners import load_runners
from enginefarm.builder.planner import plan
from enginefarm.builder.recipe import load_recipe
from enginefarm.cache.manifest import Target
from enginefarm.cache.stores.local import LocalStore
from enginefarm.errors import BackendUnavailable, BuildError
from tests import models
from tests.backends.test_tensorrt import build_one, jobs_of, recipe, unpacked

CLASSES = {
    "sm_75": ["SM75"],
    "sm_86": ["SM86"],
    "sm_89": ["SM89"],
    "sm_120": ["SM120"],
    "turing+": ["SM75", "SM86", "SM89", "SM120", "SM121"],
    "ampere+": [],
    "ada+": ["SM89", "SM120", "SM121"],
    "blackwell+": ["SM120", "SM121"],
}
RUNNERS = """
[[runner]]
name = "cpu"
labels = ["ubuntu-latest"]
targets = ["tensorrt-rtx:ampere+"]
ram_gb = 16
"""
GPU_RUNNER = """
[[runner]]
name = "rtx4090"
labels = ["self-hosted", "nvidia", "sm_89"]
targets = ["tensorrt-rtx:ampere+"]
ram_gb = 64
vram_gb = 24
"""


def one_model(name: str, target: str, **dims: list[int]) -> str:
    """A recipe for models/NAME.onnx as component `net`, fp32, one target, the profile's dims by name."""
    profile = "\n".join(f"{dim} = {bounds}" for dim, bounds in dims.items())
    return (
        f'[model]\nname = "{name}"\nversion = "1"\n[defaults]\nprecisions = ["fp32"]\ntargets = ["{target}"]\n'
        f'[components.net]\nsource = "models/{name}.onnx"\n[components.net.profiles.default]\n{profile}\n'
    )


def test_a_recipe_without_options_builds_every_class_on_this_cpu(real_rtx, write_recipe, tiny_sd, tmp_path):
    jobs = jobs_of(recipe(write_recipe, tiny_sd, targets=tuple(f"tensorrt-rtx:{c}" for c in CLASSES)), tmp_path)
    store = LocalStore(tmp_path / "store")
    plans = {}
    for job in jobs:
        result = build(job, store, tmp_path / "work", bench=False)
        assert result.status == "built", result.reason
        manifest = result.manifest
        assert {f.path: f.role for f in manifest.files if f.role != "golden"} == {
            "model.plan": "engine"
        }  # weights embedded
        assert manifest.options == {
            "strip_weights": False,
            "refittable": False,
            "weight_streaming": False,
            "opt_profiles": "opt",
        }
        assert manifest.constraints["runtime"] == {"tensorrt-rtx": "==1.7.1.116"}
        assert manifest.constraints["engine"] == {
            "compute_capabilities": CLASSES[job.target.device] or ["SM86 and later (SDK default)"],
            "weights": "embedded",
        }
        validation = manifest.validation
        assert validation["passed"] is None and validation["executed"] is False
        assert validation["why"].startswith(
            "built without the device to run it (builds here without a GPU (TensorRT-RTX 1.7.1.116)"
        )
        engine = next(f for f in manifest.files if f.role == "engine")
        assert engine.size > 50_000
        plans[job.target.device] = engine.sha256
    assert len({plans["sm_75"], plans["sm_86"], plans["sm_120"]}) == 3  # the capability reached the SDK


def test_weight_streaming_builds_a_streamable_plan_on_this_cpu(real_rtx, write_recipe, tiny_sd, tmp_path):
    """`weight_streaming = true`: the real SDK's CPU-only build sets WEIGHT_STREAMING for SM86 and writes another plan,
    and the option is in the manifest (and the build key) for the runtime to set its budget."""
    plain = recipe(write_recipe, tiny_sd, targets=("tensorrt-rtx:sm_86",), precisions=("fp16",))
    streamed = write_recipe(
        plain.read_text() + "\n[components.decoder.options.tensorrt-rtx]\nweight_streaming = true\n", "streamed.toml"
    )
    (plain_job,), (streamed_job,) = jobs_of(plain, tmp_path), jobs_of(streamed, tmp_path)
    assert plain_job.build_key != streamed_job.build_key
    results = [
        build(job, LocalStore(tmp_path / "store"), tmp_path / "work", bench=False) for job in (plain_job, streamed_job)
    ]
    assert [r.status for r in results] == ["built", "built"], [r.reason for r in results]
    assert results[1].manifest.options == {
        "strip_weights": False,
        "refittable": False,
        "weight_streaming": True,
        "opt_profiles": "opt",
    }
    engines = [next(f for f in r.manifest.files if f.role == "engine") for r in results]
    assert engines[0].sha256 != engines[1].sha256  # the flag reached the SDK


def test_the_real_sdk_is_available_to_build_here_not_to_run(real_rtx):
    here = availability(Target("tensorrt-rtx", "ampere+"))
    assert here.can_build and not here.can_load
    assert here.reason.startswith(
        "builds here without a GPU (TensorRT-RTX 1.7.1.116), cannot run here: NVML did not start"
    )


@pytest.mark.parametrize("device", sorted(CLASSES))
def test_device_classes_name_the_capabilities_the_sdk_knows(real_rtx, device):
    assert tensorrt_rtx.compute_capabilities(real_rtx, device) == CLASSES[device]


def test_an_unknown_compute_capability_is_a_build_error(real_rtx):
    with pytest.raises(BuildError, match="TensorRT-RTX 1.7.1.116 cannot target sm_90") as caught:
        tensorrt_rtx.compute_capabilities(real_rtx, "sm_90")
    assert caught.value.hint == "it knows: SM75, SM80, SM86, SM89, SM120, SM121"


def test_fp32_for_turing_is_refused_at_plan_time_naming_the_gemms(real_rtx, write_recipe, tiny_sd, tmp_path):
    path = recipe(
        write_recipe,
        tiny_sd,
        targets=("tensorrt-rtx:turing+", "tensorrt-rtx:sm_75", "tensorrt-rtx:ampere+"),
        precisions=("fp32", "fp16"),
    )
    planned = {(p.job.precision, p.job.target.device): p for p in plan([load_recipe(path)], tmp_path / "dl")}
    refused = planned["fp32", "turing+"].status
    assert refused == (
        "refused: TensorRT-RTX cannot compile fp32 GEMMs for Turing (SM75): 'FP32 GEMM is not supported' for "
        "MatMul(attn.q), "
        'MatMul(attn.k), MatMul(attn.v) and 3 more; build tensorrt-rtx:turing+ in fp16 (precisions = ["fp16"]), or '
        "target ampere+ for fp32"
    )
    assert planned["fp32", "sm_75"].status.startswith(
        "refused: TensorRT-RTX cannot compile fp32 GEMMs for Turing (SM75)"
    )
    for ok in (("fp16", "turing+"), ("fp16", "sm_75"), ("fp32", "ampere+")):
        assert planned[ok].status.startswith("to build here (builds here without a GPU"), planned[ok].status
    matrix = github_matrix(list(planned.values()))
    assert matrix["jobs"] == 4 and {s["id"] for s in matrix["skipped"]} == {
        planned["fp32", "turing+"].job.id,
        planned["fp32", "sm_75"].job.id,
    }

    # The SDK agrees: built anyway, the same job fails in its own words, and the hint says what to do.
    job = planned["fp32", "sm_75"].job
    result = build(job, LocalStore(tmp_path / "store"), tmp_path / "work", bench=False)
    assert result.status == "failed" and result.reason.startswith(
        f"{job.label}: TensorRT-RTX cannot compile fp32 GEMMs"
    )  # build() checks too
    from enginefarm.builder.prep import prepare

    workdir = tmp_path / "direct" / "artifact"
    workdir.mkdir(parents=True)
    with pytest.raises(
        BuildError,
        match=r"build_serialized_network failed: .*Cannot compile operation '\w+' for Turing \(SM75\): FP32 GEMM is "
        r"not supported",
    ) as caught:
        get_backend("tensorrt-rtx").build(prepare(tiny_sd, "fp32", tmp_path / "prep").path, job, workdir)
    assert caught.value.hint.startswith("Turing (SM75) runs GEMMs in fp16 only")


def test_fp32_for_turing_builds_when_the_model_has_no_gemm(real_rtx, write_recipe, tmp_path):
    models.convs(tmp_path / "models" / "convs.onnx")
    path = write_recipe(one_model("convs", "tensorrt-rtx:turing+", batch=[1, 1, 2], h=[8, 16, 32], w=[8, 16, 32]))
    (planned,) = plan([load_recipe(path)], tmp_path / "dl")
    assert not planned.refused
    result = build(planned.job, LocalStore(tmp_path / "store"), tmp_path / "work", bench=False)
    assert result.status == "built", result.reason


@pytest.mark.parametrize("option", ["strip_weights", "refittable"])
def test_gpu_only_options_go_to_gpu_runners_or_are_refused(real_rtx, write_recipe, tiny_sd, tmp_path, cli, option):
    path = recipe(
        write_recipe, tiny_sd, targets=("tensorrt-rtx:ampere+",), options=f"{option} = true", backend="tensorrt-rtx"
    )
    (here,) = plan([load_recipe(path)], tmp_path / "dl")
    assert re.fullmatch(
        re.escape(
            f"unavailable here: {option} = true needs an NVIDIA GPU at build time (TensorRT-RTX builds no "
            "weight-stripped or "
            "refittable engine without one), and this machine has none (NVML did not start: "
        )
        + r"[^)]+\); "
        + re.escape("needs a runner with self-hosted, nvidia, ampere+"),
        here.status,
    ), here.status
    farm = tmp_path / "farm.toml"
    farm.write_text(RUNNERS + GPU_RUNNER)
    (routed,) = plan([load_recipe(path)], tmp_path / "dl", runners=load_runners(farm))
    assert routed.runs_on == ["self-hosted", "nvidia", "sm_89"] and not routed.unroutable

    cpu_only = tmp_path / "cpu.toml"
    cpu_only.write_text(RUNNERS)
    rows = json.loads(cli("plan", str(path), "--runners", str(cpu_only), "--format", "json", check=True).stdout)
    assert rows[0]["status"] == (
        f"refused: {option} = true needs an NVIDIA GPU at build time (TensorRT-RTX builds no weight-stripped or "
        f"refittable engine without one), and no runner with a GPU builds tensorrt-rtx:ampere+; set {option} = false "
        "in "
        "[components.decoder.options.tensorrt-rtx] to build on a CPU, or build on a runner with an NVIDIA GPU"
    )
    built = cli("build", str(path))
    assert (
        built.returncode == 0
        and f"skipped  tiny-sd/decoder fp16 default tensorrt-rtx:ampere+: unavailable here: {option} = true needs"
        in built.stdout
    )

    plain = recipe(write_recipe, tiny_sd, targets=("tensorrt-rtx:ampere+",))  # the same recipe, without the option
    (default,) = plan([load_recipe(plain)], tmp_path / "dl", runners=load_runners(farm))
    assert default.runs_on == ["ubuntu-latest"]  # builds on the CPU runner


def test_the_sdks_last_error_is_the_jobs_failure_in_full(real_rtx, write_recipe, tmp_path, cli):
    models.top_k(tmp_path / "models" / "topk.onnx")
    path = write_recipe(one_model("topk", "tensorrt-rtx:ampere+", batch=[1, 1, 2]))
    report = tmp_path / "report.json"
    proc = cli("build", str(path), "--report", str(report))
    assert proc.returncode == 1
    sdk_words = (
        "IBuilder::buildSerializedNetwork: Error Code 4: API Usage Error (ITopKLayer TopK_0: TopK_0: K exceeds the "
        "maximum value allowed (3840). In processCheck at /_src/optimizer/shapeof/graphShapeAnalyzer.cpp:1066 In "
        "analyzeShapes at /_src/optimizer/shapeof/graphShapeAnalyzer.cpp:2825)"
    )
    line = next(line for line in proc.stderr.splitlines() if line.startswith("failed: "))
    # The plan is streamed to disk, so the SDK names its streaming call (buildSerializedNetworkToStream).
    prefix = (
        "failed: topk/net fp32 default tensorrt-rtx:ampere+: tensorrt-rtx: build_serialized_network failed: "
        "IBuilder::buildSerializedNetwork"
    )
    assert line.startswith(prefix), line
    assert line.endswith(sdk_words.split(": ", 1)[1]), line
    (row,) = json.loads(report.read_text())
    assert row["status"] == "failed" and row["reason"] == line[len("failed: ") :]


# What needs a GPU: the fake SDK, told of an RTX 4090 ------------------------------------------------------------------
def test_gpu_only_options_build_where_there_is_a_gpu(fake_nvidia, write_recipe, tiny_sd, tmp_path):
    path = recipe(
        write_recipe, tiny_sd, targets=("tensorrt-rtx:ampere+",), options="strip_weights = true", backend="tensorrt-rtx"
    )
    (planned,) = plan([load_recipe(path)], tmp_path / "dl")
    assert planned.status == "to build"
    result, _ = build_one(planned.job, tmp_path)
    assert result.status == "built", result.reason
    (call,) = fake_nvidia.calls("build_serialized_network", sdk="tensorrt_rtx")
    assert set(call["flags"]) == {"STRIP_PLAN", "REFIT_IDENTICAL"} and call["strongly_typed"]
    assert {f.path: f.role for f in result.manifest.files}.items() >= {
        "model.plan": "engine",
        "weights.onnx": "weights",
    }.items()
    assert result.manifest.validation["passed"] is True  # the 'GPU' was here: validated at build time
    (streamed,) = fake_nvidia.calls("plan_streamed", sdk="tensorrt_rtx")
    engine = next(f for f in result.manifest.files if f.role == "engine")
    assert streamed["size"] == engine.size  # written to its file as the SDK streamed it, never whole in memory


def test_the_runtime_cache_lives_in_the_local_cache_per_gpu_and_driver(
    fake_nvidia, write_recipe, tiny_sd, tmp_path, monkeypatch
):
    monkeypatch.setenv("ENGINEFARM_HOME", str(tmp_path / "device-home"))
    (job,) = jobs_of(recipe(write_recipe, tiny_sd, targets=("tensorrt-rtx:ampere+",), precisions=("fp32",)), tmp_path)
    result, store = build_one(job, tmp_path)
    folder = unpacked(tmp_path, store, result.manifest)
    caches = tmp_path / "device-home" / "tensorrt-rtx-runtime-cache"
    for leftover in caches.rglob("*.bin"):
        leftover.unlink()  # validation at build time ran on this 'device' too
    fake_nvidia.clear()
    backend = get_backend("tensorrt-rtx")
    session = backend.load(folder, result.manifest, "ampere+")
    session.run({"latent": np.zeros((1, 4, 8, 8), np.float32)})
    path = caches / "rtx-1.7.1.116-sm_89-driver-550.54.14" / f"{result.manifest.build_key}.bin"
    assert path.is_file() and b"[1, 4, 8, 8]" in path.read_bytes()
    assert not list(path.parent.glob(".*"))  # written atomically: no temp file left behind
    assert not fake_nvidia.calls("runtime_cache_deserialize")  # nothing to load the first time
    # kernels specialised to each new shape before its first run, so the cache saved after it holds them
    assert [c["specialization"] for c in fake_nvidia.calls("create_execution_context")] == ["EAGER"]
    assert "eager kernel specialisation" in session.how

    fake_nvidia.clear()
    backend.load(folder, result.manifest, "ampere+").run({"latent": np.zeros((1, 4, 8, 8), np.float32)})
    (loaded,) = fake_nvidia.calls("runtime_cache_deserialize")
    assert loaded["kernels"] == ['{"latent": [1, 4, 8, 8]}']  # the kernels of the first run, reused

    fake_nvidia.set(FAKE_NVML_DRIVER="570.86")
    fake_nvidia.clear()
    backend.load(folder, result.manifest, "ampere+").run({"latent": np.zeros((1, 4, 8, 8), np.float32)})
    assert not fake_nvidia.calls("runtime_cache_deserialize")  # another driver never reads that cache
    assert (caches / "rtx-1.7.1.116-sm_89-driver-570.86" / f"{result.manifest.build_key}.bin").is_file()


def test_loading_needs_a_matching_gpu(fake_nvidia, write_recipe, tiny_sd, tmp_path):
    (job,) = jobs_of(recipe(write_recipe, tiny_sd, targets=("tensorrt-rtx:blackwell+",)), tmp_path)
    fake_nvidia.set(FAKE_NVML_GPUS="")
    result, store = build_one(job, tmp_path)
    assert result.status == "built", result.reason
    fake_nvidia.set(FAKE_NVML_GPUS="NVIDIA GeForce RTX 4090:8.9")
    assert not availability(Target("tensorrt-rtx", "blackwell+")).can_load
    with pytest.raises(BackendUnavailable, match="blackwell\\+ needs a matching NVIDIA GPU"):
        get_backend("tensorrt-rtx").load(unpacked(tmp_path, store, result.manifest), result.manifest, "blackwell+")


def test_without_the_sdk_plan_and_doctor_say_it_installs_from_pypi(monkeypatch, write_recipe, tiny_sd, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "tensorrt_rtx", None)  # as if not installed
    here = availability(Target("tensorrt-rtx", "ampere+"))
    assert not here.can_build and here.reason.startswith("tensorrt_rtx is not installed (")
    assert here.reason.endswith("— real wheels from PyPI, 244 MB installed; it builds engines without a GPU")
    (planned,) = plan([load_recipe(recipe(write_recipe, tiny_sd, targets=("tensorrt-rtx:ampere+",)))], tmp_path / "dl")
    assert (
        planned.status.startswith("unavailable here: tensorrt_rtx is not installed")
        and "NVIDIA's package index" not in planned.status
    )


def test_doctor_says_the_sdk_builds_here_and_runs_on_a_gpu(real_rtx, cli):
    doctor = cli("doctor", env={"COLUMNS": "250"}, check=True).stdout
    (row,) = [line for line in doctor.splitlines() if line.startswith("│ tensorrt-rtx ")]
    _, versions, status = [cell.strip() for cell in row.strip("│").split("│")]
    assert versions == "tensorrt-rtx 1.7.1.116"
    assert status.startswith(
        "build only: builds here without a GPU (TensorRT-RTX 1.7.1.116), cannot run here: NVML did not start: "
    )
