"""A pipeline's components within a memory budget: each is loaded when a stage needs it, and the components no
stage needs now are closed first when the next one would not fit.

What a component holds is measured on this device: the process's resident memory before and after it loads, plus
what its stage grew by while it ran (`Session.close` gives both back). Before its first load here, its artifact says:
the resident memory its benchmark measured after running (`resident_mb`), else 1.5x its files (ONNX Runtime held 69 MB
for a 48 MB model). Outputs are the same with or without a budget: the same artifacts run, only their lifetimes differ.
"""

from __future__ import annotations

from collections.abc import Callable

from enginefarm.errors import ConfigError


def parse_budget(budget: int | str | None, name: str = "memory_budget") -> int | None:
    """Bytes, a size ("6G"), "auto" (90% of the memory available now), or None (no budget: load everything once).
    `name`: what the user wrote it as, for the error (`enginefarm generate --memory-budget`)."""
    if budget is None:
        return None
    if budget == "auto":
        import psutil

        return int(psutil.virtual_memory().available * 0.9)
    if isinstance(budget, str):
        from enginefarm.settings import parse_size

        try:
            return parse_size(name, budget)
        except ConfigError as exc:
            raise ConfigError(str(exc), hint='a size such as "6G", or "auto"') from None
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
        raise ConfigError(f"memory_budget={budget!r}", hint='bytes (an int), a size such as "6G", or "auto"')
    return budget


class Residency:
    """The loaded sessions of one pipeline under `budget` bytes, loading with `load(component)`."""

    def __init__(
        self, budget: int, load: Callable[[str], object], sessions: dict, estimate: Callable[[str], int]
    ) -> None:
        self.budget = budget
        self._load = load
        self._estimate = estimate
        self.estimates: dict[str, int] = {}
        self.sessions = sessions  # shared with the Pipeline: what is loaded now
        self.held: dict[str, int] = {}  # component → bytes it held once loaded here
        self.ran: dict[str, int] = {}  # component → bytes more it held once it had run here (its stage's growth)
        self.loads = 0  # loads done, the first ones included: the cost of the budget is (loads - components) reloads
        self._stage: tuple[tuple[str, ...], int] | None = (
            None  # the last stage's components, and the RSS they started at
        )

    def need(self, components: tuple[str, ...] | list[str]) -> None:
        """Make every component of a stage loaded, releasing others first when they would not fit beside them."""
        self._count_last_stage()
        missing = [c for c in components if c not in self.sessions]
        if missing:
            wanted = sum(self._bytes(c) for c in missing)
            for other in [c for c in list(self.sessions) if c not in components]:
                if self._loaded_bytes() + wanted <= self.budget:
                    break
                self.sessions.pop(other).close()
            for component in missing:
                self.sessions[component] = self._measured_load(component)
        self._stage = (tuple(components), _rss())

    def _count_last_stage(self) -> None:
        """What the last stage's components grew by while they ran, shared among them by what they held loaded.
        OpenVINO allocates most of a model's memory at its first inference: the real-size SD 1.5 UNet (fp16) held
        0.3 GB once loaded and 6.7 GB after one step; counting the load alone let a budget keep everything."""
        if self._stage is None:
            return
        components, started = self._stage
        grown = _rss() - started
        ran = [c for c in components if c in self.sessions]
        if grown <= 0 or not ran:
            return
        weights = [max(self.held.get(c, 0), 1) for c in ran]
        for component, weight in zip(ran, weights, strict=True):
            self.ran[component] = max(self.ran.get(component, 0), int(grown * weight / sum(weights)))

    def measured(self) -> dict[str, int]:
        """What each component loaded here held: once loaded, plus what its stage grew by while it ran."""
        return {c: self._bytes(c) for c in self.held}

    def _bytes(self, component: str) -> int:
        if component in self.held:
            return self.held[component] + self.ran.get(component, 0)
        if component not in self.estimates:
            self.estimates[component] = self._estimate(component)
        return self.estimates[component]

    def _loaded_bytes(self) -> int:
        return sum(self._bytes(c) for c in self.sessions)

    def _measured_load(self, component: str):
        before = _rss()
        session = self._load(component)
        self.held[component] = max(self.held.get(component, 0), _rss() - before)
        self.loads += 1
        return session


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def artifact_bytes(manifest) -> int:
    """What an artifact will hold once loaded, before it has been loaded here."""
    measured = [b.get("resident_mb") for b in manifest.benchmarks if b.get("resident_mb")]
    if measured:
        return int(max(measured) * 2**20)
    return int(1.5 * sum(f.size for f in manifest.files))
