"""bf16: built only where the device class computes it (refused at plan time elsewhere, with the reason), validated
against the fp32 reference with its own thresholds, and recorded as computing in what the runtime really uses."""

from __future__ import annotations

import json

import numpy as np
import pytest

from enginefarm.formats.bf16 import to_bf16_bits


def _cpu_has_bf16() -> bool:
    import openvino as ov

    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def test_rounding_to_bf16_is_round_to_nearest_even():
    import ml_dtypes

    values = np.random.default_rng(0).standard_normal(10000).astype(np.float32) * np.float32(1e3)
    values = np.concatenate(
        [values, np.array([1e30, -1e-30, 70000.0, 0.0, np.inf, 1 + 2**-8, 1 + 3 * 2**-8], np.float32)]
    )
    expected = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.array_equal(to_bf16_bits(values), expected)
    assert np.isnan(
        np.array([to_bf16_bits(np.array([np.nan], np.float32))[0]], np.uint16)
        .view(ml_dtypes.bfloat16)
        .astype(np.float32)
    )[0]


def test_the_bf16_onnx_keeps_fp32_io_and_rounds_weights_from_fp32(tiny_sd, tmp_path):
    """Weights beyond fp16's range (70000) survive: bf16 has float32's exponent. Widened back to float32 (the same
    graph with every bf16 tensor read as float32), the model matches the reference within bf16's rounding."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    from enginefarm.builder.prep import prepare

    model = onnx.load(str(tiny_sd))
    first = next(
        i
        for i in model.graph.initializer
        if i.data_type == onnx.TensorProto.FLOAT and numpy_helper.to_array(i).size > 8
    )
    big = numpy_helper.to_array(first).copy()
    big.flat[0] = 70000.0
    first.CopyFrom(numpy_helper.from_array(big, first.name))
    source = tmp_path / "big.onnx"
    onnx.save(model, str(source))

    prepared = prepare(source, "bf16", tmp_path / "prep")
    assert any("converted to bf16" in n and "weights rounded from fp32" in n for n in prepared.notes)
    converted = onnx.load(str(prepared.path))
    assert all(
        t.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
        for t in [*converted.graph.input, *converted.graph.output]
    )
    types = {i.data_type for i in converted.graph.initializer}
    assert onnx.TensorProto.BFLOAT16 in types and onnx.TensorProto.FLOAT16 not in types
    casts = {a.i for n in converted.graph.node if n.op_type == "Cast" for a in n.attribute if a.name == "to"}
    assert onnx.TensorProto.BFLOAT16 in casts and onnx.TensorProto.FLOAT16 not in casts
    kept = next(i for i in converted.graph.initializer if i.name == first.name)
    assert kept.data_type == onnx.TensorProto.BFLOAT16
    assert numpy_helper.to_array(kept).astype(np.float32).flat[0] == 70144.0  # 70000 rounded to bf16, not fp16's inf

    for init in converted.graph.initializer:  # read every bf16 tensor as float32: the same values, computed in fp32
        if init.data_type == onnx.TensorProto.BFLOAT16:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float32), init.name))
    for node in converted.graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == onnx.TensorProto.BFLOAT16:
                attr.i = onnx.TensorProto.FLOAT
    for info in converted.graph.value_info:
        if info.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16:
            info.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    widened = tmp_path / "widened.onnx"
    onnx.save(converted, str(widened))
    latent = np.random.default_rng(1).uniform(-3, 3, (1, 4, 16, 16)).astype(np.float32)
    got = ort.InferenceSession(str(widened), providers=["CPUExecutionProvider"]).run(None, {"latent": latent})[0]
    want = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, {"latent": latent})[0]
    cosine = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want))
    assert cosine > 0.999 and np.abs(got - want).max() < 0.05 * (want.max() - want.min())


REFUSED = [
    ("onnxruntime:cpu", "ONNX Runtime's CPU provider has no bf16 kernels"),
    ("openvino:gpu", "OpenVINO's GPU plugin computes in f32 or f16 only"),
    ("openvino:npu", "OpenVINO's NPU computes in fp16 or int8"),
    ("tensorrt-rtx:turing+", "Turing GPUs (SM 7.5) have no bf16 math"),
    ("tensorrt-rtx:sm_75", "Turing GPUs (SM 7.5) have no bf16 math"),
    ("tensorrt:sm_89", "tensorrt artifacts are built in fp32 or fp16 only"),
    ("migraphx:gfx1100", "migraphx artifacts are built in fp32 or fp16 only"),
    ("coreml:apple", "coreml artifacts are built in fp32 or fp16 only"),
]


def test_plan_refuses_bf16_where_the_device_class_cannot_compute_it(tiny_recipe, cli):
    targets = [t for t, _ in REFUSED] + ["openvino:cpu", "tensorrt-rtx:ampere+"]
    recipe = tiny_recipe(
        precisions=("fp16", "bf16"), targets=targets
    )  # fp16: Turing refuses fp32 GEMMs (another refusal)
    planned = json.loads(cli("plan", str(recipe), "--format", "json", check=True).stdout)
    status = {(p["target"], p["precision"]): p["status"] for p in planned}
    for target, reason in REFUSED:
        assert status[(target, "bf16")].startswith(f"refused: {reason}"), (target, status[(target, "bf16")])
        assert not status[(target, "fp16")].startswith("refused")
    for target in ("openvino:cpu", "tensorrt-rtx:ampere+"):
        assert not status[(target, "bf16")].startswith("refused")
    matrix = json.loads(cli("plan", str(recipe), "--format", "github", check=True).stdout)
    skipped = {s["label"]: s["why"] for s in matrix["skipped"]}
    assert any("onnxruntime:cpu" in label and "refused" in why for label, why in skipped.items())
    assert not any("bf16" in entry["name"] and "onnxruntime" in entry["name"] for entry in matrix["matrix"]["include"])


def test_build_skips_refused_jobs_with_the_reason(tiny_recipe, cli):
    proc = cli("build", str(tiny_recipe(precisions=("bf16",), targets=("onnxruntime:cpu",))), "--no-bench")
    assert proc.returncode == 0 and "skipped" in proc.stdout and "has no bf16 kernels" in proc.stdout


@pytest.mark.slow
def test_openvino_bf16_builds_validates_and_computes_in_bf16_on_a_cpu_that_has_it(tiny_recipe, cli, tmp_path):
    """On a CPU with AVX512-BF16/AMX (this machine) the artifact computes in bf16 and passes bf16's gate; elsewhere
    the job is unavailable here (validating bf16 in fp32 would be a lie), never built."""
    import enginefarm
    from enginefarm.cache.precision_table import TABLE

    recipe = tiny_recipe(precisions=("fp32", "bf16"), targets=("openvino:cpu",))
    if not _cpu_has_bf16():
        planned = json.loads(cli("plan", str(recipe), "--format", "json", check=True).stdout)
        (bf16,) = [p for p in planned if p["precision"] == "bf16"]
        assert bf16["status"].startswith("unavailable here: this CPU cannot compute in bf16")
        return
    cli("build", str(recipe), check=True)
    manifests = {
        m["precision"]: m
        for m in (json.loads(p.read_text()) for p in (tmp_path / "store" / "manifests").glob("*.json"))
    }
    bf16, fp32 = manifests["bf16"], manifests["fp32"]
    assert bf16["validation"]["compute_precision"] == "bf16" and fp32["validation"]["compute_precision"] == "fp32"
    assert bf16["benchmarks"][0]["compute_precision"] == "bf16"
    assert bf16["validation"]["thresholds"]["epsilon"] == 2.0**-7
    assert bf16["validation"]["thresholds"]["max_abs_rel"] == TABLE["bf16"].max_abs_rel
    assert bf16["validation"]["passed"] and 0.992 <= bf16["validation"]["min_cosine"] < fp32["validation"]["min_cosine"]
    assert bf16["constraints"]["cpu_flags_any"] == ["avx512_bf16", "amx_bf16"]
    session = enginefarm.load("tiny-sd/decoder", precision="bf16", device="cpu")
    assert session.compute_precision == "bf16" and "runs in bf16" in session.explain()
    out = session.run({"latent": np.zeros((1, 4, 8, 8), np.float32)})["sample"]
    assert out.shape == (1, 3, 16, 16) and np.isfinite(out).all()


def test_an_openvino_fp16_artifact_says_it_computes_in_what_this_cpu_uses(tiny_recipe, cli, tmp_path):
    """Without FP16 units OpenVINO's CPU plugin runs an fp16 IR in f32: the record says so, not "fp16"."""
    import openvino as ov

    cli("build", str(tiny_recipe(precisions=("fp16",), targets=("openvino:cpu",))), "--no-bench", check=True)
    (manifest,) = [json.loads(p.read_text()) for p in (tmp_path / "store" / "manifests").glob("*.json")]
    has_fp16 = "FP16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    assert manifest["validation"]["compute_precision"] == ("fp16" if has_fp16 else "fp32")


def test_tensorrt_rtx_compiles_bf16_for_ampere_and_refuses_turing_as_the_plan_says(tiny_sd, tmp_path):
    """The real SDK (no GPU needed): a strongly typed network from our bf16 ONNX builds for SM86, and for SM75 the
    SDK itself refuses bf16, which is why the planner refuses turing+ and sm_75 up front."""
    trt = pytest.importorskip("tensorrt_rtx", reason="the TensorRT-RTX SDK is not installed (pip install tensorrt-rtx)")
    from enginefarm.builder.prep import prepare

    prepared = prepare(tiny_sd, "bf16", tmp_path / "prep").path

    def build(capability: str):
        logger = trt.Logger(trt.Logger.ERROR)
        builder = trt.Builder(logger)
        network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        parser = trt.OnnxParser(network, logger)
        assert parser.parse_from_file(str(prepared))
        dtypes = {network.get_layer(i).get_output(0).dtype for i in range(network.num_layers)}
        assert trt.DataType.BF16 in dtypes and trt.DataType.HALF not in dtypes
        config = builder.create_builder_config()
        profile = builder.create_optimization_profile()
        profile.set_shape("latent", (1, 4, 8, 8), (1, 4, 16, 16), (2, 4, 32, 32))
        config.add_optimization_profile(profile)
        config.num_compute_capabilities = 1
        config.set_compute_capability(getattr(trt.ComputeCapability, capability), 0)
        return builder.build_serialized_network(network, config)

    assert build("SM86") is not None
    assert build("SM75") is None
