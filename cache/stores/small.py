"""Whole small objects over HTTP (indexes, manifests, channel metadata): the same rate floor as blobs, a short
deadline, a cap, a length check against Content-Length, and a retry when the body is cut short or stalls.

Before, these were one `read()` with only a per-recv socket timeout: a server sending a byte a second held `load`
for good, a stall surfaced as a TimeoutError traceback, and a body cut short was parsed as if whole."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from enginefarm.errors import StoreError, Unreachable

from .ranged import Limits, Pace

log = logging.getLogger(__name__)

DEADLINE_S = 30.0  # all tries of one small read together: an index or manifest is KBs
WINDOW_S = 10.0  # the rate floor is judged over this window, and a recv waits at most this long (a stall)
ATTEMPTS = 3
CHUNK = 64 << 10


class Headers(Protocol):
    def get(self, name: str, /) -> str | None: ...


class Response(Protocol):
    headers: Headers

    def read(self, size: int = -1) -> bytes: ...

    def close(self) -> None: ...


def small_limits(limits: Limits) -> Limits:
    """A download's limits, tightened for small objects: the same floor, a shorter window and deadline."""
    return Limits(
        deadline_s=min(limits.deadline_s, DEADLINE_S), min_rate=limits.min_rate, window_s=min(limits.window_s, WINDOW_S)
    )


def read_whole(
    request: Callable[[float], Response],
    *,
    limit: int,
    limits: Limits,
    what: str,
    transient: tuple[type[BaseException], ...],
) -> tuple[bytes, str | None]:
    """(body, ETag) of one object. `request(timeout)` opens it, with `timeout` for each socket wait. A body shorter
    than its Content-Length, a reset or a stall is tried again (ATTEMPTS in all, within the deadline); a trickle
    below the floor, a body over `limit`, or the deadline passing raise a StoreError naming the object."""
    started = time.monotonic()
    tries: list[str] = []
    caught: tuple[type[BaseException], ...] = (Unreachable, *transient)
    for attempt in range(ATTEMPTS):
        left = limits.deadline_s - (time.monotonic() - started)
        if left <= 0:
            break
        wait = min(limits.window_s, left)
        try:
            response = request(wait)
            try:
                data = _paced(response, limit, limits, started, what)
                length = str(response.headers.get("Content-Length") or "")
            finally:
                response.close()
        except TimeoutError:
            tries.append(f"no data for {wait:.0f} s (the server stalls)")
        except caught as exc:
            tries.append(f"{type(exc).__name__}: {exc}" if not isinstance(exc, StoreError) else str(exc))
        else:
            if not length.isdigit() or len(data) == int(length):
                return data, response.headers.get("ETag")
            tries.append(f"the body ended at {len(data)} of {length} bytes")
        log.info("%s: %s; reading it again", what, tries[-1])
        time.sleep(min(0.2 * 2**attempt, 1.0))
    raise StoreError(
        f"{what}: {tries[-1] if tries else 'no answer'} ({len(tries)} tries in {time.monotonic() - started:.0f} s)",
        hint="the server stalls or cuts responses short; try again later (ENGINEFARM_HTTP_DEADLINE, _MIN_RATE tune "
        "the limits)",
    )


def _paced(response: Response, limit: int, limits: Limits, started: float, what: str) -> bytes:
    parts: list[bytes] = []
    pace = Pace(limits, what, started=started)
    reader = getattr(response, "read1", None) or response.read  # one socket read at a time: the checks run on a trickle
    while chunk := reader(min(CHUNK, limit + 1 - pace.got)):
        parts.append(chunk)
        if pace.got + len(chunk) > limit:
            raise StoreError(
                f"{what} is larger than {limit >> 20} MiB; refusing to read more",
                hint="this is not an enginefarm store object",
            )
        pace.add(len(chunk))
    return b"".join(parts)
