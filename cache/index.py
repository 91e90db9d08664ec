"""The per-model index (`index/<model>.json`): what resolution needs to pick an artifact, one GET per model.

The index is store-side data, so it is checked at the edge: every entry becomes an `IndexEntry` or is skipped
with a warning that names it; one bad entry never hides the others. It is the one type resolution works on,
whether an entry comes from a store's index, the device cache or a signed release channel.

Updates are a compare-and-swap merge on every store (atomic replace under a lock locally, `If-Match` on S3):
each writer re-reads, merges its entries into what is there, and retries on conflict, so no writer's entry is
lost and none overwrites another's."""

from __future__ import annotations

import gc
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from . import fields as f
from .manifest import Target
from .records import NO_CONSTRAINTS, NO_VERDICT, Benchmark, Constraints, Verdict, benchmarks

if TYPE_CHECKING:
    from .manifest import Manifest
    from .stores.base import Store

log = logging.getLogger(__name__)

INDEX_FORMAT = 1
_CAS_ATTEMPTS = 20


@dataclass(frozen=True)
class IndexEntry:
    """One artifact as resolution sees it: what it is, what it needs, how fast it ran, how big it is."""

    build_key: str
    model: str
    component: str
    precision: str
    profile_name: str
    target: str
    profile: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    toolchain: dict[str, str] = field(default_factory=dict)
    constraints: Constraints = NO_CONSTRAINTS
    benchmarks: tuple[Benchmark, ...] = ()
    size: int = 0
    stored_size: int = 0
    created: str | None = None
    validation: Verdict = NO_VERDICT  # the current verdict
    model_version: str = ""  # the recipe's model.version ("" for artifacts indexed before versions were recorded)

    def __post_init__(self) -> None:
        """Records given in their stored form (a manifest's dicts) become typed ones."""
        if not isinstance(self.constraints, Constraints):
            object.__setattr__(self, "constraints", Constraints.from_dict(self.constraints))
        if not isinstance(self.validation, Verdict):
            object.__setattr__(self, "validation", Verdict.from_dict(self.validation))
        if any(not isinstance(b, Benchmark) for b in self.benchmarks):
            object.__setattr__(
                self,
                "benchmarks",
                tuple(b if isinstance(b, Benchmark) else Benchmark.from_dict(b) for b in self.benchmarks),
            )

    @cached_property
    def parsed_target(self) -> Target:
        """Parsed once per object (the text was checked when it was read from the store)."""
        return Target.parse(self.target)

    @property
    def label(self) -> str:
        return f"{self.target} {self.precision} [{self.build_key[:12]}]"

    def to_dict(self) -> dict[str, Any]:
        """The wire form, as stored in the index and signed in a channel's targets (the model is the index's)."""
        return {
            "build_key": self.build_key,
            "component": self.component,
            "precision": self.precision,
            "profile_name": self.profile_name,
            "profile": self.profile,
            "target": self.target,
            "toolchain": self.toolchain,
            "constraints": self.constraints.to_dict(),
            "benchmarks": [b.to_dict() for b in self.benchmarks],
            "size": self.size,
            "stored_size": self.stored_size,
            "created": self.created,
            "validation": self.validation.to_dict(),
            "model_version": self.model_version,
        }

    @property
    def failed_validation(self) -> bool:
        """A re-check against the recipe's current [validate] failed: stored, but no longer to be served."""
        return self.validation.failed

    @classmethod
    def of(cls, manifest: Manifest) -> IndexEntry:
        return cls(
            manifest.build_key,
            manifest.model,
            manifest.component,
            manifest.precision,
            manifest.profile_name,
            manifest.target,
            manifest.profile,
            manifest.toolchain,
            Constraints.from_dict(manifest.constraints),
            benchmarks(list(manifest.benchmarks), "benchmarks"),
            sum(x.size for x in manifest.files),
            sum(x.stored_size for x in manifest.files),
            manifest.provenance.get("created"),
            Verdict.from_dict(manifest.validation),
            manifest.model_version,
        )

    @classmethod
    def from_dict(cls, data: Any, model: str) -> IndexEntry:
        """Raises FieldError naming the first wrong field. Unknown fields are ignored (a newer writer's additions)."""
        data = f.mapping(data, "entry")
        target = f.text(data.get("target"), "target")
        try:
            Target.parse(target)
        except ValueError as exc:
            raise f.FieldError("target", str(exc)) from None
        return cls(
            build_key=f.text(data.get("build_key"), "build_key", pattern=f.HEX64),
            model=model,
            component=f.text(data.get("component"), "component"),
            precision=f.text(data.get("precision"), "precision"),
            profile_name=f.text(data.get("profile_name"), "profile_name"),
            target=target,
            profile=f.profile(data.get("profile", {}), "profile"),
            toolchain=f.text_map(data.get("toolchain", {}), "toolchain"),
            constraints=Constraints.from_dict(data.get("constraints", {})),
            benchmarks=benchmarks(data.get("benchmarks", []), "benchmarks"),
            size=f.integer(data.get("size", 0), "size"),
            stored_size=f.integer(data.get("stored_size", 0), "stored_size"),
            created=f.optional_text(data.get("created"), "created"),
            validation=Verdict.from_dict(data.get("validation", {})),
            model_version=f.optional_text(data.get("model_version"), "model_version") or "",
        )


@dataclass
class Index:
    model: str
    entries: dict[str, IndexEntry] = field(default_factory=dict)  # build key → entry
    skipped: list[str] = field(default_factory=list)  # why each bad entry was left out
    unreadable: str = ""  # why the whole index was unreadable ("is not JSON", …); empty if it was read

    def to_json(self) -> bytes:
        data = {
            "format": INDEX_FORMAT,
            "model": self.model,
            "entries": {k: e.to_dict() for k, e in sorted(self.entries.items())},
        }
        return json.dumps(data, indent=1, sort_keys=True).encode()


@contextmanager
def gc_paused() -> Iterator[None]:
    """Reading an index allocates a few containers per entry, none in a reference cycle; the cycle collector's
    passes, each walking every tracked object, made reading 10^5 entries three times slower. Paused meanwhile."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def parse_index(raw: bytes | None, model: str, where: str = "") -> Index:
    """The index's valid entries. A damaged index or entry is logged with its name and left out, never raised."""
    with gc_paused():
        return _parse_index(raw, model, where)


def _parse_index(raw: bytes | None, model: str, where: str) -> Index:
    index = Index(model)
    if raw is None:
        return index
    name = f"{where}index/{model}.json" if where else f"index of {model}"
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        log.warning("%s is not JSON; treating it as empty (run `enginefarm index --store URL` to rebuild it)", name)
        index.unreadable = "is not JSON"
        return index
    if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT or not isinstance(data.get("entries"), dict):
        log.warning(
            "%s has an unknown shape; treating it as empty (run `enginefarm index --store URL` to rebuild it)", name
        )
        index.unreadable = "is JSON of an unknown shape (not an enginefarm index of this format)"
        return index
    for key, value in data["entries"].items():
        try:
            entry = IndexEntry.from_dict(value, model)
            if entry.build_key != key:
                raise f.FieldError("build_key", f"is {entry.build_key[:12]}, but the entry is filed under {key[:12]}")
        except f.FieldError as exc:
            index.skipped.append(f"{name}: entry {str(key)[:16]}: {exc}")
            log.warning("skipping %s", index.skipped[-1])
            continue
        index.entries[key] = entry
    return index


def read_index(store: Store, model: str) -> Index:
    raw, _ = store.get_index_bytes(model)
    return parse_index(raw, model, f"{store.url}/")


def select_entries(store: Store, models=(), components=(), targets=(), precisions=(), keys=()) -> list[IndexEntry]:
    """Index entries matching every given filter (empty: any). Shared by `publish` and `release promote`."""
    from .manifest import target_matches

    selected = []
    for name in models or tuple(store.list_models()):
        for entry in read_index(store, name).entries.values():
            if (
                (not components or entry.component in components)
                and target_matches(entry.target, targets)
                and (not precisions or entry.precision in precisions)
                and (not keys or any(entry.build_key.startswith(k) for k in keys))
            ):
                selected.append(entry)
    return selected


def update_index(
    store: Store, manifests: Iterable[Manifest], *, replace_all: bool = False, verdicts: dict[str, dict] | None = None
) -> None:
    """Compare-and-swap the per-model index, merging with whatever a concurrent writer put there.

    A re-validation's verdict (an entry's `validation` with `revalidated`) is newer than the build's own record and is
    kept when the manifest is indexed again; `verdicts` (build key → record) sets it.
    Some servers' conditional writes are not atomic (two writers can both 'win'), so each write is read back:
    if our entries are not all there, merge again. An index that already holds exactly our entries is left
    alone, so re-running a publish rewrites nothing. A lost update in the end costs a rebuild, never an artifact."""
    verdicts = verdicts or {}
    by_model: dict[str, list[IndexEntry]] = {}
    for manifest in manifests:
        entry = IndexEntry.of(manifest)
        if manifest.build_key in verdicts:
            entry = replace(entry, validation=Verdict.from_dict(verdicts[manifest.build_key]))
        by_model.setdefault(manifest.model, []).append(entry)
    if replace_all:
        for model in store.list_models():
            by_model.setdefault(model, [])
    for model, ours in by_model.items():
        _merge_entries(store, model, ours, verdicts, fresh=replace_all)


def _merge_entries(store: Store, model: str, ours: list[IndexEntry], verdicts: dict[str, dict], *, fresh: bool) -> None:
    wanted: list[IndexEntry] = []  # ours as last merged: what the read-back must find

    def merge(index: Index) -> bool:
        wanted[:] = [_keep_recheck(e, index.entries.get(e.build_key), verdicts) for e in ours]
        if not fresh and all(index.entries.get(e.build_key) == e for e in wanted):
            return False
        index.entries.update({e.build_key: e for e in wanted})
        return True

    _swap_index(store, model, merge, lambda current: all(current.get(e.build_key) == e for e in wanted), fresh=fresh)


def _keep_recheck(entry: IndexEntry, present: IndexEntry | None, verdicts: dict[str, dict]) -> IndexEntry:
    """An entry about to be written keeps the verdict of a re-check already in the index, unless it brings its own."""
    if entry.build_key in verdicts or present is None or not present.validation.revalidated:
        return entry
    return replace(entry, validation=present.validation)


def remove_from_index(store: Store, model: str, keys: Iterable[str]) -> None:
    """Drop entries from a model's index: compare-and-swap, retried and read back like `update_index`."""
    unwanted = set(keys)

    def drop(index: Index) -> bool:
        if not unwanted & set(index.entries):
            return False
        index.entries = {k: e for k, e in index.entries.items() if k not in unwanted}
        return True

    _swap_index(store, model, drop, lambda current: not unwanted & set(current))


def _swap_index(
    store: Store,
    model: str,
    edit: Callable[[Index], bool],
    settled: Callable[[dict[str, IndexEntry]], bool],
    *,
    fresh: bool = False,
) -> None:
    """The compare-and-swap loop of every index writer: read the index (start from an empty one when `fresh`), let
    `edit` change it (False: nothing to write), write it only if nobody did since the read, and read it back until
    `settled` holds — some servers' conditional writes are not atomic (two writers can both 'win')."""
    for attempt in range(_CAS_ATTEMPTS):
        raw, etag = store.get_index_bytes(model)
        index = Index(model) if fresh else parse_index(raw, model, f"{store.url}/")
        if not edit(index):
            return
        if store.cas_index_bytes(model, index.to_json(), etag) and settled(read_index(store, model).entries):
            return
        import random  # here: only a writer that lost a race backs off; a load never does

        time.sleep(random.uniform(0, 0.05 * (attempt + 1)))
    log.warning("index of %s kept changing under us; run `enginefarm index --store %s`", model, store.url)
