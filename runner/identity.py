"""The artifact about to be loaded is the one that was asked for and ranked: request = index entry = manifest.

Resolution ranks index entries, but what is fetched and loaded is described by the manifest, and a store writes
both. A store whose index and manifests disagree (tampered, or mis-published) could otherwise serve any model
under any name, ranked by whatever numbers its index claims, and have it cached under the name the manifest gives.
So before anything is fetched (and again for what the cache holds), every field that identifies an artifact must
agree across the three."""

from __future__ import annotations

from enginefarm.cache.index import IndexEntry
from enginefarm.cache.manifest import Manifest
from enginefarm.errors import IntegrityError

_FIELDS = ("build_key", "model", "component", "model_version", "target", "precision")


def check_served(manifest: Manifest, entry: IndexEntry, ref: str, where: str) -> None:
    """Raise IntegrityError (one line, naming each disagreement) unless `manifest` is `entry`, and `entry` is `ref`."""
    model, _, component = ref.partition("/")
    wrong = []
    if (manifest.model, manifest.component) != (model, component):
        wrong.append(f"its manifest names {manifest.ref}, asked for {ref}")
    for name in _FIELDS:
        if wrong and name in ("model", "component"):
            continue  # said already: the index names what was asked for
        said, got = getattr(entry, name), getattr(manifest, name)
        if name == "model_version" and said == "":
            continue  # indexed before versions were recorded: the index says nothing to contradict
        if said != got:
            wrong.append(f"{name} {got!r} in the manifest, {said!r} in the index")
    if wrong:
        raise IntegrityError(
            f"{where} lists {entry.model}/{entry.component} [{entry.build_key[:12]}], but {'; '.join(wrong)}: "
            "refused, nothing was fetched",
            hint="the store's index and manifests disagree (tampered or mis-published store); report it to whoever "
            "publishes it, or load from another store",
            key=entry.build_key,
        )
