"""The progress callback the library reports through. Apps subclass `Progress` (or pass a plain function that
takes a message); the CLI draws it with rich. Reporting never fails the work: callback errors are logged."""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


class Progress:
    """Override what you need. `transfer` is called with cumulative bytes for one named transfer, `work` with
    steps done of other work."""

    def message(self, text: str) -> None:
        """One line about what is happening ("fetching 3 files", "compiling on this device")."""

    def transfer(self, name: str, done: int, total: int) -> None:
        """Bytes of the named transfer so far (`done`, cumulative) out of `total`."""

    def work(self, name: str, done: int, total: int) -> None:
        """Steps of one named piece of work that is not bytes (an engine compiled on the device)."""


class _Messages(Progress):
    def __init__(self, fn: Callable[[str], None]) -> None:
        self.fn = fn

    def message(self, text: str) -> None:
        self.fn(text)


class _Safe(Progress):
    def __init__(self, inner: Progress) -> None:
        self.inner = inner

    def message(self, text: str) -> None:
        try:
            self.inner.message(text)
        except Exception:
            log.debug("progress callback failed", exc_info=True)

    def transfer(self, name: str, done: int, total: int) -> None:
        try:
            self.inner.transfer(name, done, total)
        except Exception:
            log.debug("progress callback failed", exc_info=True)

    def work(self, name: str, done: int, total: int) -> None:
        try:
            self.inner.work(name, done, total)
        except Exception:
            log.debug("progress callback failed", exc_info=True)


ProgressLike = Progress | Callable[[str], None] | None


def as_progress(value: ProgressLike) -> Progress:
    if value is None:
        return Progress()
    if isinstance(value, Progress):
        return _Safe(value)
    if callable(value):
        return _Safe(_Messages(value))
    raise TypeError(f"progress must be a Progress or a callable, not {type(value).__name__}")
