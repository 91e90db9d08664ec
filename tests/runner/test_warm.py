"""A warm load opens the pick the last full load made (runner/warm.py) without the resolver, and only while nothing
that pick read has changed: each change below takes the full path again, which decides anew and checks the files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import enginefarm
from enginefarm.runner import warm
from tests.conftest import builds
from tests.runner.test_lifecycle import _chain

WIDTH, LAYERS = 64, 3


@pytest.fixture(scope="module")
@builds
def store(tmp_path_factory):
    from tests.conftest import run_cli

    root = tmp_path_factory.mktemp("warm")
    _chain(root / "models" / "chain.onnx", WIDTH, LAYERS)
    _chain(root / "models" / "twin.onnx", WIDTH, LAYERS - 1)  # another artifact of the model: its output is y1
    (root / "recipe.toml").write_text(
        '[model]\nname = "chain"\nversion = "1"\n\n[defaults]\nprecisions = ["fp32"]\n'
        'targets = ["onnxruntime:cpu", "openvino:cpu"]\n\n[components.net]\nsource = "models/chain.onnx"\n\n'
        "[components.net.profiles.default]\nbatch = [1, 1, 4]\n\n"
        '[components.twin]\nsource = "models/twin.onnx"\ntargets = ["onnxruntime:cpu"]\n\n'
        "[components.twin.profiles.default]\nbatch = [1, 1, 4]\n"
    )
    run_cli("build", str(root / "recipe.toml"), "--store", str(root / "store"), "--no-bench", check=True)
    return root / "store"


@pytest.fixture
def env(store, tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINEFARM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ENGINEFARM_STORE", str(store))
    monkeypatch.setenv("ENGINEFARM_PROBE_CACHE", "on")  # the suite turns it off (conftest): the short way needs it
    return tmp_path / "home"


@pytest.fixture
def reopened(monkeypatch):
    """What each load's warm attempt returned: a session (the short way) or None (the full path). The real function
    runs; this only records its answer."""
    answers: list = []
    real = warm.reopen

    def spy(*args):
        answers.append(real(*args))
        return answers[-1]

    monkeypatch.setattr(warm, "reopen", spy)
    return answers


X = np.linspace(-1, 1, 2 * WIDTH, dtype=np.float32).reshape(2, WIDTH)


def _load(target="onnxruntime:cpu"):
    return enginefarm.load("chain/net", device="cpu", target=target)


@pytest.mark.parametrize("target", ["onnxruntime:cpu", "openvino:cpu"])
def test_the_third_load_takes_the_short_way_and_is_the_same_session(env, reopened, target):
    with _load(target) as first:  # fetches: the cache changed during it, so nothing is remembered yet
        expected, key = first.run({"x": X}), first.artifact.build_key
    assert not (env / warm.FOLDER).exists()
    with _load(target) as second:  # nothing changed: its pick is remembered
        explained = second.explain()  # "from the cache", where the first said "from the store"
    assert len(list((env / warm.FOLDER).glob("*.json"))) == 1
    with _load(target) as third:
        assert reopened[-1] is third  # the short way
        assert third.explain() == explained
        np.testing.assert_array_equal(third.run({"x": X})["y2"], expected["y2"])
        (env / "artifacts" / key / "manifest.json").unlink()  # evicted meanwhile by another process's gc
        assert third.artifact.build_key == key  # the manifest's bytes, read with the artifact, parsed when asked for
        assert third.input_names == ["x"] and third.output_names == ["y2"]
    assert reopened[:2] == [None, None]


def test_a_warm_start_imports_no_resolver_no_index_no_manifest_and_no_backend_registry(env):
    code = (
        "import sys, json, numpy as np, enginefarm\n"
        "s = enginefarm.load('chain/net', device='cpu', target='onnxruntime:cpu')\n"
        f"s.run({{'x': np.ones((1, {WIDTH}), np.float32)}})\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('enginefarm') or m == 'logging')))"
    )
    for _ in range(3):  # apps start the same way each time (the probe state counts sys.path): the third is warm
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    loaded = set(json.loads(out.stdout))
    assert "enginefarm.sessions.onnxruntime" in loaded  # it did open the artifact
    heavy = {
        "enginefarm.runner.load",
        "enginefarm.runner.resolve",
        "enginefarm.cache.index",
        "enginefarm.cache.manifest",
        "enginefarm.cache.device_cache",
        "enginefarm.backends",
        "logging",
    }
    assert loaded & heavy == set()


def _warm_then(env, change):
    """Two loads (the second remembers), `change`, then a load: what its warm attempt returned."""
    for _ in range(2):
        _load().close()
    change(env)
    return _load()


def _rewrite_index(home):
    index = os.environ["ENGINEFARM_STORE"] + "/index/chain.json"
    shutil.copyfile(index, index + ".new")
    os.replace(index + ".new", index)  # the same entries, rewritten: as a rebuild or a publish does


def _cache_changed(home):
    (home / "artifacts" / ("0" * 64)).mkdir()
    (home / "artifacts" / ("0" * 64)).rmdir()


def _measure_changed(home):
    os.environ["ENGINEFARM_MEASURE"] = "on" if os.environ.get("ENGINEFARM_MEASURE") == "off" else "off"


def _other_devices(home):
    os.environ["CUDA_VISIBLE_DEVICES"] = "7"  # the probes' key: another set of devices is visible


def _origins(home):
    origins = next((home / "artifacts").glob("*/.origins"))
    origins.write_text(origins.read_text())


@pytest.mark.parametrize(
    "change",
    [_rewrite_index, _cache_changed, _measure_changed, _other_devices, _origins],
    ids=["index rewritten", "an artifact cached or evicted", "a setting", "the devices", "the artifact's origins"],
)
def test_a_change_in_what_the_pick_read_takes_the_full_path(env, reopened, change, monkeypatch):
    for name in ("ENGINEFARM_MEASURE", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.setenv(name, os.environ.get(name, ""))  # restored after the test: the changes set them
    with _warm_then(env, change) as session:
        assert reopened[-1] is None
        assert session.run({"x": X})["y2"].shape == (2, WIDTH)
    with _load() as again:  # the full path remembered the new state: short again
        assert reopened[-1] is again


def test_a_changed_file_is_hashed_again_by_the_full_path_and_replaced(env, reopened):
    with _load() as first:
        expected = first.run({"x": X})["y2"]
    _load().close()
    folder = next((env / "artifacts").glob("*/manifest.json")).parent
    model = max(
        (f for f in folder.iterdir() if not f.name.startswith(".") and f.suffix != ".json"), key=os.path.getsize
    )
    data = bytearray(model.read_bytes())
    data[-8:] = b"\x00" * 8  # a weight's bytes changed in place: same size, new mtime
    model.write_bytes(bytes(data))
    with _load() as session:
        assert reopened[-1] is None  # the proof no longer holds: not opened the short way
        np.testing.assert_array_equal(session.run({"x": X})["y2"], expected)  # evicted and fetched again
    assert model.read_bytes() != bytes(data)


@pytest.mark.parametrize(
    "damage", ["garbage", "other request", "missing plan module", "a module outside sessions", "a path as key", "facts"]
)
def test_a_damaged_record_is_no_error(env, reopened, damage):
    for _ in range(2):
        _load().close()
    (record,) = (env / warm.FOLDER).glob("*.json")
    data = json.loads(record.read_text())
    if damage == "garbage":
        record.write_bytes(b"\x00{not json")
    elif damage == "other request":
        data["request"]["args"][0] = "chain/other"
        record.write_text(json.dumps(data))
    else:
        if damage == "missing plan module":
            data["plan"]["module"] = "enginefarm.sessions.no_such_backend"
        elif damage == "a module outside sessions":
            data["plan"]["module"] = "os"  # imported, had it been trusted: os has no reopen, but another could
        elif damage == "a path as key":
            data["key"] = "../" + data["key"][3:]
        else:
            del data["facts"]["io"]
        record.write_text(json.dumps(data))
    with _load() as session:
        assert reopened[-1] is None
        assert session.run({"x": X})["y2"].shape == (2, WIDTH)
    with _load() as again:  # rewritten by that full load
        assert reopened[-1] is again


@pytest.mark.parametrize("forged", ["an absolute path", "a path into another artifact", "another artifact's key"])
def test_a_forged_record_never_serves_another_file_and_is_removed(env, reopened, forged, tmp_path):
    """A writer of the home cannot make the short way open bytes the cache did not verify for this request: every
    path in the plan is one of the manifest's files in the artifact's folder, and that manifest is the request's."""
    enginefarm.load("chain/twin", device="cpu", target="onnxruntime:cpu").close()  # cached: another artifact
    for _ in range(2):
        _load().close()
    (record,) = (env / warm.FOLDER).glob("*.json")
    data = json.loads(record.read_text())
    own = data["key"]
    (twin,) = [p.parent for p in (env / "artifacts").glob("*/manifest.json") if p.parent.name != own]
    twin_model = next(twin.glob("*.onnx"))
    if forged == "an absolute path":
        outside = tmp_path / "outside"
        outside.mkdir()
        shutil.copyfile(twin_model, outside / twin_model.name)
        data["plan"]["model"] = str(outside / twin_model.name)
    elif forged == "a path into another artifact":
        data["plan"]["model"] = f"../{twin.name}/{twin_model.name}"
    else:  # the record's facts still say chain/net
        data["key"], data["plan"]["model"] = twin.name, twin_model.name
        data["files"] = [f["path"] for f in json.loads((twin / "manifest.json").read_text())["files"]]
        data["artifact"] = warm._artifact_state(env, twin.name)
    record.write_text(json.dumps(data))
    index = data["state"]["index"][0]
    assert warm.reopen(data["request"], env, index) is None  # the full path
    assert not record.exists()  # removed
    record.write_text(json.dumps(data))
    with _load() as session:
        assert reopened[-1] is None
        assert session.artifact.build_key == own and session.output_names == ["y2"]
    with _load() as again:  # the full path wrote a true record
        assert reopened[-1] is again and again.output_names == ["y2"]


def test_a_home_where_no_record_can_be_written_still_loads(env, reopened):
    _load().close()
    (env / warm.FOLDER).write_text("a file where the folder would be")  # as a read-only or full disk refuses it
    for _ in range(2):
        with _load() as session:
            assert session.run({"x": X})["y2"].shape == (2, WIDTH)
    assert reopened == [None, None, None]


def test_a_remote_store_a_channel_or_an_unremembered_probe_is_never_remembered(store, tmp_path):
    """A remote store's index can change with no trace here (tests/cache/test_replaced_store.py replaces one behind an
    HTTP server): each load asks it. A release channel verifies its signed metadata each time."""
    from enginefarm.settings import load_settings

    settings = load_settings({"ENGINEFARM_HOME": str(tmp_path), "ENGINEFARM_STORE": str(store)})
    assert warm.remembers(None, settings) and warm.remembers(f"file://{store}", settings)
    for remote in ("https://example.com/store", "s3://bucket/store", "http://127.0.0.1:9/S"):
        assert not warm.remembers(remote, settings)
    offline = load_settings({"ENGINEFARM_HOME": str(tmp_path), "ENGINEFARM_OFFLINE": "1"})
    assert warm.remembers("https://example.com/store", offline)  # offline, only the cache is read: it is all here
    channel = load_settings({"ENGINEFARM_HOME": str(tmp_path), "ENGINEFARM_CHANNEL": "stable"})
    assert not warm.remembers(None, channel)
    unprobed = load_settings({"ENGINEFARM_HOME": str(tmp_path), "ENGINEFARM_PROBE_CACHE": "off"})
    assert not warm.remembers(None, unprobed)  # devices probed on every load: nothing picked on them is remembered
