"""Best-effort locks (cache/locks.py) between real processes: flock on POSIX; on a platform without fcntl
(Windows), msvcrt.locking behind the same interface (issue 25, finding 5: before, Windows ran unlocked, so two
processes fetched and built the same thing twice). Correctness never depends on the lock."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from enginefarm.cache import locks
from enginefarm.cache.locks import file_lock
from tests.cache import windows_locking

ROOT = Path(__file__).resolve().parents[2]
HOLDER = """
import sys, time
from pathlib import Path
if sys.argv[3] == "windows":
    from tests.cache.windows_locking import simulate_windows
    simulate_windows()
from enginefarm.cache.locks import file_lock
with file_lock(Path(sys.argv[1]), timeout=5) as taken:
    print("taken" if taken else "unlocked", flush=True)
    while not Path(sys.argv[2]).exists():
        time.sleep(0.02)
"""


def _holder(tmp_path: Path, lock: Path, platform: str):
    release = tmp_path / f"release-{platform}"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock), str(release), platform], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    return proc, release, proc.stdout.readline().strip()


@pytest.mark.parametrize("platform", ["posix", "windows"])
def test_a_held_lock_keeps_another_process_out_until_released(platform, tmp_path, monkeypatch):
    if platform == "windows":
        monkeypatch.setitem(sys.modules, "fcntl", None)
        monkeypatch.setitem(sys.modules, "msvcrt", windows_locking.module())
    lock = tmp_path / "locks" / "k.lock"
    proc, release, said = _holder(tmp_path, lock, platform)
    try:
        assert said == "taken", said
        started = time.monotonic()
        with file_lock(lock, timeout=0.3) as taken:
            assert taken is False and time.monotonic() - started >= 0.3
    finally:
        release.touch()
        proc.wait(timeout=30)
    with file_lock(lock, timeout=5) as taken:
        assert taken is True


def test_without_fcntl_the_platform_lock_is_msvcrt(monkeypatch):
    monkeypatch.setitem(sys.modules, "fcntl", None)
    monkeypatch.setitem(sys.modules, "msvcrt", windows_locking.module())
    assert isinstance(locks.platform_locker(), locks._Msvcrt)
    monkeypatch.setitem(sys.modules, "msvcrt", None)
    assert locks.platform_locker() is None  # neither: unlocked (atomic writes keep the cache correct)


def test_the_msvcrt_lock_is_taken_and_given_back(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "fcntl", None)
    monkeypatch.setitem(sys.modules, "msvcrt", windows_locking.module())
    windows_locking.calls.clear()
    with file_lock(tmp_path / "k.lock") as taken:
        assert taken is True
    assert windows_locking.calls == [windows_locking.LK_NBLCK, windows_locking.LK_UNLCK]
