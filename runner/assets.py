"""A model's assets folder (`MODEL/assets`: tokenizers and configs, or a filter's filter.json) from the store,
fetched and verified like any artifact, and held as in use so a concurrent `cache gc` leaves it alone."""

from __future__ import annotations

from pathlib import Path

from enginefarm.errors import ArtifactNotFoundError, ConfigError, UnknownModelError

from .request import Request


def fetch_assets(request: Request, progress, *, missing_hint: str) -> Path:
    """The assets folder of the request's model (its store, device and version; not its target or precision: one
    folder serves every engine). A typo'd name is UnknownModelError with "did you mean"; a model stored without
    assets is one ConfigError line with `missing_hint`."""
    from enginefarm.cache.device_cache import hold

    from .load import fetch

    asked = Request(f"{request.model}/assets", device=request.device, store=request.store, version=request.version)
    try:
        _, folder, _ = fetch(asked, progress=progress)
    except UnknownModelError as exc:  # a typo: its message lists the models the store holds
        hint = f"did you mean {exc.closest}?" if exc.closest else exc.hint
        raise UnknownModelError(exc.message, hint=hint, closest=exc.closest) from None
    except ArtifactNotFoundError as exc:
        raise ConfigError(f"{request.model} has no assets in the store ({exc})", hint=missing_hint) from None
    hold(folder)  # read after the engines load: no gc evicts it meanwhile (engines are read as they load)
    return folder
