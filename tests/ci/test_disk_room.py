"""`make test` on a disk too small for it stops before the first test with one line, not a thousand errors part way."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT

A_TEST = "tests/test_docs.py::test_the_readme_is_a_front_page_whose_links_land"


def _pytest(tmpdir, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    env.pop("PYTEST_DEBUG_TEMPROOT", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_run_on_a_full_disk_stops_before_any_test_in_one_line(small_fs):
    proc = _pytest(small_fs, A_TEST)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    lines = [line for line in out.splitlines() if "disk full" in line]
    assert len(lines) == 1 and f"at {small_fs}" in lines[0] and "MB free" in lines[0], out
    assert "point TMPDIR at a bigger disk" in lines[0]
    assert "passed" not in out and "Traceback" not in out
    assert not any(small_fs.iterdir()), "nothing is written where there is no room"


def test_the_same_run_with_room_runs(tmp_path):
    proc = _pytest(tmp_path, A_TEST)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
