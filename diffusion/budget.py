"""A pipeline's components within a memory budget: each is loaded when a stage needs it, and the components no
stage needs now are closed first when the next one would not fit.

What a component holds is counted in the memory that runs out where it runs. On a GPU that is the device's: what its
SDK reports once it is loaded (`session.device_memory()`: TensorRT's and TensorRT-RTX's engine weights and activations,
`enginefarm.backends.device_memory`), where a pipeline's TensorRT engines share one activation buffer, so the
components loaded together hold their weights plus the largest activations, not the sum. On the CPU (and for a session
that reports nothing) it is the process's resident memory before and after it loads, plus what its stage grew by while
it ran (`Session.close` gives both back). Before its first load here, its artifact says: the resident memory its
benchmark measured after running (`resident_mb`), else 1.5x its files (what an ONNX Runtime session holds beside its
model; a TensorRT plan is mostly its weights). Outputs are the same with or without a budget: the same artifacts run,
only their lifetimes differ.
"""

from __future__ import annotations

from collections.abc import Callable

from enginefarm.backends.device_memory import DeviceMemory, peak_bytes
from enginefarm.errors import ConfigError

AUTO_SHARE = 0.9  # of the memory available, for a budget of "auto"


def parse_budget(budget: int | str | None, name: str = "memory_budget") -> int | None:
    """Bytes, a size ("6G"), "auto" (90% of the memory available now), or None (no budget: load everything once).
    `name`: what the user wrote it as, for the error (`enginefarm generate --memory-budget`)."""
    if budget is None:
        return None
    if budget == "auto":
        import psutil

        return int(psutil.virtual_memory().available * AUTO_SHARE)
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
    """The loaded sessions of one pipeline under `budget` bytes, loading with `load(component)`. `auto`: the budget
    was "auto" (90% of the host's available memory); once a component reports device memory it becomes 90% of the
    device's: what it has free plus what this pipeline holds there."""

    def __init__(
        self,
        budget: int,
        load: Callable[[str], object],
        sessions: dict,
        estimate: Callable[[str], int],
        auto: bool = False,
    ) -> None:
        self.budget = budget
        self._auto = auto
        self._load = load
        self._estimate = estimate
        self.estimates: dict[str, int] = {}
        self.sessions = sessions  # shared with the Pipeline: what is loaded now
        self.held: dict[str, int] = {}  # component → bytes it held once loaded here
        self.ran: dict[str, int] = {}  # component → bytes more it held once it had run here (its stage's growth)
        self.loads = 0  # loads done, the first ones included: the cost of the budget is (loads - components) reloads
        self.device: dict[str, DeviceMemory] = {}  # component → what its SDK last said it holds on the device
        self._stage: tuple[tuple[str, ...], int] | None = (
            None  # the last stage's components, and the RSS they started at
        )

    def need(self, components: tuple[str, ...] | list[str]) -> None:
        """Make every component of a stage loaded, releasing others first when they would not fit beside them."""
        self._count_last_stage()
        missing = [c for c in components if c not in self.sessions]
        if missing:
            self._release_others(components, missing)
            for component in missing:
                self.sessions[component] = self._measured_load(component)
                self._footprint(component)  # what its SDK reports, where it does: its RSS is not what runs out then
            # Known now, not estimated: a TensorRT engine's activations, which its first run would allocate.
            self._release_others(components, [])
        self._stage = (tuple(components), _rss())

    def _release_others(self, components, missing: list[str]) -> None:
        """Close the loaded components this stage does not need, oldest first, until `missing` fits beside the rest."""
        for other in [c for c in list(self.sessions) if c not in components]:
            if self.peak([*self.sessions, *missing]) <= self.budget:
                break
            self.sessions.pop(other).close()

    def _count_last_stage(self) -> None:
        """What the last stage's components grew by while they ran, shared among them by what they held loaded.
        OpenVINO allocates most of a model's memory at its first inference, so counting the load alone would let a
        budget keep everything."""
        if self._stage is None:
            return
        components, started = self._stage
        grown = _rss() - started
        ran = [c for c in components if c in self.sessions and c not in self.device]  # the device's are reported
        if grown <= 0 or not ran:
            return
        weights = [max(self.held.get(c, 0), 1) for c in ran]
        for component, weight in zip(ran, weights, strict=True):
            self.ran[component] = max(self.ran.get(component, 0), int(grown * weight / sum(weights)))

    def measured(self) -> dict[str, int]:
        """What each component loaded here held: on the device, as its SDK reported it; else once loaded, plus what
        its stage grew by while it ran."""
        return {c: self.peak([c]) for c in self.held}

    def peak(self, components) -> int:
        """What these components hold loaded together: their own bytes plus the largest of the activations they
        share (TensorRT's engines in one pipeline: one buffer)."""
        return peak_bytes([self._footprint(c) for c in components])

    def _footprint(self, component: str) -> DeviceMemory:
        report = getattr(self.sessions.get(component), "device_memory", None)
        memory = report() if callable(report) else None
        if memory is not None:
            self.device[component] = memory  # kept: once closed, it is what loading it again would take
            free = getattr(self.sessions[component], "device_free", None)
            if self._auto and callable(free) and free() is not None:
                self._auto = False  # once: the pipeline's own later loads are what the budget is for
                # shared activations are allocated at an engine's first run: none yet, at its first load
                held = sum(self.device[c].own for c in self.sessions if c in self.device)
                self.budget = int(AUTO_SHARE * (free() + held))
        if component in self.device:
            return self.device[component]
        return DeviceMemory(weights=self._bytes(component), activations=0)

    def _bytes(self, component: str) -> int:
        if component in self.held:
            return self.held[component] + self.ran.get(component, 0)
        if component not in self.estimates:
            self.estimates[component] = self._estimate(component)
        return self.estimates[component]

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
