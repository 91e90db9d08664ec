"""One host, one benchmark at a time, and never beside a build: builds share the host, a benchmark has it alone.

Two lock files in a folder every process on the host sees (ENGINEFARM_HOST_LOCK_DIR, default the system temp
dir), so `build -j N`, several `enginefarm build` runs and on-device timing all respect each other:

- `host.lock`: builds (prep, compile, validation) hold it shared; a benchmark holds it exclusive.
- `turnstile.lock`: a benchmark holds it while it waits, and builds pass through it before taking their share, so
  a waiting benchmark is not starved by builds that keep starting.

A process that dies releases its locks (the kernel drops them with the file descriptor). Without flock (Windows)
or without access to the folder, work goes on unlocked and the benchmark record says `alone: null` (unknown);
`alone: false` means the host could not be had alone in time and the numbers were measured anyway.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

MAX_WAIT_S = 3600.0  # a build that hangs must not keep a benchmark waiting forever


def lock_dir() -> Path:
    from enginefarm.settings import load_settings

    return load_settings().host_lock_dir or Path(tempfile.gettempdir()) / "enginefarm-host-locks"


def _open(name: str) -> int | None:
    folder = lock_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / name, os.O_RDONLY | os.O_CREAT, 0o666)  # flock needs no write access: any user can lock
    except OSError as exc:
        log.warning("host lock %s unavailable (%s); going on unlocked", folder / name, exc)
        return None
    try:
        os.fchmod(fd, 0o666)  # other users on the host lock it too
    except OSError:
        pass
    return fd


def _flock(fd: int, mode: int, timeout: float) -> bool:
    import fcntl

    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        except OSError:
            return False


HOLDER = "holder.json"  # who holds the host alone now: {"pid", "what"}, for a build's "waiting for" line


def _holder() -> str:
    import json

    try:
        held = json.loads((lock_dir() / HOLDER).read_text())
        return f"pid {int(held['pid'])} ({str(held['what'])[:120]})"
    except (OSError, ValueError, KeyError, TypeError):
        return "a benchmark (or one waiting to run)"


def _flock_saying(fd: int, mode: int, timeout: float, say: Callable[[str], None] | None) -> bool:
    """`_flock`, with one line naming the holder when the lock is not free at once (a wait of minutes): a warning,
    and `say` (a build job's progress line)."""
    if _flock(fd, mode, 0):
        return True
    line = f"waiting for the host lock held by {_holder()}"
    log.warning("%s", line)
    if say is not None:
        say(line)
    return _flock(fd, mode, timeout)


@contextmanager
def building(say: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the host shared while building: waits while a benchmark runs or waits to run (saying whose, to `say`)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    turnstile, host = _open("turnstile.lock"), _open("host.lock")
    try:
        if turnstile is not None:
            _flock_saying(turnstile, fcntl.LOCK_EX, MAX_WAIT_S, say)
        if host is not None:
            _flock_saying(host, fcntl.LOCK_SH, MAX_WAIT_S, say)
        if turnstile is not None:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield
    finally:
        for fd in (host, turnstile):
            if fd is not None:
                os.close(fd)  # closing drops the lock


@contextmanager
def alone(timeout: float = MAX_WAIT_S, what: str = "a benchmark") -> Iterator[dict]:
    """Hold the host exclusively: no build and no other benchmark runs meanwhile. Yields what the benchmark record
    keeps: `alone` (True: had alone; False: not within `timeout`; None: this host cannot lock) and `waited_s`.
    `what` is what a waiting build says holds the host."""
    started = time.monotonic()
    try:
        import fcntl
    except ImportError:
        yield {"alone": None, "waited_s": 0.0}
        return
    turnstile, host = _open("turnstile.lock"), _open("host.lock")
    got = False
    try:
        if turnstile is None or host is None:
            yield {"alone": None, "waited_s": 0.0}
            return
        got = _flock(turnstile, fcntl.LOCK_EX, timeout)
        got = got and _flock(host, fcntl.LOCK_EX, max(0.0, timeout - (time.monotonic() - started)))
        fcntl.flock(turnstile, fcntl.LOCK_UN)  # builds now queue on the host lock itself
        if not got:
            log.warning("could not have the host alone within %.0f s", timeout)
        else:
            _say_holder(what)
        yield {"alone": got, "waited_s": round(time.monotonic() - started, 2)}
    finally:
        if got:  # ours: another's is left alone
            try:
                (lock_dir() / HOLDER).unlink(missing_ok=True)
            except OSError:
                pass
        for fd in (host, turnstile):
            if fd is not None:
                os.close(fd)


def _say_holder(what: str) -> None:
    import json

    try:
        tmp = lock_dir() / f"{HOLDER}.{os.getpid()}"
        tmp.write_text(json.dumps({"pid": os.getpid(), "what": what}))
        os.replace(tmp, lock_dir() / HOLDER)
    except OSError:
        pass  # a folder we may lock but not write: the waiting line says less
