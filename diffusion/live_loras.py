"""A pipeline's LoRA stack, changed between calls without a reload: `Pipeline.set_loras([(file, strength), ...])`.

Where the time of a LoRA load goes (SD 1.5's UNet, fp16): finding and verifying the artifact, reading the file,
placing its layers on the weight map, merging them into the weights they touch (runner/merge.py), and above all
opening a session with those weights (OpenVINO compiles the IR, ONNX Runtime optimizes the graph). Here each
component that takes LoRAs is opened once with the weights its stack touches as graph inputs
(`runner/live_weights.py`), and keeps what a change reuses: its manifest and weight map, each file's layers placed
on it (each file is read once, when a stack first names it: `weights.lora.read`), and the base values of the
touched weights. A new
stack is merged from those and copied into the fed arrays; a session is opened again only when the stack touches a
weight the open one does not take as an input (the inputs then grow to cover both stacks).

`Pipeline.load(loras=)` opens its LoRA components this way, so a stack set later and the same stack loaded fresh
run the same graph with the same values. Components given a custom checkpoint (`weights=`), seamless variants and
backends without weight inputs (TensorRT) load the stack the former way (`enginefarm.load(..., loras=)`), again at
each change.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from enginefarm.weights.lora import LoraFile, file_key
from enginefarm.weights.lora import read as read_file

log = logging.getLogger(__name__)

Loras = list[tuple[LoraFile, float]]  # files as read (weights.lora.read), with their strengths


class LiveLoras:
    """The stack of one pipeline: which files each component takes, and the live components that feed them."""

    def __init__(
        self,
        deal: Callable[[object, Callable[[Path], LoraFile]], tuple[dict[str, Loras], str]],
        fetch: Callable[[str], tuple],
        load_former: Callable[[str, Loras], Any],
        excluded: set[str],
    ) -> None:
        self._deal = deal  # the asked LoRAs, a reader → (component → its files, the line naming layers none takes)
        self._fetch = fetch  # component → (manifest, artifact folder, explanation): the artifact load would pick
        self._load_former = load_former  # component, its files → a session loaded the former way
        self._excluded = excluded  # components given a custom checkpoint: their weights are not the artifact's
        self.dealt: dict[str, Loras] = {}
        self.ignored = ""
        self._live: dict[str, LiveComponent] = {}
        self._files: dict[tuple, LoraFile] = {}  # file_key → the file as read: the stack's files, read once
        self.timings: dict[str, float] = {}  # stage → seconds, of the last change

    def start(self, loras) -> str:
        """The stack at load: read and dealt (a bad file is refused here, before anything loads). Returns the line
        naming the layers no component takes ('' if none)."""
        if loras:
            self.dealt, self.ignored = self._deal(loras, self._read)
            self._keep_read()
        return self.ignored

    def takes(self, component: str) -> bool:
        """Whether `component`'s session comes from here: it has LoRAs now, or had, and its weights are the
        artifact's."""
        return component not in self._excluded and (bool(self.dealt.get(component)) or component in self._live)

    def session(self, component: str):
        """`component`'s session with the current stack (opened when it has none, or it was closed)."""
        live = self._component(component)
        if not live.fed:
            return self._load_former(component, self.dealt.get(component, []))
        return live.reopen(self.dealt.get(component, []))

    def set(self, loras, sessions: dict) -> list[str]:
        """Replace the whole stack. Everything that can fail with the user's files (reading, dealing, placing,
        merging) is done for every component before any session changes, so a bad file leaves the previous stack
        in use. `sessions`: the pipeline's loaded sessions, updated in place. Returns the components changed."""
        started = time.perf_counter()
        dealt, ignored = self._deal(loras, self._read) if loras else ({}, "")
        read = time.perf_counter()
        changed = [
            c for c in sorted(set(dealt) | set(self.dealt)) if _key(dealt.get(c, [])) != _key(self.dealt.get(c, []))
        ]
        plans = {
            c: None  # loaded the former way below
            if c in self._excluded or not self._component(c).fed
            else self._live[c].prepare(dealt.get(c, []))
            for c in changed
        }
        merged = time.perf_counter()
        self.dealt, self.ignored = dealt, ignored
        self._keep_read()
        for component, plan in plans.items():
            if component not in sessions:  # not loaded now (a memory budget): loads with the stack when needed
                continue
            if plan is None:
                old = sessions[component]
                sessions[component] = self._load_former(component, dealt.get(component, []))
                old.close()
            else:
                sessions[component] = self._live[component].commit(plan, sessions[component])
        self.timings = {
            "read": read - started,
            "merge": merged - read,
            "apply": time.perf_counter() - merged,
        }
        return changed

    def _read(self, path: Path) -> LoraFile:
        """The file as read before, while it is unchanged; else read now."""
        key = file_key(Path(path))
        if key not in self._files or key[1] is None:
            self._files[key] = read_file(Path(path))
        return self._files[key]

    def _keep_read(self) -> None:
        """Keep only the files of the current stack."""
        keys = {f.key for loras in self.dealt.values() for f, _ in loras}
        self._files = {k: f for k, f in self._files.items() if k in keys}

    def _component(self, component: str) -> LiveComponent:
        if component not in self._live:
            manifest, folder, explanation = self._fetch(component)
            self._live[component] = LiveComponent(component, manifest, Path(folder), explanation)
        return self._live[component]


def _key(loras: Loras) -> tuple:
    """A stack as compared: a file rewritten in place (another size or time) was read again, as another file."""
    return tuple((*f.key, float(s)) for f, s in loras)


@dataclass
class Plan:
    """What a commit writes: every fed weight's new value, by initializer name."""

    values: dict[str, np.ndarray]
    loras: Loras


@dataclass
class LiveComponent:
    """One component's artifact, the layers each file places on it, the base values of the weights they touch,
    and its session with those weights as inputs."""

    component: str
    manifest: Any
    folder: Path
    explanation: str
    _layers: dict[tuple, list] = field(default_factory=dict)  # file_key → the file's layers placed here
    _base: dict[str, np.ndarray] = field(default_factory=dict)  # initializer → the artifact's own value
    _session: Any = None  # the runner Session wrapping `_fed`
    _fed: Any = None  # its FedSession (runner/live_weights.py)
    _inputs: frozenset = frozenset()  # the initializers the open session takes as inputs
    _loras: Loras = field(default_factory=list)

    def __post_init__(self) -> None:
        from enginefarm.backends import get_backend
        from enginefarm.formats.weightmap import read_map
        from enginefarm.runner.live_weights import LIVE_BACKENDS

        self.backend = get_backend(self.manifest.parsed_target.backend)
        self.wmap = read_map(self.folder, self.manifest)
        self.fed = self.backend.name in LIVE_BACKENDS and self.wmap is not None

    def prepare(self, loras: Loras) -> Plan:
        """The stack merged (raises on a bad file or an overflow, changing nothing)."""
        from enginefarm.runner.merge import merged_weights

        assert self.wmap is not None, "only fed components prepare"
        stacked = [(self._placed(parsed), strength) for parsed, strength in loras]
        merged = merged_weights(
            self.wmap, _CachedBase(self), self.folder, self.manifest, {}, stacked, every=False, stored=True
        )
        return Plan(merged, list(loras))

    def commit(self, plan: Plan, current):
        """The session with the plan's values: the open one, updated in place, when it takes every weight the plan
        changes as an input; else a new one, whose inputs cover both stacks."""
        if self._session is current and not current.closed and set(plan.values) <= self._inputs:
            self._fed.update({**self._bases(self._inputs - set(plan.values)), **plan.values})
            self._loras = plan.loras
            return current
        names = self._inputs | set(plan.values) if self._session is current else frozenset(plan.values)
        session = self._open({**self._bases(names - set(plan.values)), **plan.values}, plan.loras)
        current.close()
        return session

    def reopen(self, loras: Loras):
        """A session of this component with `loras` (at load, or after a memory budget closed it)."""
        if self._session is not None and not self._session.closed and _key(loras) == _key(self._loras):
            return self._session
        plan = self.prepare(loras)
        return self._open({**self._bases(self._inputs - set(plan.values)), **plan.values}, plan.loras)

    def _open(self, values: dict[str, np.ndarray], loras: Loras):
        from enginefarm.runner.live_weights import open_fed
        from enginefarm.runner.session import Session

        started = time.perf_counter()
        fed = open_fed(self.backend.name, self.folder, self.manifest, values)
        log.info(
            "%s: opened with %d weights as inputs in %.2f s", self.component, len(values), time.perf_counter() - started
        )
        shown = ", ".join(f"{f.name}@{s:g}" for f, s in loras) or "none"
        record = {"base": self.manifest.build_key, "fed": sorted(values)}  # the strengths change in place
        self._session = Session(
            fed,
            replace(self.manifest, options={**self.manifest.options, "stack": record}),
            f"{self.explanation}\nweights: LoRAs {shown}; {len(values)} weights fed as inputs, changed in place by "
            "set_loras",
        )
        self._inputs, self._loras, self._fed = frozenset(values), list(loras), fed
        return self._session

    def _placed(self, parsed: LoraFile) -> list:
        from enginefarm.runner.lora import place_lora

        if parsed.key not in self._layers:
            assert self.wmap is not None, "only fed components place layers"
            self._layers[parsed.key] = place_lora(parsed, self.wmap, self.component, ref=f"{self.manifest.ref}")
        return self._layers[parsed.key]

    def _bases(self, names) -> dict[str, np.ndarray]:
        return _CachedBase(self).read_weights(self.folder, self.manifest, sorted(names))


class _CachedBase:
    """The backend, as `merged_weights` reads base values from it, with the values kept by the component: a
    change of strength reads no weight from disk twice."""

    def __init__(self, live: LiveComponent) -> None:
        self._live = live

    def has(self, feature) -> bool:
        return self._live.backend.has(feature)

    def read_weights(self, artifact_dir, manifest, names) -> dict[str, np.ndarray]:
        kept = self._live._base
        missing = [n for n in names if n not in kept]
        if missing:
            from enginefarm.runner.merge import base_weights

            kept.update(base_weights(self._live.backend, artifact_dir, manifest, missing))
        return {n: kept[n] for n in names}
