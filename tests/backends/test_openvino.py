"""OpenVINO specifics: dynamic bounds in the IR, fp16 weight compression, and the compiled-blob rule."""

from __future__ import annotations

import dataclasses

import numpy as np
import openvino as ov
import pytest

from enginefarm.backends import openvino
from enginefarm.backends.openvino import BACKEND as backend
from enginefarm.cache.artifacts import read_index, read_manifest
from enginefarm.cache.device_cache import DeviceCache
from enginefarm.cache.stores import open_store


@pytest.fixture
def built(tiny_recipe, cli, tmp_path):
    def build(precision):
        cli("build", str(tiny_recipe(precisions=(precision,), targets=("openvino:cpu",))), "--no-bench", check=True)
        store = open_store(tmp_path / "store")
        manifest = next(read_manifest(store, k) for k in read_index(store, "tiny-sd").entries
                        if read_manifest(store, k).precision == precision)
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
        foreign = dataclasses.replace(manifest, constraints={**manifest.constraints, "engine": {**manifest.constraints["engine"], **change}})
        session = backend.load(path, foreign)
        assert session.how == "compiled IR"
        out = session.run({"latent": np.zeros((1, 4, 8, 8), np.float32)})["sample"]
        assert out.shape == (1, 3, 16, 16)


def test_damaged_blob_falls_back_to_ir(built):
    manifest, path = built("fp32")
    if not any(f.role == "engine" for f in manifest.files):
        pytest.skip("no blob shipped")
    (path / "model.blob").write_bytes(b"not a blob")
    assert backend.load(path, manifest).how == "compiled IR"
