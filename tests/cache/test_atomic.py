"""Atomic writes under real process death: a killed writer leaves no partial file visible."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from enginefarm.cache.atomic import write_once

WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from enginefarm.cache.atomic import atomic_writer
    target = Path(sys.argv[1])
    with atomic_writer(target) as out:
        for _ in range(10_000):
            out.write(b"x" * 65536)
            out.flush()
            Path(sys.argv[2]).touch()   # tell the test we are mid-write
            time.sleep(0.01)
""")


@pytest.mark.parametrize("existing", [None, b"old complete content"])
def test_killed_writer_leaves_old_file_or_nothing(tmp_path, existing):
    target, started = tmp_path / "data.bin", tmp_path / "started"
    if existing is not None:
        target.write_bytes(existing)
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target), str(started)])
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert time.monotonic() < deadline, "writer never started"
            time.sleep(0.01)
        time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    if existing is None:
        assert not target.exists()
    else:
        assert target.read_bytes() == existing
    partials = [p for p in tmp_path.iterdir() if p.name.endswith(".incomplete")]
    assert partials, "the killed writer's temp file should be the only trace"


def test_write_once_never_overwrites(tmp_path):
    target = tmp_path / "folder" / "m.json"
    target.parent.mkdir()
    assert write_once(target, b"first")
    assert not write_once(target, b"second")
    assert target.read_bytes() == b"first"
    assert [p.name for p in target.parent.iterdir()] == ["m.json"]


def test_killed_build_publishes_nothing(tiny_recipe, tmp_path):
    """SIGKILL a real `enginefarm build` mid-way: the store has either no manifest, or manifests whose blobs all
    exist."""
    recipe = tiny_recipe(precisions=("fp32", "fp16"), targets=("onnxruntime:cpu", "openvino:cpu"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "enginefarm.cli", "build", str(recipe), "--no-bench"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    store = tmp_path / "store"
    deadline = time.monotonic() + 120
    while not (store / "blobs").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    from enginefarm.cache.artifacts import read_manifest
    from enginefarm.cache.stores import open_store

    opened = open_store(store)
    for key in opened.list_manifest_keys():
        manifest = read_manifest(opened, key)
        assert all(opened.has_blob(f.stored_sha256) for f in manifest.files)
