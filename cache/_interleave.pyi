# The optional C loop cache/_interleave.c, as mypy sees it (a compiled module has no source to read).
from typing import Any

def interleave(groups: Any, out: Any, width: int, rotate: bool, /) -> None:
    """Rebuild `width`-byte elements into the writable buffer `out` from the byte groups in `groups`."""
