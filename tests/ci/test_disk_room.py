"""`make test` on a disk too small for it stops before the first test with one line, not a thousand errors part way."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT, RUN_OUT_OF_DISK

A_TEST = "tests/test_docs.py::test_the_readme_is_a_front_page_whose_links_land"


def _pytest(tmpdir, *args: str) -> subprocess.CompletedProcess:
    """pytest in a child whose temporary folders go to `tmpdir`."""
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


@pytest.mark.slow  # a pytest run in a child process
def test_a_run_on_a_full_disk_stops_before_any_test_in_one_line(small_fs):
    proc = _pytest(small_fs, A_TEST)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    lines = [line for line in out.splitlines() if "disk full" in line]
    assert len(lines) == 1 and f"at {small_fs}" in lines[0] and "MB free" in lines[0], out
    assert "point TMPDIR at a bigger disk" in lines[0]
    assert "passed" not in out and "Traceback" not in out
    assert not any(small_fs.iterdir()), "nothing is written where there is no room"


@pytest.mark.slow  # a pytest run in a child process
def test_the_same_run_with_room_runs(tmp_path):
    proc = _pytest(tmp_path, A_TEST)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout


FILLS_THE_DISK = """
import os, tempfile

def test_one_writes_most_of_what_is_free():
    free = os.statvfs(tempfile.gettempdir())
    with open(os.path.join(tempfile.gettempdir(), "filler"), "wb") as out:
        out.write(b"x" * (free.f_bavail * free.f_frsize - {left}))

def test_two_never_starts():
    pass
"""


@pytest.mark.slow  # a pytest run in a child process
def test_a_disk_that_fills_mid_run_stops_it_at_the_next_test_in_one_line(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    small = tmp_path / "tmp"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=640m", "tmpfs", str(small)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        tests = tmp_path / "suite" / "test_fills.py"
        tests.parent.mkdir()
        tests.write_text(textwrap.dedent(FILLS_THE_DISK.format(left=RUN_OUT_OF_DISK // 2)))
        proc = _pytest(small, "-p", "tests.conftest", "--rootdir", str(tests.parent), str(tests))
    finally:
        subprocess.run(["umount", "-l", str(small)], capture_output=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    lines = [line for line in out.splitlines() if "disk full" in line]
    assert len(lines) == 1 and "before test_fills.py::test_two_never_starts" in lines[0], out
    assert "1 passed" in out and "error" not in out and "Traceback" not in out, out
