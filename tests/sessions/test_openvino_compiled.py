"""OpenVINO's compiled models kept in the device cache (sessions/openvino_compiled.py) and the static compiles per
request shape (sessions/openvino_static.py), on the tiny SD 1.x UNet built by the real CLI: a second load in a fresh
process compiles nothing (OpenVINO itself says the model came from its cache, and no blob is written again), the
blobs are counted and evicted with the artifact, a changed or stale blob is never loaded, and a static compile
computes what the dynamic one does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("openvino")

from enginefarm.cache.device_cache import COMPILED, DeviceCache
from enginefarm.sessions import openvino_static
from enginefarm.sessions.openvino import FROM_CACHE

# A fresh process opens the UNet's artifact as a load does (auto: static where timed faster) and runs one call; it
# says how OpenVINO opened the dynamic compile and each static one, and saves the output. The shipped blob, if the
# build shipped one (tiny models import faster than they compile), is left out: the IR's path is the one tested.
_CHILD = """
import dataclasses, json, sys
from pathlib import Path
import numpy as np
from enginefarm.backends.openvino import BACKEND
from enginefarm.cache.device_cache import DeviceCache
home, key, feeds_file = sys.argv[1:4]
cache = DeviceCache(Path(home))
manifest = cache.manifest(key)
manifest = dataclasses.replace(manifest, files=tuple(f for f in manifest.files if f.role != "engine"))
session = BACKEND.load(cache.path_of(key), manifest)
result = session.run({k: v for k, v in np.load(feeds_file).items()})["out_sample"]
print(json.dumps({
    "how": session.how,
    "dynamic_cached": bool(session._dynamic.compiled.get_property("LOADED_FROM_CACHE")),
    "static_cached": [bool(v.compiled.get_property("LOADED_FROM_CACHE")) for v in session._variants.values()],
}))
np.save(feeds_file + ".out.npy", result)
"""


def _name(out: Path) -> str:
    return tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]


def _feeds(unet_profile: dict) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    width = unet_profile["encoder_hidden_states"]["min"][2]
    return {
        "sample": rng.standard_normal((2, 4, 8, 8)).astype(np.float32),
        "timestep": np.array([500.0, 500.0], np.float32),
        "encoder_hidden_states": rng.standard_normal((2, 77, width)).astype(np.float32),
    }


def _child(home: Path, key: str, feeds_file: Path) -> tuple[dict, np.ndarray]:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(home), key, str(feeds_file)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), np.load(str(feeds_file) + ".out.npy")


def _blobs(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*.blob")}


def _artifact(home: Path, component: str = "unet") -> Path:
    cache = DeviceCache(home)
    return next(e.path for e in cache.entries() if e.manifest.component == component)


def test_a_second_start_compiles_nothing_and_a_changed_blob_is_compiled_again(built, tmp_path):
    _, out, store = built("sd1")
    home = Path(os.environ["ENGINEFARM_HOME"])
    name = _name(out)
    import enginefarm

    with enginefarm.load(f"{name}/unet", store=str(store), precision="fp32", target="openvino:cpu") as unet:
        feeds, key = _feeds(unet.artifact.profile), unet.artifact.build_key  # fetched into the cache
    np.savez(tmp_path / "feeds.npz", **feeds)
    folder = _artifact(home) / COMPILED
    shutil.rmtree(folder, ignore_errors=True)  # what this load kept: the first start below begins with nothing
    first, expected = _child(home, key, tmp_path / "feeds.npz")
    assert first["how"] == "compiled IR" and not first["dynamic_cached"]
    written = _blobs(folder)
    assert any(k.split("/")[1] == "dynamic" for k in written)  # the first start compiled and kept the dynamic model
    second, again = _child(home, key, tmp_path / "feeds.npz")
    assert second["how"] == "compiled IR" + FROM_CACHE and second["dynamic_cached"]
    assert all(second["static_cached"])  # a static shape timed faster in the first start is not compiled again
    assert _blobs(folder) == written  # nothing written again
    assert np.array_equal(again, expected)

    blob = next(folder.rglob("dynamic/*.blob"))
    os.chmod(blob, 0o600)
    blob.write_bytes(b"\0" * 1024)  # changed since OpenVINO wrote it: deleted, compiled again, not loaded
    third, recompiled = _child(home, key, tmp_path / "feeds.npz")
    assert third["how"] == "compiled IR" and not third["dynamic_cached"]
    assert np.array_equal(recompiled, expected)


def test_compiled_blobs_count_in_the_quota_and_leave_with_the_artifact(built, monkeypatch):
    _, out, store = built("sd1")
    home = Path(os.environ["ENGINEFARM_HOME"])
    import enginefarm

    monkeypatch.setattr(openvino_static, "STATIC", "always")  # a static compile kept, whether or not a blob shipped
    with enginefarm.load(f"{_name(out)}/unet", store=str(store), precision="fp32", target="openvino:cpu"):
        path = _artifact(home)
    stale = path / COMPILED / "ov-1999.0.0-cpu-0000000000000000" / "dynamic" / "1.blob"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"an older OpenVINO's blob")
    with enginefarm.load(f"{_name(out)}/unet", store=str(store), precision="fp32", target="openvino:cpu") as unet:
        unet.run(_feeds(unet.artifact.profile))
    assert not stale.parent.parent.exists()  # another OpenVINO version's blobs: never loaded here, so removed
    cache = DeviceCache(home)
    entry = next(e for e in cache.entries() if e.path == path)
    files = [p for p in (path / COMPILED).rglob("*") if p.is_file()]
    linked = [p for p in files if p.is_symlink()]  # a static shape's IR: its weights are the artifact's own
    assert [p.resolve() for p in linked] == [(path / "model.bin").resolve()]
    kept = sum(p.lstat().st_size for p in files)
    assert kept > 0 and entry.size == sum(f.size for f in entry.manifest.files) + kept
    cache.gc(quota=0)
    assert not path.exists() and not (path / COMPILED).exists()


def test_a_static_compile_computes_what_the_dynamic_one_does(built, monkeypatch):
    _, out, store = built("sd1")
    import enginefarm

    outputs = {}
    for mode in ("never", "always"):
        monkeypatch.setattr(openvino_static, "STATIC", mode)
        with enginefarm.load(f"{_name(out)}/unet", store=str(store), precision="fp32", target="openvino:cpu") as unet:
            feeds = _feeds(unet.artifact.profile)
            outputs[mode] = unet.run(feeds)["out_sample"]
            with unet.bind({"encoder_hidden_states": feeds["encoder_hidden_states"]}) as step:
                bound = step.run({"sample": feeds["sample"], "timestep": feeds["timestep"]})["out_sample"]
            assert np.array_equal(bound, outputs[mode])  # a binding runs on the compile `run` picked
            assert bool(unet._session.static_shapes) == (mode == "always")
            assert (unet._session._dynamic is None) == (mode == "always")  # a static shape: one compile held
    span = float(np.ptp(outputs["never"]))
    assert np.abs(outputs["always"] - outputs["never"]).max() <= 1e-4 * span


def test_static_shapes_are_tried_by_default_and_a_wrong_value_is_one_line(monkeypatch):
    from enginefarm.errors import ConfigError

    monkeypatch.setattr(openvino_static, "STATIC", None)
    monkeypatch.delenv("ENGINEFARM_OPENVINO_STATIC", raising=False)
    assert openvino_static.static_mode() == "auto"
    monkeypatch.setenv("ENGINEFARM_OPENVINO_STATIC", " Never ")
    assert openvino_static.static_mode() == "never"
    monkeypatch.setenv("ENGINEFARM_OPENVINO_STATIC", "sometimes")
    with pytest.raises(ConfigError) as refused:
        openvino_static.static_mode()
    assert "ENGINEFARM_OPENVINO_STATIC='sometimes'" in str(refused.value) and "auto" in refused.value.hint
