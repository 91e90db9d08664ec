"""OpenVINO specifics: dynamic bounds in the IR, fp16 weight compression, and the compiled-blob rule."""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import numpy as np
import openvino as ov
import pytest

from enginefarm.backends import openvino
from enginefarm.backends.openvino import BACKEND as backend
from enginefarm.cache.artifacts import read_index, read_manifest
from enginefarm.cache.device_cache import DeviceCache
from enginefarm.cache.stores import open_store
from tests.conftest import build_tiny_store, builds


@pytest.fixture(scope="module")
@builds
def openvino_store(tmp_path_factory) -> Path:
    """The tiny model's OpenVINO fp32 and fp16 artifacts, built once by the real CLI into a store the tests copy."""
    return build_tiny_store(tmp_path_factory.mktemp("openvino"), ("fp32", "fp16"), ("openvino:cpu",))


@pytest.fixture
def built(openvino_store, tmp_path):
    """precision → (its manifest, its files fetched into this test's empty cache) from a copy of the shared store."""
    shutil.copytree(openvino_store, tmp_path / "store", dirs_exist_ok=True)

    def build(precision):
        store = open_store(tmp_path / "store")
        manifest = next(
            read_manifest(store, k)
            for k in read_index(store, "tiny-sd").entries
            if read_manifest(store, k).precision == precision
        )
        return manifest, DeviceCache(tmp_path / "home").fetch(store, manifest)

    return build


def test_ir_carries_the_profile_bounds(built):
    manifest, path = built("fp32")
    model = ov.Core().read_model(str(path / "model.xml"))
    assert str(model.inputs[0].get_partial_shape()) == "[1..2,4,8..32,8..32]"


def test_fp16_compresses_weights(built):
    manifest32, _ = built("fp32")
    manifest16, path = built("fp16")
    size = lambda m: next(f.size for f in m.files if f.path == "model.bin")  # noqa: E731
    assert size(manifest16) < 0.6 * size(manifest32)
    model = ov.Core().read_model(str(path / "model.xml"))
    assert any(op.get_type_name() == "Constant" and op.get_element_type() == ov.Type.f16 for op in model.get_ops())


def test_blob_shipped_only_when_measured_faster(built):
    manifest, path = built("fp32")
    notes = manifest.provenance["build_notes"]
    shipped = any(f.role == "engine" for f in manifest.files)
    assert shipped == notes["blob_shipped"]
    assert shipped == (notes["openvino_import_ms"] < openvino.BLOB_MIN_GAIN * notes["openvino_compile_ms"])


def test_blob_from_another_cpu_or_version_falls_back_to_ir(built):
    manifest, path = built("fp32")
    if not any(f.role == "engine" for f in manifest.files):
        pytest.skip("this build measured the blob slower than compiling, so none shipped")
    assert backend.load(path, manifest).how == "imported compiled blob"
    for change in ({"cpu_flags": ["neon"]}, {"openvino": "1999.0.0"}):
        foreign = dataclasses.replace(
            manifest, constraints={**manifest.constraints, "engine": {**manifest.constraints["engine"], **change}}
        )
        session = backend.load(path, foreign)
        assert session.how.startswith("compiled IR")  # the second from the device's compiled-model cache
        out = session.run({"latent": np.zeros((1, 4, 8, 8), np.float32)})["sample"]
        assert out.shape == (1, 3, 16, 16)


def test_damaged_blob_falls_back_to_ir(built):
    manifest, path = built("fp32")
    if not any(f.role == "engine" for f in manifest.files):
        pytest.skip("no blob shipped")
    (path / "model.blob").write_bytes(b"not a blob")
    assert backend.load(path, manifest).how.startswith("compiled IR")


def _timestep_model(path, width=1024):
    """A timestep embedding as the exporters write it: t / 1000 · 1000 (Flux's round trip), times frequencies, sin,
    then a layer with weights (16 x `width`: 64 KiB at 1024, so the keep-list's staging IR holds a placeholder for
    it). The frequencies are an initializer of 16 (prep keeps those), as at real size."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    freqs = np.exp(-np.log(10000) * np.arange(16) / 16).astype(np.float32)[None, :]
    weight = np.random.default_rng(0).standard_normal((16, width)).astype(np.float32)
    nodes = [
        helper.make_node("Div", ["timestep", "thousand"], ["scaled"], name="/Div"),
        helper.make_node("Mul", ["scaled", "thousand"], ["t"], name="/model/Mul"),
        helper.make_node("Unsqueeze", ["t", "axis"], ["column"], name="/model/time_proj/Unsqueeze"),
        helper.make_node("Mul", ["column", "freqs"], ["argument"], name="/model/time_proj/Mul"),
        helper.make_node("Sin", ["argument"], ["wave"], name="/model/time_proj/Sin"),
        helper.make_node("MatMul", ["wave", "weight"], ["embedding"], name="/model/linear/MatMul"),
    ]
    inits = [
        numpy_helper.from_array(np.array(1000.0, np.float32), "thousand"),
        numpy_helper.from_array(np.array([1], np.int64), "axis"),
        numpy_helper.from_array(freqs, "freqs"),
        numpy_helper.from_array(weight, "weight"),
    ]
    graph = helper.make_graph(
        nodes,
        "timestep",
        [helper.make_tensor_value_info("timestep", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [1, width])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return lambda t: np.sin(np.float64(t) * freqs.astype(np.float64)) @ weight


def test_the_fp16_keep_list_computes_in_f32_at_the_f16_hint(tmp_path):
    """OpenVINO computes an fp16 artifact in f16 where the CPU can; the recipe's keep-list (here the timestep's
    input path) is marked `precise` in the IR, so those nodes and their constants stay f32: the compiled model runs
    them in f32, and a timestep of 751.3 embeds as in fp32, where f16 moves sin(t · f) by a tenth of a radian and
    more."""
    from enginefarm.backends.openvino_precise import keep_fp32, precise_names

    core = ov.Core()
    if "FP16" not in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        pytest.skip("this CPU does not compute in f16 (no AVX512-FP16 or AMX-FP16): nothing to keep")
    exact = _timestep_model(tmp_path / "t.onnx")
    names = precise_names(tmp_path / "t.onnx", ("input:timestep",))
    assert {"/Div", "/model/Mul", "/model/time_proj/Mul", "/model/time_proj/Sin", "freqs", "thousand"} <= names
    assert (
        "/model/linear/MatMul" not in names and "weight" not in names
    )  # the first weights run at the precision asked for

    def compiled(keep: bool):
        model = core.read_model(str(tmp_path / "t.onnx"))
        if keep:
            model, marked, staged = keep_fp32(ov, core, model, names, tmp_path)
            assert marked >= 5
            assert staged[1].stat().st_size < 16 * 1024 * 4  # the weights were a placeholder there
        ov.save_model(model, str(tmp_path / f"m{keep}.xml"), compress_to_fp16=True)
        return core.compile_model(
            core.read_model(str(tmp_path / f"m{keep}.xml")), "CPU", {"INFERENCE_PRECISION_HINT": "f16"}
        )

    t = np.array([751.3], np.float32)
    errors, precisions = {}, {}
    for keep in (False, True):
        model = compiled(keep)
        errors[keep] = float(np.abs(model({"timestep": t})[model.outputs[0]] - exact(t[0])).max())
        runtime = {
            op.get_friendly_name(): op.get_rt_info()["runtimePrecision"].astype(str)
            for op in model.get_runtime_model().get_ordered_ops()
        }
        precisions[keep] = runtime.get("/model/time_proj/Mul")
    assert precisions == {False: "f16", True: "f32"}
    assert errors[True] < 1e-2 and errors[False] > 1e-1, errors  # measured: 4.8e-3 kept, 0.67 not


def test_the_keep_list_stages_the_graph_not_the_weights(tmp_path, monkeypatch):
    """The staging IR that marks the keep-list holds placeholders for the weights (a full fp32 copy of them took 9.9
    GB of disk for SD3.5 Medium's transformer), and the fp16 IR saved after it is byte for byte the one a full copy
    gave; the caller's model keeps its constants."""
    from enginefarm.backends import openvino_disk, openvino_precise

    _timestep_model(tmp_path / "t.onnx")
    names = openvino_precise.precise_names(tmp_path / "t.onnx", ("input:timestep",))
    core = ov.Core()

    def final(tag: str) -> tuple[bytes, bytes, int]:
        folder = tmp_path / tag
        folder.mkdir()
        model = core.read_model(str(tmp_path / "t.onnx"))
        marked_model, marked, staged = openvino_precise.keep_fp32(ov, core, model, names, folder)
        assert marked >= 5
        weight = next(op for op in model.get_ops() if op.get_friendly_name() == "weight")
        assert len(model.get_parameters()) == 1 and weight.get_type_name() == "Constant"
        assert len(marked_model.get_parameters()) == 1
        ov.save_model(marked_model, str(folder / "m.xml"), compress_to_fp16=True)
        return (folder / "m.xml").read_bytes(), (folder / "m.bin").read_bytes(), staged[1].stat().st_size

    *light, light_staging = final("placeholders")
    monkeypatch.setattr(openvino_disk, "PLACEHOLDER_MIN_BYTES", 1 << 62)  # every constant staged: as before
    *full, full_staging = final("full-copy")
    assert light == full
    assert full_staging >= 16 * 1024 * 4 > 20 * light_staging, (full_staging, light_staging)  # 65,612 B, 76 B


def test_a_build_onto_a_full_disk_is_refused_before_openvino_writes(small_fs, tiny_recipe, cli, tmp_path):
    """The job's work folder lacks room for the IR (an 8 MiB disk, under the reserve a write must leave): the fp16
    keep-list job fails at once with one line that says how much is needed and free and where, and names the
    setting that moves the work folder; nothing is left in it or in the store."""
    recipe = tiny_recipe(precisions=("fp16",), targets=("openvino:cpu",))
    source = 'source = "models/tiny_sd.onnx"'
    recipe.write_text(recipe.read_text().replace(source, source + '\nfp16_keep_fp32 = ["Softmax"]'))
    home = small_fs / "home"
    proc = cli("build", str(recipe), "--no-bench", env={"ENGINEFARM_HOME": str(home)})
    said = " ".join((proc.stdout + proc.stderr).split())  # the CLI's table may wrap the line
    assert proc.returncode != 0, said
    assert re.search(r"disk full: need [\d.,]+ MB at \S*small/home/build/jobs/\S+ \([\d.,]+ MB free\)", said), said
    assert "ENGINEFARM_HOME" in said and "basic_ios" not in said and "Traceback" not in said, said
    assert not any((home / "build" / "jobs").rglob("*"))
    assert not list((tmp_path / "store").rglob("*.json"))


def test_openvinos_stream_failure_is_a_full_disk_only_where_the_disk_is_full(small_fs, tmp_path):
    """OpenVINO says `basic_ios::clear: iostream error`, no errno, when its save meets a full disk: that is a
    DiskFullError where the folder lacks the room the save needed, and the SDK's own failure where it has it."""
    from enginefarm.backends.openvino_disk import hint
    from enginefarm.cache.space import sdk_writes
    from enginefarm.errors import DiskFullError

    weights = np.random.default_rng(0).standard_normal((1024, 4096)).astype(np.float32)  # 16 MiB, twice the disk
    source = ov.op.Parameter(ov.Type.f32, ov.Shape([1, 1024]))
    model = ov.Model([ov.opset13.matmul(source, ov.op.Constant(weights), False, False)], [source])
    with pytest.raises(DiskFullError, match=r"disk full: need [\d.,]+ MB at \S*small \([\d.,]+ MB free\)") as full:
        with sdk_writes(small_fs, weights.nbytes, hint(small_fs)):
            ov.save_model(model, str(small_fs / "model.xml"), compress_to_fp16=False)
    assert "iostream error" in str(full.value.__cause__) and "ENGINEFARM_HOME" in (full.value.hint or "")
    assert list(small_fs.iterdir()) == []
    with pytest.raises(RuntimeError, match="iostream error") as failed:  # its words, where the disk has room
        with sdk_writes(tmp_path, weights.nbytes):
            raise RuntimeError(str(full.value.__cause__))
    assert not isinstance(failed.value, DiskFullError)


def test_load_takes_the_core_that_available_opened_and_keeps_none(built):
    """Listing devices and compiling share one Core (creating one costs 20-60 ms of the first inference); the spare
    is handed over once, so no Core outlives the load that took it."""
    manifest, path = built("fp32")
    assert backend.available("cpu").can_load
    spare = backend._spare_core
    assert isinstance(spare, ov.Core) and backend.available("cpu").can_load and backend._spare_core is spare
    first = backend.load(path, manifest)
    assert backend._spare_core is None
    second = backend.load(path, manifest)  # nothing spare: a Core of its own
    feed = {"latent": np.ones((1, 4, 8, 8), np.float32)}
    np.testing.assert_array_equal(first.run(feed)["sample"], second.run(feed)["sample"])
    assert backend._spare_core is None
