"""Two builders of the same recipe at once: the one that finds its jobs published by the other says so in its summary
(before, those jobs were in no count: "0 built, 0 failed, 0 already stored")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil


def _stopped_worker(proc: subprocess.Popen, timeout: float = 120.0) -> psutil.Process:
    """The build worker of `proc` that stopped itself at its fault checkpoint (SIGSTOP)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if child.status() == psutil.STATUS_STOPPED:
                    return child
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.05)
    raise AssertionError("the first builder never reached its checkpoint")


def test_jobs_another_builder_published_meanwhile_are_counted(tiny_recipe, cli, tmp_path):
    recipe = str(tiny_recipe(precisions=("fp32", "fp16")))
    env = {**os.environ, "ENGINEFARM_FAULT_AT": "publish:blob#1:pause"}  # each worker stops after its first blob
    first = subprocess.Popen(
        [sys.executable, "-m", "enginefarm.cli", "build", recipe, "--no-bench"],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        _stopped_worker(first)  # its first job's blobs are going in; its manifest is not written yet
        second = cli("build", recipe, "--no-bench", check=True)
        assert "2 built" in second.stdout, second.stdout
    finally:
        for child in psutil.Process(first.pid).children(recursive=True):
            child.send_signal(signal.SIGCONT)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, out + err
    # One job lost the race to publish its manifest; the other found its artifact stored when its worker started.
    assert "0 built" in out and "2 published by another builder meanwhile" in out, out
    assert out.count("published by another builder meanwhile") == 3, out  # each job's line, and the summary
