"""`enginefarm.models(store=...)`: what an app shows before a user clicks download. Each model in the store, with
its family, its versions, the targets it is built for and the bytes this device would download to run it, from the
store's index alone (no manifest or blob is read).

The family is not written in the index: it is recognised from the components' ONNX inputs as the index records
them (each profile's shapes), against the families table; models whose inputs two families share (SD 2.x's
epsilon and v-prediction UNets) name both. The download size is, per component, the artifact `load` would pick on
this device's newest usable version (runner/resolve.py), stored bytes; components nothing here can run are named."""

from __future__ import annotations

from dataclasses import dataclass, field

from enginefarm.cache.index import IndexEntry, read_index
from enginefarm.cache.versions import version_key


@dataclass(frozen=True)
class ModelSummary:
    name: str
    family: str  # a families table id, "a | b" when the index cannot tell them apart, "" when none matches
    versions: tuple[str, ...]  # newest first
    components: tuple[str, ...]
    targets: tuple[str, ...]  # every target some artifact is built for
    download_bytes: int  # what this device downloads to run every component it can (stored sizes)
    runs_here: bool  # every component has an artifact this device can load
    missing: tuple[str, ...] = field(default=())  # components with nothing usable here

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "family": self.family,
            "versions": list(self.versions),
            "components": list(self.components),
            "targets": list(self.targets),
            "download_bytes": self.download_bytes,
            "runs_here": self.runs_here,
            "missing": list(self.missing),
        }


def models(store: str | None = None, device: str = "auto", *, devices=None) -> list[ModelSummary]:
    """Every model in `store` (default: the configured one), read from its index. `device`: as `load` takes it;
    `devices`: the devices to judge by instead of detecting them (tests, other machines)."""
    from enginefarm.cli_options import open_store_to_read
    from enginefarm.settings import load_settings

    settings = load_settings()
    opened = open_store_to_read(store, settings)
    out = []
    for name in sorted(opened.list_models()):
        entries = [e for e in read_index(opened, name).entries.values() if e.validation.passed is not False]
        if entries:
            out.append(summarize(name, entries, device, devices, settings))
    return out


def summarize(name: str, entries: list[IndexEntry], device="auto", devices=None, settings=None) -> ModelSummary:
    """One model's summary from its index entries."""
    from .detect import detect
    from .load import probes_for
    from .resolve import resolve

    if devices is None:
        devices = detect(device, probes_for([(e, "store") for e in entries]), settings)
    components = sorted({e.component for e in entries})
    total, missing = 0, []
    for component in components:
        own = [(e, "store") for e in entries if e.component == component]
        ranked = resolve(f"{name}/{component}", own, None, devices).ranked
        if ranked:
            total += ranked[0].entry.stored_size or ranked[0].entry.size
        else:
            missing.append(component)
    return ModelSummary(
        name=name,
        family=family_of(entries),
        versions=tuple(sorted({e.model_version for e in entries if e.model_version}, key=version_key, reverse=True)),
        components=tuple(components),
        targets=tuple(sorted({e.target for e in entries})),
        download_bytes=total,
        runs_here=not missing,
        missing=tuple(missing),
    )


def family_of(entries: list[IndexEntry]) -> str:
    """The families whose components' inputs match what the index records: every input of each built component the
    family has, present in its profile, with the family's fixed dims (its real models' sizes), else by name and rank."""
    from enginefarm.families import FAMILIES

    shapes: dict[str, dict[str, list[int]]] = {}
    for e in entries:
        for input_name, spec in e.profile.items():
            if spec.get("max"):
                shapes.setdefault(e.component, {})[input_name] = spec["max"]
    built = [c for c in shapes if c != "assets"]
    candidates = [f for f in FAMILIES.values() if built and set(built) <= {c.name for c in f.components}]
    # At the family's real sizes first; a narrow model (a test's, a distilled one) by its input names and ranks alone.
    for sized in (True, False):
        found = [f.id for f in candidates if all(_inputs_match(f, f.component(c), shapes[c], sized) for c in built)]
        if found:  # the families with the fewest components left unbuilt (SD 1.x before SD 1.x with a ControlNet)
            extra = {
                f: len({c.name for c in FAMILIES[f].components} - set(built) - set(FAMILIES[f].optional)) for f in found
            }
            return " | ".join(f for f in found if extra[f] == min(extra.values()))
    return ""


def _inputs_match(family, component, shapes: dict[str, list[int]], sized: bool = True) -> bool:
    for tensor in component.inputs:
        shape = shapes.get(tensor.name)
        if shape is None:
            if tensor.name in ("attention_mask",):  # optional inputs an export may leave out
                continue
            return False
        if len(shape) != len(tensor.shape):
            return False
        if not sized:
            continue
        for dim, got in zip(tensor.shape, shape, strict=True):
            fixed = dim if isinstance(dim, int) else getattr(family.sizes, dim, None)
            if isinstance(fixed, int) and fixed != got:
                return False
    return True
