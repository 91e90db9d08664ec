"""The validation gate: cosine paired with a range-relative max-abs; never passes or fails on noise."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.builder.validate import Thresholds, compare
from enginefarm.cache.stores import open_store
from tests import models

FP16 = Thresholds(min_cosine=0.995, max_abs_rel=0.05, noise_floor=1e-6)


def test_close_outputs_pass_on_both_criteria():
    ref = np.random.default_rng(0).normal(size=1000)
    result = compare(ref, ref + 1e-4, FP16)
    assert result["passed"] and result["decided_by"] == "cosine and max_abs"


def test_near_constant_outputs_are_judged_by_max_abs_not_cosine():
    rng = np.random.default_rng(0)
    ref = 1e-9 * rng.normal(size=1000)  # what random inputs can drive a model to
    noisy = 1e-9 * rng.normal(size=1000)  # just as tiny, uncorrelated: cosine ~0
    result = compare(ref, noisy, FP16)
    assert abs(result["cosine"]) < 0.2
    assert result["passed"], "cosine on noise must not fail the artifact"
    assert result["decided_by"].startswith("max_abs")


def test_near_constant_reference_with_a_wrong_artifact_fails():
    ref = np.full(1000, 1e-9)
    result = compare(ref, ref + 1e-3, FP16)
    assert not result["passed"] and result["decided_by"].startswith("max_abs")


def test_same_direction_but_wrong_scale_fails_on_max_abs():
    ref = np.random.default_rng(0).normal(size=1000)
    result = compare(ref, ref * 1.5, FP16)
    assert result["cosine"] > 0.999
    assert not result["passed"] and result["decided_by"] == "max_abs"
    assert "max_abs" in result["reason"]


def test_uncorrelated_output_fails_on_cosine():
    rng = np.random.default_rng(0)
    result = compare(rng.normal(size=1000), rng.normal(size=1000), FP16)
    assert not result["passed"] and result["decided_by"] == "cosine"


def test_nan_and_shape_mismatch_fail():
    assert compare(np.ones(4), np.array([1, np.nan, 1, 1.0]), FP16)["decided_by"] == "finite"
    assert compare(np.ones(4), np.ones(5), FP16)["decided_by"] == "shape"


def test_failed_artifact_is_not_published_and_the_report_says_by_how_much(tiny_recipe, cli, tmp_path):
    recipe = tiny_recipe(precisions=("fp16",), targets=("onnxruntime:cpu",))
    text = recipe.read_text().replace("inputs = {", "min_cosine = 1.0\nmax_abs_rel = 0.0\ninputs = {")
    recipe.write_text(text)
    report = tmp_path / "report.json"
    proc = cli("build", str(recipe), "--report", str(report))
    assert proc.returncode == 1
    assert "validation failed" in proc.stderr
    assert "max_abs" in proc.stderr or "cosine" in proc.stderr
    assert list(open_store(tmp_path / "store").list_manifest_keys()) == []
    import json

    (result,) = json.loads(report.read_text())
    assert result["status"] == "failed" and "validation failed" in result["reason"]


def test_real_sample_inputs_are_used(tmp_path, write_recipe, cli):
    models.linear(tmp_path / "models" / "m.onnx")
    np.save(tmp_path / "x.npy", np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8))
    np.savez(tmp_path / "samples.npz", x=np.ones((3, 8), np.float32))
    recipe = write_recipe("""
[model]
name = "lin"
version = "1"
[defaults]
targets = ["onnxruntime:cpu"]
[components.c]
source = "models/m.onnx"
[components.c.profiles.default]
batch = [1, 2, 4]
[components.c.validate]
inputs = { x = { file = "x.npy" } }
samples = "samples.npz"
""")
    cli("build", str(recipe), "--no-bench", check=True)
    from enginefarm.cache.artifacts import read_index

    (entry,) = read_index(open_store(tmp_path / "store"), "lin").entries.values()
    from enginefarm.cache.artifacts import read_manifest

    manifest = read_manifest(open_store(tmp_path / "store"), entry.build_key)
    cases = {c["case"]: c["shape"] for c in manifest.validation["checks"]}
    assert cases == {"min": [1, 8], "opt": [2, 8], "max": [4, 8], "samples": [3, 8]}


@pytest.mark.parametrize("precision,expected", [("fp32", "fp32"), ("fp16", None)])
def test_openvino_computes_in_the_precision_it_promises(tiny_recipe, cli, tmp_path, precision, expected):
    """OpenVINO's CPU plugin would pick bf16 on CPUs that have it; an fp32 artifact must compute in fp32."""
    import openvino

    cli("build", str(tiny_recipe(precisions=(precision,), targets=("openvino:cpu",))), "--no-bench", check=True)
    from enginefarm.cache.artifacts import read_index, read_manifest

    store = open_store(tmp_path / "store")
    (key,) = read_index(store, "tiny-sd").entries
    computed = read_manifest(store, key).validation["compute_precision"]
    if expected is None:  # fp16 computes in fp16 where the CPU has it, else fp32; never bf16
        caps = openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
        expected = "fp16" if "FP16" in caps else "fp32"
    assert computed == expected


@pytest.mark.parametrize(
    "arrays, message",
    [
        (
            {"x": np.ones((9, 3), np.float32)},
            r"x has shape \[9, 3\], outside profile 'default' \(\[1, 8\] \.\. \[4, 8\]\)",
        ),
        ({"z": np.ones((2, 8), np.float32)}, r"samples.npz holds \['z'\], the model's inputs are \['x'\]"),
        (None, "cannot read samples.npz: not a numpy .npz file"),
    ],
)
def test_samples_that_cannot_run_fail_the_plan(tmp_path, write_recipe, arrays, message):
    from enginefarm.builder.planner import expand
    from enginefarm.builder.recipe import load_recipe
    from enginefarm.errors import RecipeError

    models.linear(tmp_path / "m.onnx")
    if arrays is None:
        (tmp_path / "samples.npz").write_text("not numpy")
    else:
        np.savez(tmp_path / "samples.npz", **arrays)
    recipe = load_recipe(
        write_recipe("""
[model]
name = "lin"
version = "1"
[defaults]
targets = ["onnxruntime:cpu"]
[components.c]
source = "m.onnx"
[components.c.profiles.default]
batch = [1, 2, 4]
[components.c.validate]
samples = "samples.npz"
""")
    )
    with pytest.raises(RecipeError, match=r"components\.c\.validate\.samples: " + message):
        expand(recipe, tmp_path / "dl")


# The noise floor: what the computation carries, not just the output's own range --------------------------
def _sigmoid(z):
    return 1 / (1 + np.exp(-z))


def test_a_nearly_constant_sigmoid_map_is_judged_by_the_logits_that_feed_it():
    """A text detector on plain inputs: probabilities of ~1e-8 computed from logits of ~-20. A correct fp32 kernel
    differs in the logits by a few dozen epsilons of their magnitude; judged by the output's own range (1e-8) that
    failed the artifact against its own reference."""
    from enginefarm.builder.recipe import ValidateSpec

    logits = -20 + np.random.default_rng(0).normal(0, 0.5, size=(1, 1, 64, 64))
    rounding = 30 * 2.0**-23 * 20 * np.random.default_rng(1).normal(size=logits.shape)
    fp32 = Thresholds.for_job("fp32", ValidateSpec())
    correct = compare(_sigmoid(logits), _sigmoid(logits + rounding), fp32, scale=20.0)
    assert correct["passed"], correct["reason"]
    assert correct["decided_by"].startswith("max_abs (cosine ignored") and correct["noise_floor"] > correct["max_abs"]
    assert not compare(_sigmoid(logits), _sigmoid(logits), Thresholds(0.9999, 1e-3, noise_floor=1e-30))[
        "reason"
    ]  # identical: fine anywhere
    wrong = compare(_sigmoid(logits), _sigmoid(logits + 19), fp32, scale=20.0)  # a lost bias of +19 lights the map up
    assert not wrong["passed"] and wrong["decided_by"] == "max_abs"


def test_the_floor_scales_with_precision_and_quantization():
    from enginefarm.builder.recipe import ValidateSpec
    from enginefarm.builder.validate import ACCUMULATION_EPSILON, NOISE_GROWTH

    spec = ValidateSpec()
    fp32, fp16 = Thresholds.for_job("fp32", spec), Thresholds.for_job("fp16", spec)
    quantized = Thresholds.for_job("fp32", spec, quantized=True)
    assert fp32.floor(10.0) == NOISE_GROWTH * ACCUMULATION_EPSILON * 10.0
    assert fp16.floor(10.0) == NOISE_GROWTH * 2.0**-10 * 10.0 > fp32.floor(10.0)
    assert quantized.epsilon == 2.0**-7 and quantized.min_cosine < fp16.min_cosine <= fp32.min_cosine
    assert Thresholds.for_job("fp32", ValidateSpec(min_cosine=0.5), quantized=True).min_cosine == 0.5  # the recipe wins
    assert Thresholds.for_job("fp32", ValidateSpec(noise_floor=1e-3)).floor(1e6) == 1e-3


def test_every_metric_is_reported_and_the_hint_names_the_knobs_with_the_numbers_seen():
    from enginefarm.builder.validate import Reference, validate

    ref = np.linspace(-1, 1, 1000).reshape(1, 1000)

    class Off:
        compute_precision = "fp32"

        def run(self, feeds):
            return {"y": ref * 1.01}

    report = validate(Off(), [("opt", {})], [Reference({"y": ref}, {"y": 1.0})], Thresholds(0.9999, 1e-3))
    (check,) = report["checks"]
    assert {
        "cosine",
        "max_abs",
        "rms_error",
        "range",
        "scale",
        "noise_floor",
        "tolerance",
        "psnr",
        "argmax_agreement",
    } <= set(check)
    assert not report["passed"] and check["decided_by"] == "max_abs"
    assert "max_abs_rel = 0.0055 (now 0.001; seen 0.005 of the range)" in report["hint"]
    assert "validate.samples" in report["hint"]


def test_image_inputs_get_images_and_everything_stays_in_the_declared_range():
    from enginefarm.builder.recipe import SampleSpec, ValidateSpec
    from enginefarm.builder.validate import sample_cases
    from enginefarm.formats.onnx_io import TensorInfo

    inputs = [TensorInfo("image", "float32", ("b", 3, "h", "w")), TensorInfo("latent", "float32", (1, 4, 16, 16))]
    profile = {
        "image": {"min": [1, 3, 32, 32], "opt": [1, 3, 64, 96], "max": [2, 3, 128, 128]},
        "latent": {c: [1, 4, 16, 16] for c in ("min", "opt", "max")},
    }
    spec = ValidateSpec(inputs={"image": SampleSpec(0.0, 255.0)})
    cases = sample_cases(inputs, profile, spec)
    assert [name for name, _ in cases] == ["min", "opt", "max", "opt-noise"]
    image, latent = cases[1][1]["image"], cases[1][1]["latent"]
    assert image.shape == (1, 3, 64, 96) and 0 <= image.min() and image.max() <= 255
    # an image: neighbours are alike (smooth shading, flat objects), unlike uniform noise
    assert np.median(np.abs(np.diff(image, axis=-1))) < 0.1 * np.median(np.abs(np.diff(cases[3][1]["image"], axis=-1)))
    assert (
        -1 <= latent.min() and latent.max() <= 1 and np.mean(np.abs(np.diff(latent, axis=-1))) > 0.4
    )  # 4 channels: noise
    again = sample_cases(inputs, profile, spec)
    assert all(np.array_equal(a[1][k], b[1][k]) for a, b in zip(cases, again, strict=True) for k in a[1])  # seeded
