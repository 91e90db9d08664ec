"""An SDK's exception as a one-line-or-more reason a user can read: shared by the build (the SDK failed to build)
and the validation gate (what it built does not load or run)."""

from __future__ import annotations

import re
from pathlib import Path

SDK_TEXT_LIMIT = 4000


def sdk_text(exc: BaseException, workroot: Path) -> str:
    """An SDK's error as the user needs it: every line of it (bounded, cut at a line), with the job's temporary
    folders, which are gone by the time anyone reads the message, reduced to the file names inside them."""
    text = str(exc).strip()
    for root in {str(workroot), str(Path(workroot).resolve())}:
        text = re.sub(re.escape(root) + r"/(?:[^\s'\"]*/)?", "", text)
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    text = "\n".join(lines)
    if len(text) > SDK_TEXT_LIMIT:
        cut = text.rfind("\n", 0, SDK_TEXT_LIMIT)
        cut = cut if cut > SDK_TEXT_LIMIT // 2 else text.rfind(" ", 0, SDK_TEXT_LIMIT)
        text = f"{text[:cut]} … ({len(text) - cut} more characters; -v shows all)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
