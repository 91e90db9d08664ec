"""A pipeline's components within a memory budget: each is loaded when a stage needs it, and the components no
stage needs now are closed first when the next one would not fit.

What a component holds is measured on this device when it loads (the process's resident memory before and after;
`Session.close` gives it back). Before its first load here, its artifact says: the resident memory its benchmark
measured after running (`resident_mb`), else 1.5x its files (ONNX Runtime held 69 MB for a 48 MB model). Outputs
are the same with or without a budget: the same artifacts run, only their lifetimes differ.
"""

from __future__ import annotations

from typing import Callable

from enginefarm.errors import ConfigError


def parse_budget(budget: int | str | None) -> int | None:
    """Bytes, a size ("6G"), "auto" (90% of the memory available now), or None (no budget: load everything once)."""
    if budget is None:
        return None
    if budget == "auto":
        import psutil

        return int(psutil.virtual_memory().available * 0.9)
    if isinstance(budget, str):
        from enginefarm.settings import parse_size

        return parse_size("memory_budget", budget)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
        raise ConfigError(f"memory_budget={budget!r}", hint='bytes (an int), a size such as "6G", or "auto"')
    return budget


class Residency:
    """The loaded sessions of one pipeline under `budget` bytes, loading with `load(component)`."""

    def __init__(self, budget: int, load: Callable[[str], object], sessions: dict, estimate: Callable[[str], int]) -> None:
        self.budget = budget
        self._load = load
        self._estimate = estimate
        self.estimates: dict[str, int] = {}
        self.sessions = sessions  # shared with the Pipeline: what is loaded now
        self.held: dict[str, int] = {}  # component → bytes it held when it loaded here
        self.loads = 0  # loads done, the first ones included: the cost of the budget is (loads - components) reloads

    def need(self, components: tuple[str, ...] | list[str]) -> None:
        """Make every component of a stage loaded, releasing others first when they would not fit beside them."""
        missing = [c for c in components if c not in self.sessions]
        if not missing:
            return
        wanted = sum(self._bytes(c) for c in missing)
        for other in [c for c in list(self.sessions) if c not in components]:
            if self._loaded_bytes() + wanted <= self.budget:
                break
            self.sessions.pop(other).close()
        for component in missing:
            self.sessions[component] = self._measured_load(component)

    def _bytes(self, component: str) -> int:
        if component in self.held:
            return self.held[component]
        if component not in self.estimates:
            self.estimates[component] = self._estimate(component)
        return self.estimates[component]

    def _loaded_bytes(self) -> int:
        return sum(self._bytes(c) for c in self.sessions)

    def _measured_load(self, component: str):
        from enginefarm.builder.rss import current_bytes

        before = current_bytes()
        session = self._load(component)
        self.held[component] = max(self.held.get(component, 0), current_bytes() - before)
        self.loads += 1
        return session


def artifact_bytes(manifest) -> int:
    """What an artifact will hold once loaded, before it has been loaded here."""
    measured = [b.get("resident_mb") for b in manifest.benchmarks if b.get("resident_mb")]
    if measured:
        return int(max(measured) * 2**20)
    return int(1.5 * sum(f.size for f in manifest.files))
