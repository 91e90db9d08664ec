"""Giving freed heap back to the system: a closed session (runner/session.py) and a build worker's memory
measurements (builder/rss.py) both need the process's RSS to drop when its tensors are freed."""

from __future__ import annotations


def give_back_memory() -> None:
    """Return freed heap to the system now: glibc keeps freed pages resident until asked (malloc_trim), so an app
    that closes a 3 GB UNet would otherwise still show it in its RSS."""
    import gc
    import sys

    gc.collect()
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None).malloc_trim(0)
        except (OSError, AttributeError):  # not glibc (musl): nothing to ask
            pass
