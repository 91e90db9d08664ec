"""The fake TensorRT-RTX (tests/fakes) against the real one: the same assertions run on both, so they cannot drift.

Everything here is what the real SDK does on a machine without a GPU, where both can be observed: its enums, what
its calls return (set_compute_capability answers False, it does not raise), what it refuses to build (weight
stripping and refit, fp32 GEMMs for Turing, CURRENT), and what its runtime says about a good plan (INVALID, 0;
deserialize_cuda_engine returns None). The build calls are our own (`nvidia/build_process.build_plan`), so what is
checked is also what the farm sees. The real SDK is the version the test extra pins.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from enginefarm.backends.nvidia.build import BuildSpec
from enginefarm.backends.nvidia.build_process import build_plan
from enginefarm.backends.nvidia.plan import deserialize
from enginefarm.backends.nvidia.sdk import SdkError, capturing_logger
from enginefarm.builder.prep import prepare
from enginefarm.errors import BackendUnavailable
from tests.nvidia_fakes import require_real_rtx

PROFILE = {"latent": {"min": [1, 4, 8, 8], "opt": [1, 4, 16, 16], "max": [2, 4, 32, 32]}}


@pytest.fixture(params=["fake", "real"])
def rtx(request):
    """The SDK module, on a machine without a GPU (the fake is told there is none)."""
    if request.param == "fake":
        request.getfixturevalue("fake_nvidia").set(FAKE_NVML_GPUS="")
        import tensorrt_rtx

        assert tensorrt_rtx.__file__.endswith("fakes/tensorrt_rtx/__init__.py")
        return tensorrt_rtx
    from enginefarm.hardware.device_info import nvidia_gpus

    if nvidia_gpus()[0]:
        pytest.skip("these assertions describe TensorRT-RTX on a machine without a GPU; this one has one")
    return require_real_rtx()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny decoder (Conv, MatMul, weights), fp32 and prepared fp16."""
    from tests import models as test_models

    folder = tmp_path_factory.mktemp("conformance")
    fp32 = test_models.tiny_sd(folder / "tiny_sd.onnx")
    return {"fp32": fp32, "fp16": prepare(fp32, "fp16", folder / "prep").path}


def spec(models, tmp_path, precision="fp16", capabilities=(), **options) -> BuildSpec:
    return BuildSpec(
        sdk="tensorrt_rtx",
        onnx=str(models[precision]),
        plan=str(tmp_path / "model.plan"),
        profile=PROFILE,
        precision=precision,
        strip_weights=options.get("strip_weights", False),
        refittable=options.get("refittable", False),
        compute_capabilities=list(capabilities),
        progress=options.get("progress"),
    )


def test_enums_and_their_values(rtx):
    members = lambda e: {name: int(value) for name, value in e.__members__.items()}  # noqa: E731
    assert rtx.__version__ == "1.7.1.116"
    assert members(rtx.ComputeCapability) == {
        "NONE": 0,
        "CURRENT": 1,
        "SM75": 75,
        "SM80": 80,
        "SM86": 86,
        "SM89": 89,
        "SM120": 120,
        "SM121": 121,
    }
    assert members(rtx.EngineValidity) == {"VALID": 0, "SUBOPTIMAL": 1, "INVALID": 2}
    assert members(rtx.EngineInvalidityDiagnostics) == {
        "VERSION_MISMATCH": 1,
        "UNSUPPORTED_CC": 2,
        "OLD_CUDA_DRIVER": 4,
        "OLD_CUDA_RUNTIME": 8,
        "INSUFFICIENT_GPU_MEMORY": 16,
        "MALFORMED_ENGINE": 32,
        "CUDA_ERROR": 64,
    }
    assert members(rtx.ILogger.Severity) == {"INTERNAL_ERROR": 0, "ERROR": 1, "WARNING": 2, "INFO": 3, "VERBOSE": 4}
    assert int(rtx.Logger.WARNING) == 2 and int(rtx.Logger.ERROR) == 1
    assert members(rtx.NetworkDefinitionCreationFlag) == {"STRONGLY_TYPED": 0}  # always explicit batch
    flags = members(rtx.BuilderFlag)
    assert {k: flags[k] for k in ("REFIT", "VERSION_COMPATIBLE", "STRIP_PLAN", "REFIT_IDENTICAL")} == {
        "REFIT": 4,
        "VERSION_COMPATIBLE": 12,
        "STRIP_PLAN": 18,
        "REFIT_IDENTICAL": 19,
    }
    assert not {"FP16", "BF16", "INT8"} & set(flags)  # precision comes from the strongly typed network only
    assert members(rtx.TensorIOMode) == {"NONE": 0, "INPUT": 1, "OUTPUT": 2}


def test_set_compute_capability_answers_false_and_logs_why(rtx):
    logger = capturing_logger(rtx)
    config = rtx.Builder(logger).create_builder_config()
    assert config.num_compute_capabilities == 0
    config.num_compute_capabilities = 1
    assert config.set_compute_capability(rtx.ComputeCapability.SM86, 0) is True
    assert config.get_compute_capability(0) == rtx.ComputeCapability.SM86
    assert config.set_compute_capability(rtx.ComputeCapability.SM89, 1) is False  # no exception
    assert "Index of compute capability is not in a valid range" in logger.last_error()
    assert config.set_compute_capability(rtx.ComputeCapability.NONE, 0) is False
    assert "Compute capability cannot be kNONE" in logger.last_error()


def test_builds_for_named_capabilities_without_a_gpu(rtx, models, tmp_path):
    progress = tmp_path / "progress.jsonl"
    logger = capturing_logger(rtx)
    build_plan(rtx, spec(models, tmp_path, capabilities=("SM86", "SM120"), progress=str(progress)), logger)
    assert (tmp_path / "model.plan").stat().st_size > 1000 and not logger.errors
    steps = [json.loads(line) for line in progress.read_text().splitlines()]
    assert steps[-1]["done"] == steps[-1]["total"] >= 1  # the progress monitor saw the build through
    build_plan(
        rtx, spec(models, tmp_path, precision="fp32"), capturing_logger(rtx)
    )  # the SDK's default: SM86 and later


@pytest.mark.parametrize("options", [{"strip_weights": True}, {"refittable": True}])
def test_weight_stripping_and_refit_need_a_gpu(rtx, models, tmp_path, options):
    with pytest.raises(
        SdkError,
        match=r"^build_serialized_network failed: .*MyelinCheckException: graph_jit.cpp:278: CHECK\(status == "
        r"CUDA_SUCCESS\)",
    ):
        build_plan(rtx, spec(models, tmp_path, **options), capturing_logger(rtx))
    assert not (tmp_path / "model.plan").exists()


def test_fp32_gemm_for_turing_is_refused_fp16_is_not(rtx, models, tmp_path):
    with pytest.raises(
        SdkError, match=r"Cannot compile operation 'node_of_\S+' for Turing \(SM75\): FP32 GEMM is not supported"
    ):
        build_plan(rtx, spec(models, tmp_path, precision="fp32", capabilities=("SM75",)), capturing_logger(rtx))
    build_plan(rtx, spec(models, tmp_path, precision="fp16", capabilities=("SM75",)), capturing_logger(rtx))
    assert (tmp_path / "model.plan").is_file()


def test_our_build_stops_where_set_compute_capability_says_no(rtx, models, tmp_path):
    with pytest.raises(
        SdkError, match=r"^set_compute_capability\(NONE, 0\) was refused: .*Compute capability cannot be kNONE"
    ):
        build_plan(rtx, spec(models, tmp_path, capabilities=("NONE",)), capturing_logger(rtx))
    assert not (tmp_path / "model.plan").exists()


def test_current_needs_a_gpu(rtx, models, tmp_path):
    with pytest.raises(SdkError, match=r"cudaError 35: CUDA driver version is insufficient for CUDA runtime version"):
        build_plan(rtx, spec(models, tmp_path, capabilities=("CURRENT",)), capturing_logger(rtx))


def test_the_runtime_without_a_gpu_cannot_check_or_load_a_good_plan(rtx, models, tmp_path):
    build_plan(rtx, spec(models, tmp_path, capabilities=("SM86",)), capturing_logger(rtx))
    data = (tmp_path / "model.plan").read_bytes()
    logger = capturing_logger(rtx)
    runtime = rtx.Runtime(logger)
    size = runtime.engine_header_size
    assert isinstance(size, int) and 0 < size < len(data)
    validity, diagnostics = runtime.get_engine_validity(memoryview(data)[:size])
    assert (validity, int(diagnostics)) == (
        rtx.EngineValidity.INVALID,
        0,
    )  # not "bad plan": it cannot tell without a GPU
    validity, diagnostics = runtime.get_engine_validity(memoryview(b"\x00" * size))
    assert validity == rtx.EngineValidity.INVALID and int(diagnostics) & int(
        rtx.EngineInvalidityDiagnostics.MALFORMED_ENGINE
    )
    assert runtime.deserialize_cuda_engine(data) is None
    assert "cudaError 35" in logger.last_error()
    with pytest.raises(
        BackendUnavailable, match=r"the tiny decoder: the plan is not valid on this system \(diagnostics 0\)"
    ):
        deserialize(
            rtx, data, "the tiny decoder"
        )  # our loader asks first, and never deserializes what the SDK calls invalid


def test_the_device_memory_calls_we_make_exist_with_the_same_values(rtx):
    """What the budget and the shared activation buffer call (backends/nvidia/activations.py). Their answers cannot
    be compared here: without a GPU the real SDK deserializes no engine to ask."""
    members = lambda e: {name: int(value) for name, value in e.__members__.items()}  # noqa: E731
    assert members(rtx.EngineStat) == {"TOTAL_WEIGHTS_SIZE": 0, "STRIPPED_WEIGHTS_SIZE": 1}
    assert members(rtx.ExecutionContextAllocationStrategy) == {"STATIC": 0, "ON_PROFILE_CHANGE": 1, "USER_MANAGED": 2}
    for cls, names in (
        (rtx.ICudaEngine, ("device_memory_size_v2", "get_device_memory_size_for_profile_v2", "get_engine_stat")),
        (rtx.IExecutionContext, ("set_device_memory",)),
        (
            rtx.IRuntimeConfig,
            ("set_execution_context_allocation_strategy", "get_execution_context_allocation_strategy"),
        ),
    ):
        assert all(hasattr(cls, name) for name in names), (cls, [n for n in names if not hasattr(cls, n)])


def test_several_optimization_profiles_build_and_an_invalid_one_is_refused(rtx, models, tmp_path):
    """The plan of `opt_profiles = "edges"` (backends/nvidia/profiles.py): four profiles sharing one min and max.
    Without a GPU the real SDK deserializes nothing, so the plan's profiles cannot be read back here: the build is the
    check (measured on the tiny decoder, fp16: 4 profiles 0.5 s and a plan about 3x one profile's, its kernels per
    profile; the weights are not repeated)."""
    from enginefarm.backends.nvidia.profiles import optimization_profiles

    first, *more = optimization_profiles(PROFILE, "edges")
    notes = build_plan(rtx, replace(spec(models, tmp_path), profile=first, extra_profiles=more), capturing_logger(rtx))
    assert notes["optimization_profiles"] == len(more) + 1 == 4 and (tmp_path / "model.plan").stat().st_size > 1000
    (tmp_path / "model.plan").unlink()
    inverted = {"latent": {**PROFILE["latent"], "opt": [1, 4, 64, 64]}}  # opt beyond max
    with pytest.raises(
        SdkError,
        match=r"^add_optimization_profile\(opt \{'latent': \[1, 4, 64, 64\]\}\) was refused: "
        r"IBuilderConfig::addOptimizationProfile: Error Code 3: API Usage Error \(Parameter check failed, condition: "
        r"profile->isValid\(\)",
    ):
        build_plan(rtx, replace(spec(models, tmp_path), extra_profiles=[inverted]), capturing_logger(rtx))
    assert not (tmp_path / "model.plan").exists()


def test_the_profile_and_specialisation_calls_we_make_exist_with_the_same_values(rtx):
    """What the session's profile pick (nvidia/profiles.py, nvidia/session.py) and the RTX backend's kernel
    specialisation call; their answers need a deserialized engine, which needs a GPU."""
    members = lambda e: {name: int(value) for name, value in e.__members__.items()}  # noqa: E731
    assert members(rtx.DynamicShapesKernelSpecializationStrategy) == {"LAZY": 0, "EAGER": 1, "NONE": 2}
    for cls, names in (
        (rtx.ICudaEngine, ("num_optimization_profiles", "get_tensor_profile_shape")),
        (rtx.IExecutionContext, ("set_optimization_profile_async", "active_optimization_profile", "set_input_shape")),
        (rtx.IRuntimeConfig, ("dynamic_shapes_kernel_specialization_strategy",)),
        (rtx.IBuilderConfig, ("add_optimization_profile", "num_optimization_profiles")),
    ):
        assert all(hasattr(cls, name) for name in names), (cls, [n for n in names if not hasattr(cls, n)])
