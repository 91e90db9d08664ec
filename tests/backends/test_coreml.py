"""Core ML: real conversions on this machine (coremltools converts on Linux; it cannot run the package), inspected
through the produced spec. The package itself runs only on a Mac: see the hardware-marked test at the end."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests import models


def require_coreml(modules=("coremltools", "onnx2torch", "torch"), env=os.environ) -> None:
    """Skip without the coreml extra, except in CI (CI=true), where a missing extra must fail, not skip."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return
    if env.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {', '.join(missing)} is not installed: the test extra must bring the coreml extra")
    pytest.skip(f"{', '.join(missing)} is not installed (pip install 'enginefarm[coreml]')")


@pytest.fixture(autouse=True)
def coreml_installed(request):
    if request.node.name.startswith("test_the_guard"):
        return
    require_coreml()


def test_the_guard_skips_locally_and_fails_in_ci():
    with pytest.raises(pytest.skip.Exception, match="not-a-module-xyz is not installed"):
        require_coreml(("not-a-module-xyz",), env={})
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        require_coreml(("not-a-module-xyz",), env={"CI": "true"})
    require_coreml(("json",), env={"CI": "true"})  # present: neither


def _plan_one(recipe: Path, tmp_path: Path, **select):
    from enginefarm.builder.planner import plan
    from enginefarm.builder.recipe import load_recipe

    planned = plan([load_recipe(recipe)], tmp_path / "dl", **select)
    assert len(planned) == 1, [p.job.label for p in planned]
    return planned[0].job


def _package_summary(archive: Path, tmp_path: Path) -> dict:
    from enginefarm.backends.coreml import PACKAGE, spec_summary
    from enginefarm.cache.archive import extract

    return spec_summary(extract(archive, tmp_path / "unpacked", PACKAGE))


def test_cli_build_stores_an_inspectable_package_per_precision(tiny_recipe, cli, tmp_path):
    """The real `enginefarm build` path for coreml:apple, fp16 and fp32; the stored artifacts are fetched and verified
    through the device cache, unpacked, and their specs read."""
    from enginefarm.cache.artifacts import read_index, read_manifest
    from enginefarm.cache.device_cache import DeviceCache
    from enginefarm.cache.stores import open_store

    recipe = tiny_recipe(precisions=("fp16", "fp32"), targets=("coreml:apple",))
    proc = cli("build", str(recipe), check=True)
    assert "2 built, 0 failed" in proc.stdout
    # torch.jit's and coremltools' own warnings and progress bars stay out of the user's build output
    assert "Warning" not in proc.stderr and "MIL" not in proc.stderr, proc.stderr
    store = open_store(os.environ["ENGINEFARM_STORE"])
    cache = DeviceCache(Path(os.environ["ENGINEFARM_HOME"]))
    specs = {}
    for key in read_index(store, "tiny-sd").entries:
        manifest = read_manifest(store, key)
        # the package, and golden samples for the first Mac that loads it to check it on (runner/golden_check.py)
        assert [(f.path, f.role) for f in manifest.files] == [
            ("model.mlpackage.tar", "model"),
            ("golden.safetensors", "golden"),
        ]
        assert manifest.validation["golden"]["cases"] == ["min", "opt", "max"]
        assert manifest.options == {"shapes": "range", "deployment_target": "macOS13"}
        assert manifest.constraints == {"os": ["darwin"], "macos": ">=13"}
        assert manifest.validation["passed"] is True and manifest.validation["executed"] is False
        assert "macOS" in manifest.validation["why"] and "torch module" in manifest.validation["ran_instead"]
        assert {c["case"] for c in manifest.validation["checks"]} == {"min", "opt", "max"}
        assert manifest.benchmarks == () and manifest.provenance["benchmark"].startswith(
            "skipped: Core ML runs only on macOS"
        )
        folder = cache.fetch(store, manifest)
        specs[manifest.precision] = _package_summary(folder / "model.mlpackage.tar", tmp_path / manifest.precision)
        assert not (folder / "model.mlpackage").exists()  # extraction happens at load, from the verified tar
    assert set(specs) == {"fp16", "fp32"}
    for spec in specs.values():
        assert [i["name"] for i in spec["inputs"]] == ["latent"] and spec["outputs"] == ["sample"]
        latent = spec["inputs"][0]
        assert latent["dtype"] == "FLOAT32" and latent["shape"] == [1, 4, 16, 16]  # float32 I/O, default = opt
        assert latent["ranges"] == [[1, 2], [4, 4], [8, 32], [8, 32]]  # batch 1..2, height/width 8..32
        assert "conv" in spec["ops"]
    # fp16: the convolutions and matmuls compute in float16, behind a cast from the float32 input.
    assert specs["fp16"]["op_dtypes"]["conv"] == specs["fp16"]["op_dtypes"]["matmul"] == ["FLOAT16"]
    assert specs["fp16"]["ops"]["cast"] >= 1 and "FLOAT16" in specs["fp16"]["op_dtypes"]["cast"]
    assert specs["fp32"]["op_dtypes"]["conv"] == specs["fp32"]["op_dtypes"]["matmul"] == ["FLOAT32"]
    assert "FLOAT16" not in specs["fp32"]["dtypes"] and "cast" not in specs["fp32"]["ops"]


def test_enumerated_shapes_option_is_in_the_spec_and_the_key(tiny_sd, write_recipe, tmp_path):
    from enginefarm.builder.build import compile_artifact

    text = (Path(__file__).parents[1] / "conftest.py").read_text().split('TINY_RECIPE = """')[1].split('"""')[0]
    base = text.format(precisions='["fp32"]', targets='["coreml:apple"]').replace("{{", "{").replace("}}", "}")
    ranged = _plan_one(write_recipe(base, "ranged.toml"), tmp_path)
    enumerated = _plan_one(
        write_recipe(base + '\n[components.decoder.options.coreml]\nshapes = "enumerated"\n', "enum.toml"), tmp_path
    )
    assert enumerated.options["shapes"] == "enumerated" and ranged.options["shapes"] == "range"
    assert enumerated.key(enumerated.toolchain()) != ranged.key(ranged.toolchain())

    manifest, outdir = compile_artifact(enumerated, tmp_path / "work", bench=False)
    latent = _package_summary(outdir / "model.mlpackage.tar", tmp_path)["inputs"][0]
    assert sorted(latent["enumerated"]) == [[1, 4, 8, 8], [1, 4, 16, 16], [2, 4, 32, 32]] and "ranges" not in latent
    assert latent["shape"] == [1, 4, 16, 16]
    assert manifest.validation["passed"] and manifest.options["shapes"] == "enumerated"


@pytest.mark.slow  # over a second of the quick loop's time (make test-fast)
def test_same_job_gives_the_same_bytes(tmp_path, write_recipe):
    from enginefarm.builder.build import compile_artifact
    from enginefarm.cache.atomic import sha256_file

    models.linear(tmp_path / "models" / "linear.onnx")
    recipe = write_recipe("""
        [model]
        name = "lin"
        version = "1"
        [components.linear]
        source = "models/linear.onnx"
        precisions = ["fp16"]
        targets = ["coreml:apple"]
        [components.linear.profiles.default]
        batch = [1, 2, 4]
        """)
    job = _plan_one(recipe, tmp_path)
    digests = []
    for run in range(2):
        _, outdir = compile_artifact(job, tmp_path / f"work{run}", bench=False)
        digests.append(sha256_file(outdir / "model.mlpackage.tar"))
    assert digests[0] == digests[1]


@pytest.mark.slow  # over a second of the quick loop's time (make test-fast)
def test_a_static_profile_gives_fixed_shapes(tmp_path, write_recipe):
    from enginefarm.builder.build import compile_artifact

    models.linear(tmp_path / "models" / "linear.onnx", dims=(3, 8))
    recipe = write_recipe("""
        [model]
        name = "lin"
        version = "1"
        [components.linear]
        source = "models/linear.onnx"
        targets = ["coreml:apple"]
        """)
    manifest, outdir = compile_artifact(_plan_one(recipe, tmp_path), tmp_path / "work", bench=False)
    x = _package_summary(outdir / "model.mlpackage.tar", tmp_path)["inputs"][0]
    assert x["shape"] == [3, 8] and "ranges" not in x and "enumerated" not in x
    assert manifest.validation["passed"]


def test_opset18_reduce_mean_is_rewritten_for_onnx2torch(tmp_path):
    import onnx
    import onnxruntime as ort
    import torch

    from enginefarm.backends.coreml_convert import downgrade_reduce_axes, to_traceable_torch, unsupported_ops

    path = models.reduce_mean_18(tmp_path / "rm.onnx")
    assert unsupported_ops(onnx.load(str(path))) == ["ReduceMean (opset 18)"]
    fixed = downgrade_reduce_axes(onnx.load(str(path)))
    assert unsupported_ops(fixed) == [] and fixed.opset_import[0].version == 17
    assert [a.ints for a in fixed.graph.node[0].attribute if a.name == "axes"] == [[1]]
    x = np.random.default_rng(0).normal(size=(3, 8)).astype(np.float32)
    reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with torch.no_grad():
        got = to_traceable_torch(path)(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, reference, atol=1e-6)


def test_an_op_onnx2torch_cannot_convert_is_named(tmp_path):
    from enginefarm.backends.coreml_convert import to_traceable_torch
    from enginefarm.errors import BuildError

    path = models.reduce_mean_18(tmp_path / "rm.onnx", dynamic_axes=True)  # axes computed at run time: no rewrite
    with pytest.raises(BuildError, match=r"onnx2torch cannot convert ReduceMean \(opset 18\) for Core ML") as caught:
        to_traceable_torch(path)
    assert "opset" in caught.value.hint


def test_the_cli_reports_an_unconvertible_model_as_a_failed_job(tmp_path, write_recipe, cli):
    models.shrink(tmp_path / "models" / "shrink.onnx")
    recipe = write_recipe("""
        [model]
        name = "shrink"
        version = "1"
        [components.shrink]
        source = "models/shrink.onnx"
        targets = ["coreml:apple", "onnxruntime:cpu"]
        [components.shrink.profiles.default]
        batch = [1, 2, 4]
        """)
    proc = cli("build", str(recipe), "--no-bench")
    assert proc.returncode == 1, proc.stdout
    assert "1 built, 1 failed" in proc.stdout and "onnx2torch cannot convert Shrink (opset 9)" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_loading_off_macos_says_why(tmp_path):
    from enginefarm.backends import coreml
    from enginefarm.errors import BackendUnavailable

    avail = coreml.BACKEND.available("apple")
    assert avail.can_build and not avail.can_load and "only on macOS" in avail.reason
    with pytest.raises(BackendUnavailable, match="only on macOS"):
        coreml.BACKEND.load(tmp_path, None, "apple")


def test_a_job_without_io_specs_is_refused_not_a_traceback(tmp_path):
    """Core ML converts from the planner's job (its inputs and outputs); an on-device job (runner/recompile.py) has
    neither, and reading them was an AttributeError."""
    from enginefarm.backends import coreml
    from enginefarm.cache.manifest import Target
    from enginefarm.errors import BuildError
    from enginefarm.runner.recompile import DeviceJob

    job = DeviceJob("m/c fp16 on device", "c", Target.parse("coreml:apple"), "fp16", {"x": {"opt": [1]}})
    with pytest.raises(BuildError, match="converts from the planner's job"):
        coreml.BACKEND.build(tmp_path / "model.onnx", job, tmp_path)


@pytest.mark.parametrize(
    "key,value,reason", [("shape", "range", "unknown key"), ("shapes", "ragged", "unknown value 'ragged'")]
)
def test_bad_coreml_options_name_file_key_and_reason(tiny_recipe, key, value, reason):
    from enginefarm.builder.recipe import load_recipe
    from enginefarm.errors import RecipeError

    recipe = tiny_recipe(targets=("coreml:apple",))
    recipe.write_text(recipe.read_text() + f'\n[components.decoder.options.coreml]\n{key} = "{value}"\n')
    with pytest.raises(RecipeError) as caught:
        load_recipe(recipe)
    assert str(caught.value).startswith(f"{recipe}: components.decoder.options.coreml") and reason in str(caught.value)


def test_options_for_a_backend_without_options_are_refused(tiny_recipe):
    from enginefarm.builder.recipe import load_recipe
    from enginefarm.errors import RecipeError

    recipe = tiny_recipe()
    recipe.write_text(recipe.read_text().replace("[defaults]", '[defaults.options.openvino]\nfoo = "x"\n\n[defaults]'))
    with pytest.raises(RecipeError, match="defaults.options.openvino.foo: unknown key"):
        load_recipe(recipe)


@pytest.mark.hardware("apple")
@pytest.mark.parametrize("units", ["ALL", "CPU_ONLY"])
def test_coreml_on_a_mac_end_to_end(tiny_recipe, cli, monkeypatch, units):
    import enginefarm

    monkeypatch.setenv("ENGINEFARM_COREML_COMPUTE_UNITS", units)
    cli("build", str(tiny_recipe(precisions=("fp16",), targets=("coreml:apple",))), check=True)
    session = enginefarm.load("tiny-sd/decoder", device="apple", target="coreml:apple")
    out = session.run({"latent": np.zeros((2, 4, 32, 32), np.float32)})["sample"]
    assert out.shape == (2, 3, 64, 64) and np.isfinite(out).all()
    assert session.artifact.validation["executed"] is True
    assert json.loads(session.artifact.to_json())["benchmarks"]


def test_the_spec_check_names_what_does_not_match_the_manifest():
    from types import SimpleNamespace

    from enginefarm.backends.coreml import _check_spec

    manifest = SimpleNamespace(
        io={"inputs": [{"name": "latent"}], "outputs": [{"name": "sample"}]},
        profile={"latent": {"min": [1, 4, 8, 8], "opt": [1, 4, 16, 16], "max": [2, 4, 32, 32]}},
    )
    good = {
        "inputs": [{"name": "latent", "shape": [1, 4, 16, 16], "ranges": [[1, 2], [4, 4], [8, 32], [8, 32]]}],
        "outputs": ["sample"],
    }
    assert _check_spec(good, manifest) == []
    narrow = {
        "inputs": [{"name": "latent", "shape": [1, 4, 16, 16], "ranges": [[1, 1], [4, 4], [8, 32], [8, 32]]}],
        "outputs": ["out"],
    }
    assert _check_spec(narrow, manifest) == [
        "outputs ['out'] != ['sample']",
        "input 'latent' does not accept the profile's max shape [2, 4, 32, 32]",
    ]
    enumerated = {
        "inputs": [{"name": "latent", "shape": [1, 4, 16, 16], "enumerated": [[1, 4, 16, 16], [1, 4, 8, 8]]}],
        "outputs": ["sample"],
    }
    assert _check_spec(enumerated, manifest) == [
        "input 'latent' does not accept the profile's max shape [2, 4, 32, 32]"
    ]


def test_run_on_linux_with_only_coreml_stored_is_one_line_with_the_right_hint(tiny_recipe, cli):
    recipe = tiny_recipe(precisions=("fp32",), targets=("coreml:apple",))
    cli("build", str(recipe), check=True)
    np.save(Path(recipe).parent / "latent.npy", np.ones((1, 4, 16, 16), np.float32))
    proc = cli("run", "tiny-sd/decoder", "--input", f"latent={Path(recipe).parent / 'latent.npy'}")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1 and len(lines) == 2, proc.stderr
    assert lines[0].startswith("error: no artifact of tiny-sd/decoder fits this device: coreml:apple fp32 [")
    assert lines[0].endswith("no device here runs coreml:apple")
    assert lines[1].startswith("hint: build it for a target this device runs (`enginefarm doctor` lists them)")
