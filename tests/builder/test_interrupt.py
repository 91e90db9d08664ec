"""Stopping a build (Ctrl-C, or SIGTERM from CI) is prompt and leaves no processes, work folders or partial objects."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil
import pytest

from enginefarm.cache.artifacts import read_manifest
from enginefarm.cache.stores import open_store


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_stopping_a_build_cleans_up(tiny_sd, write_recipe, tmp_path, sig):
    profiles = "\n".join(f"[components.decoder.profiles.p{i}]\nbatch = [1, 1, {i + 1}]\nheight = [8, 8, 16]\nwidth = [8, 8, 16]\n" for i in range(40))
    recipe = write_recipe(f"""
[model]
name = "many"
version = "1"
[defaults]
precisions = ["fp32"]
targets = ["openvino:cpu"]
[components.decoder]
source = "models/tiny_sd.onnx"
{profiles}
""")
    proc = subprocess.Popen([sys.executable, "-m", "enginefarm.cli", "build", str(recipe), "-j", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    store = tmp_path / "store"
    deadline = time.monotonic() + 120
    while not (store / "manifests").exists():  # wait until builds are really under way
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() is not None else "no build started"
        time.sleep(0.05)
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "interrupted" in stderr and "Traceback" not in stderr
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"worker processes left behind: {alive}"
    jobs_dir = tmp_path / "home" / "build" / "jobs"
    assert not jobs_dir.exists() or not any(jobs_dir.iterdir())
    opened = open_store(store)
    keys = list(opened.list_manifest_keys())
    assert 0 < len(keys) < 40
    for key in keys:
        assert all(opened.has_blob(f.stored_sha256) for f in read_manifest(opened, key).files)
