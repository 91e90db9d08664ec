"""The part every filter kind shares: its description, its loaded sessions, and giving them back."""

from __future__ import annotations

from typing import Any, ClassVar

from .info import FilterInfo


class Filter:
    """One loaded filter. Kinds subclass it and add `__call__`; `sessions` maps each component of `info` to its
    loaded `enginefarm` Session; `uses` maps a role to another loaded filter this one runs (a face restorer's
    detector), named by `info.details["uses"]`."""

    kind: ClassVar[str] = ""

    def __init__(self, info: FilterInfo, sessions: dict[str, Any], uses: dict[str, Filter] | None = None):
        self.info = info
        self.sessions = sessions
        self.uses = dict(uses or {})

    @property
    def name(self) -> str:
        return self.info.name

    def close(self) -> None:
        """Give back every session's memory. Safe to call twice."""
        sessions, self.sessions = self.sessions, {}
        uses, self.uses = self.uses, {}
        for session in sessions.values():
            session.close()
        for other in uses.values():
            other.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} ({self.info.architecture})>"
