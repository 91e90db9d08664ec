"""Which model and component names every file system can hold. A model's name becomes a file name in every store
(`index/<model>.json`) and its component's a part of work folders; a store made on Linux is read on Windows and
macOS too (Easy Diffusion's users), so a name must work on all three:

- at most MAX_NAME characters: Windows' paths are capped at 260 characters (MAX_PATH) unless long paths are enabled,
  and a cache folder, `index/` and `.json` come before and after the name;
- not a Windows device name (CON, PRN, AUX, NUL, COM1-9, LPT1-9), in any case, with or without an extension:
  `nul.json` opens the null device there;
- not ending in '.', which Windows drops;
- in a store, not another stored model's name in other case: `TINY-SD` and `tiny-sd` are one file on Windows and
  macOS, so each would overwrite the other's index.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_NAME = 100
NAME_CHARS = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # the one definition: recipes, publish and load refs
_RESERVED = re.compile(r"(con|prn|aux|nul|com[1-9]|lpt[1-9])(\..*)?", re.IGNORECASE)


def name_problem(name: str) -> str | None:
    """Why `name` cannot be a model or component name, or None if it can."""
    if not isinstance(name, str) or not NAME_CHARS.fullmatch(name):
        return f"{name!r} may use only letters, digits, '_', '.', '-' (starting with a letter or digit)"
    if len(name) > MAX_NAME:
        return f"{name[:20]!r}... is longer than {MAX_NAME} characters ({len(name)}): Windows paths stop at 260"
    if _RESERVED.fullmatch(name):
        return f"{name!r} is a device name reserved on Windows (CON, PRN, AUX, NUL, COM1-9, LPT1-9, with any extension)"
    if name.endswith("."):
        return f"{name!r} ends with '.', which Windows drops"
    return None


def case_twin(name: str, existing: Iterable[str]) -> str | None:
    """The stored name that `name` differs from only in case (one file on Windows and macOS), or None."""
    folded = name.casefold()
    return next((other for other in existing if other != name and other.casefold() == folded), None)
