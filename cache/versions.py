"""Model versions (a recipe's `model.version`): how they order, so "the newest" means what a person expects.

A version is read as a sequence of numbers and words, split at `.`, `-`, `_`, `+` and wherever digits meet letters:
`1.10` is (1, 10), `2rc1` is (2, "rc", 1), `2024-05-01` is (2024, 5, 1). Two versions compare piece by piece:

- numbers compare as numbers: `10` > `9`, `1.10` > `1.9`;
- words compare alphabetically, ignoring case: `alpha` < `beta` < `rc`;
- at the same place a number is newer than the end of the version, and the end is newer than a word: `2.1` > `2` >
  `2rc1` > `2beta` (a word after a number marks a pre-release of it);
- trailing zeros do not count: `2.0` is the same version as `2`; nor does a leading `v`: `v2` is `2`.

So a version without any number (`main`, `dev`) is older than every numbered one, and versions of words only order
alphabetically. The empty version (an index entry written before versions were recorded) is the oldest of all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

_PIECES = re.compile(r"\d+|[^\W\d_]+")
_WORD, _END, _NUMBER = 0, 1, 2


@lru_cache(maxsize=4096)  # an index of 10^5 entries holds a few versions: each is parsed once, not per comparison
def version_key(version: str | None) -> tuple:
    """A sort key: a newer version has a larger key; equal keys are the same version."""
    text = re.sub(r"^[vV](?=\d)", "", str(version or "").strip())
    pieces = [(_NUMBER, int(p)) if p.isdigit() else (_WORD, p.lower()) for p in _PIECES.findall(text)]
    while len(pieces) > 1 and pieces[-1] == (_NUMBER, 0):
        pieces.pop()
    if not pieces:
        return ((_WORD, ""),)  # no version at all: older than any word
    return tuple(pieces) + ((_END, ""),)


def newest(versions: Iterable[str | None]) -> str | None:
    """The newest of `versions` (None if there are none). Of equal versions (`2.0`, `2`), the first seen."""
    best = None
    for version in versions:
        if best is None or version_key(version) > version_key(best):
            best = version
    return best


def same_version(a: str | None, b: str | None) -> bool:
    return version_key(a) == version_key(b)


def by_age(versions: Iterable[str | None]) -> list[str | None]:
    """Distinct versions, newest first (equal versions counted once, in the spelling seen first)."""
    seen: dict[tuple, str | None] = {}
    for version in versions:
        seen.setdefault(version_key(version), version)
    return [seen[key] for key in sorted(seen, reverse=True)]
