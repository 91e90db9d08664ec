"""Why nothing loads: the one error `load` and `fetch` raise when no candidate did, naming the real cause (a refusal,
an unreadable index, what a filter left out, a yank, what each candidate lacked) with a hint that fits it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from enginefarm.cache.manifest import target_matches
from enginefarm.cache.versions import by_age
from enginefarm.errors import ArtifactNotFoundError, DiskFullError, UnknownModelError

if TYPE_CHECKING:
    from enginefarm.cache.trust.client import ChannelClient

    from .lookup import Lookup


def not_found(ref: str, found: Lookup, failures: list[str]) -> Exception:
    """The one error that says why nothing loads, with the hint that fits it."""
    full = [e for e in found.refusals if isinstance(e, DiskFullError)]
    if full:
        return full[0]  # the one failure the user can fix at once
    if found.refusals:
        return found.refusals[0]  # tampered, unsigned or replayed: that is the answer, not "nothing fits"
    if found.stack_refusals:
        return found.stack_refusals[0]  # an artifact fits but not with these weights: its own error has the fix
    candidates = found.resolution.candidates
    if found.unreadable_index and not candidates:
        return ArtifactNotFoundError(
            f"no artifact of {ref} can be listed: {found.unreadable_index}",
            hint="the store's index is damaged; whoever publishes the store can rebuild it with "
            "`enginefarm index --store URL`",
        )
    if found.release is not None and not failures and not any(c.usable for c in candidates):
        yanked = _yanked(ref, found, found.release)
        if yanked is not None:
            return yanked
    if found.filtered_out and not candidates:
        where = f"channel {found.release.channel}" if found.release is not None else "the store"
        have = ", ".join(sorted({f"{e.target} {e.precision}" for e in found.filtered_out}))
        return ArtifactNotFoundError(
            f"no artifact of {ref} in {where} is for --target {', '.join(found.selectors)}: there are {have}",
            hint="leave --target out to let the best one be picked, or name one of those",
        )
    if not candidates and not failures and found.store is not None and found.release is None:
        unknown = _unknown_model(ref, found.store)
        if unknown is not None:
            return unknown
    unusable = [c for c in candidates if c.reason]
    rejected = [f"{c.entry.label}: {c.reason}" for c in unusable]
    reasons = failures or rejected
    if len(reasons) > 10:  # an index may hold 10^5 entries: a one-line error names a few and counts the rest
        reasons = reasons[:10] + [f"and {len(reasons) - 10} more"]
    why = "; ".join(reasons or [found.note or "no stored artifact for it"])
    hint = (
        "build one with `enginefarm build RECIPE`, or pass a recipe (--recipe / ENGINEFARM_RECIPE_PATH) to compile here"
    )
    if (
        found.resolution.pinned is not None
        and not failures
        and all(c.reason.startswith("model version") for c in unusable)
    ):
        present = ", ".join(str(v) for v in by_age(c.version for c in unusable))
        return ArtifactNotFoundError(
            f"no artifact of {ref} has model version {found.resolution.pinned}",
            hint=f"versions stored: {present}; leave the version out for the newest",
        )
    if unusable and not failures and all(c.reason.startswith("no device here runs") for c in unusable):
        # what is stored is for other devices: building the same targets again would not help
        hint = (
            "build it for a target this device runs (`enginefarm doctor` lists them) with `enginefarm build RECIPE "
            "--target T`, or pass a recipe (--recipe / ENGINEFARM_RECIPE_PATH) to compile here"
        )
    return ArtifactNotFoundError(f"no artifact of {ref} fits this device: {why}", hint=hint)


def _yanked(ref: str, found: Lookup, release: ChannelClient) -> Exception | None:
    """ "Yanked", where what was withdrawn is what the caller asked for (component, --target, precision): not when a
    filter left out what is released, nor naming yanked artifacts the filters would have left out anyway."""
    model, _, component = ref.partition("/")
    precision = found.resolution.precision
    yanked = [
        y
        for y in release.yanked(model)
        if y.get("component") == component
        and target_matches(str(y.get("target")), found.selectors)
        and precision in (None, y.get("precision"))
    ]
    if not yanked:
        return None
    what = ", ".join(f"{y.get('target')} {y.get('precision')} [{str(y.get('build_key'))[:12]}]" for y in yanked)
    released = found.resolution.candidates
    if released:
        rest = "what else is released does not fit: " + "; ".join(f"{c.entry.label}: {c.reason}" for c in released[:10])
    elif found.filtered_out:
        rest = (
            f"what else is released is for other targets ({', '.join(sorted({e.target for e in found.filtered_out}))})"
        )
    else:
        rest = "nothing else of it is released"
    return ArtifactNotFoundError(
        f"{ref} was yanked from channel {release.channel}: {what}; {rest}",
        hint="its maintainers withdrew it; wait for a new release, or load from another channel",
    )


def _unknown_model(ref: str, store) -> Exception | None:
    """ "No model of that name", with the names the store holds and the closest one, when the model is not in the
    store at all (a typo is the likely cause, not a missing build); None when it is, or the store cannot list."""
    import difflib

    from enginefarm.errors import StoreError

    model, _, component = ref.partition("/")
    try:
        models = sorted(store.list_models())
    except (StoreError, OSError, NotImplementedError):
        return None
    if model in models:
        return None
    if not models:
        return None  # an empty store: nothing built yet, which the general message says
    close = difflib.get_close_matches(model, models, n=1, cutoff=0.6)
    shown = ", ".join(models[:10]) + (f" and {len(models) - 10} more" if len(models) > 10 else "")
    hint = f"did you mean {close[0]}{'/' + component if component else ''}?" if close else "use one of those names"
    return UnknownModelError(
        f"no model {model!r} in the store {store.url}; it holds {shown}",
        hint=hint,
        closest=close[0] if close else None,
    )
