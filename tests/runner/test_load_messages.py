"""What `load` says when nothing loads: one line naming the real cause, with a hint that fits it (issue 25: before,
raw reasons such as StopIteration, "store unreachable" for a bad name, "no stored artifact" for a garbage index,
and "yanked" where a filter, not a yank, left nothing)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import enginefarm
from enginefarm.cache.artifacts import pack_files, publish
from enginefarm.cache.manifest import Manifest
from enginefarm.cache.stores import open_store
from enginefarm.errors import ArtifactNotFoundError, ConfigError, IntegrityError, WeightsError
from tests import models
from tests.releases import REF, artifact


@pytest.fixture
def store(tmp_path):
    opened = open_store(str(tmp_path / "store"))
    artifact(opened, tmp_path, "a")
    return opened


def load(store, **kwargs):
    return enginefarm.load(REF, device="cpu", store=store.url, **kwargs)


def test_an_artifact_without_a_file_of_its_backends_role_is_named(tmp_path):
    """Its manifest lists the ONNX file as "weights", none as "model": before, `StopIteration` with "build one"."""
    opened = open_store(str(tmp_path / "store"))
    models.linear(tmp_path / "src" / "model.onnx")
    files, blobs = pack_files(tmp_path / "src", [("model.onnx", "weights")], tmp_path / "blobs")
    manifest = Manifest(
        build_key=hashlib.sha256(b"roleless").hexdigest(),
        model="m",
        model_version="1",
        component="lin",
        precision="fp32",
        profile_name="default",
        profile={"x": {"min": [1, 8], "opt": [1, 8], "max": [4, 8]}},
        target="onnxruntime:cpu",
        toolchain={"onnxruntime": "1"},
        files=tuple(files),
    )
    publish(opened, manifest, blobs)
    with pytest.raises(
        IntegrityError,
        match=r"m/lin \[[0-9a-f]{12}\]: its manifest lists no model file, which onnxruntime:cpu needs "
        r"\(it lists: weights\)",
    ) as caught:
        load(opened)
    assert "rebuild" in caught.value.hint


@pytest.mark.parametrize(
    "ref, message",
    [
        ("bad!name/lin", r"'bad!name' is not a valid model name"),
        ("m/lin?", r"'lin\?' is not a valid component name"),
        ("a" * 300 + "/lin", r"the model name is 300 bytes long, more than any store holds \(200\)"),
    ],
)
def test_a_name_no_store_can_hold_is_the_callers_error(store, ref, message):
    """Before: "store unreachable ('bad!name' is not a valid model name)", or an OSError traceback (File name too
    long), each with the hint "build one"."""
    with pytest.raises(ConfigError, match=message) as caught:
        enginefarm.load(ref, device="cpu", store=store.url)
    assert "build" not in caught.value.hint and len(str(caught.value)) < 200


def test_a_garbage_index_is_called_unreadable(store, tmp_path):
    (tmp_path / "store" / "index" / "m.json").write_text("<html>502 Bad Gateway</html>")
    with pytest.raises(
        ArtifactNotFoundError, match=r"no artifact of m/lin can be listed: .*index/m\.json is not JSON"
    ) as caught:
        load(store)
    assert "enginefarm index --store" in caught.value.hint


def test_a_target_filter_that_leaves_nothing_says_what_there_is(store):
    with pytest.raises(
        ArtifactNotFoundError,
        match=r"no artifact of m/lin in the store is for --target openvino:cpu: "
        r"there are onnxruntime:cpu fp32",
    ) as caught:
        load(store, target="openvino:cpu")
    assert "--target" in caught.value.hint


def test_folders_given_as_weights_or_loras_are_refused_at_once(store, tmp_path):
    """Before: an IsADirectoryError from inside the reader, or another artifact's refusal."""
    with pytest.raises(WeightsError, match=r"weights .* is a folder, not a file"):
        load(store, weights=str(tmp_path))
    with pytest.raises(WeightsError, match=r"LoRA .* is a folder, not a file"):
        load(store, loras=[(str(tmp_path), 1.0)])


def test_run_output_that_is_a_folder_is_a_usage_error(store, tmp_path, cli):
    np.save(tmp_path / "x.npy", np.zeros((1, 8), np.float32))
    proc = cli(
        "run",
        REF,
        "--input",
        f"x={tmp_path / 'x.npy'}",
        "--output",
        str(tmp_path),
        "--store",
        store.url,
        "--device",
        "cpu",
    )
    assert proc.returncode == 2 and "is a directory" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_yank_messages_name_what_was_yanked_and_what_a_filter_left_out(tmp_path, monkeypatch):
    from enginefarm.cache.trust import repo
    from tests.releases import released

    opened = open_store(str(tmp_path / "store"))
    keys, a, _, root = released(opened, tmp_path)  # the channel releases a: onnxruntime:cpu fp32
    fp16 = artifact(opened, tmp_path, "d", precision="fp16")
    repo.promote(opened, "stable", keys, [fp16.build_key])
    monkeypatch.setenv("ENGINEFARM_HOME", str(tmp_path / "device"))

    def channel(**kw):
        return enginefarm.load(REF, device="cpu", store=opened.url, channel="stable", trusted_root=root, **kw)

    assert channel(precision="fp16").artifact.build_key == fp16.build_key  # this device saw it released
    repo.yank(opened, "stable", keys, lambda custom: custom["build_key"] == a.build_key)

    # A filter that leaves nothing, where nothing it asks for was yanked. Before: "m/lin was yanked from channel
    # stable: onnxruntime:cpu fp16 [...]; nothing else of it is released", wrong twice.
    with pytest.raises(ArtifactNotFoundError) as caught:
        channel(target="openvino:cpu")
    assert (
        str(caught.value)
        == "no artifact of m/lin in channel stable is for --target openvino:cpu: there are onnxruntime:cpu fp32"
    )
    # fp16 was yanked; fp32 is released but not what was asked for. Before: "no artifact fits ... build one".
    with pytest.raises(ArtifactNotFoundError) as caught:
        channel(precision="fp16")
    assert str(caught.value).startswith(
        f"m/lin was yanked from channel stable: onnxruntime:cpu fp16 [{fp16.build_key[:12]}]; "
        "what else is released does not fit: onnxruntime:cpu fp32"
    )

    openvino = artifact(opened, tmp_path, "c", target="openvino:cpu")  # holds ONNX, not IR: seen, never loaded
    repo.promote(opened, "stable", keys, [openvino.build_key])
    assert channel(target="onnxruntime").artifact.build_key == a.build_key
    repo.yank(opened, "stable", keys, lambda custom: custom["build_key"] == a.build_key)
    # The OpenVINO artifact was yanked; the ONNX Runtime one is released for another target. Before: "nothing else
    # of it is released", listing the yanked fp16 too, which --target openvino:cpu leaves out anyway.
    with pytest.raises(ArtifactNotFoundError) as caught:
        channel(target="openvino:cpu")
    assert str(caught.value) == (
        f"m/lin was yanked from channel stable: openvino:cpu fp32 [{openvino.build_key[:12]}]; "
        "what else is released is for other targets (onnxruntime:cpu)"
    )
    assert channel().artifact.build_key == a.build_key
