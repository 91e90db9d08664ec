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
from tests.conftest import profile_tables


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_stopping_a_build_cleans_up(tiny_sd, write_recipe, tmp_path, sig):
    profiles = profile_tables(40, height=(8, 8, 16))
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
    proc = subprocess.Popen(
        [sys.executable, "-m", "enginefarm.cli", "build", str(recipe), "-j", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    store = tmp_path / "store"
    deadline = time.monotonic() + 120
    while not list(store.glob("manifests/*.json")):  # wait until builds are really under way
        assert proc.poll() is None and time.monotonic() < deadline, (
            proc.stderr.read() if proc.poll() is not None else "no build started"
        )
        time.sleep(0.05)
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(sig)
    try:
        _, stderr = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        for child in [*children, psutil.Process(proc.pid)]:  # never leave a hung build behind, even when failing
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        raise
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


def test_a_crashing_build_process_fails_only_its_job(tiny_recipe, tmp_path):
    """A worker killed by the OS (here: os._exit inside the SDK call) is one failed job; the others still build."""
    import textwrap

    script = textwrap.dedent(f"""
        from pathlib import Path
        from enginefarm.builder.executor import run_jobs
        from enginefarm.builder.planner import plan
        from enginefarm.builder.recipe import load_recipe

        recipe = load_recipe({str(tiny_recipe(targets=("openvino:cpu", "onnxruntime:cpu")))!r})
        planned = plan([recipe], Path({str(tmp_path / "dl")!r}))
        store, work = {str(tmp_path / "store")!r}, Path({str(tmp_path / "work")!r})
        results = run_jobs([p.job for p in planned], store, work, parallel=2, bench=False)
        print("|".join(f"{{r.label}}={{r.status}}={{r.reason}}" for r in results))
    """)
    # Every spawned worker imports sitecustomize at start-up: with the switch set, its OpenVINO build dies.
    crash = tmp_path / "crash"
    crash.mkdir()
    (crash / "sitecustomize.py").write_text(
        textwrap.dedent("""
        import os
        if os.environ.get("CRASH_OPENVINO_BUILD"):
            from enginefarm.backends import openvino
            def build(*args, **kwargs):
                os._exit(9)
            openvino.BACKEND.build = build
    """)
    )
    import os

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(crash), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
        ),
        "CRASH_OPENVINO_BUILD": "1",
    }
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    statuses = dict(item.split("=", 2)[0:2] for item in out.stdout.strip().splitlines()[-1].split("|"))
    assert statuses == {
        "tiny-sd/decoder fp32 default openvino:cpu": "failed",
        "tiny-sd/decoder fp32 default onnxruntime:cpu": "built",
    }
    assert "build process died (exit code 9)" in out.stdout
