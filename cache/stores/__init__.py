"""Stores: where artifacts live. One registry table maps a URL scheme to its module and install hint."""

from __future__ import annotations

import importlib
from pathlib import Path

from enginefarm.errors import StoreError, StoreNotFound

from .base import Store

# scheme → (dotted path of the Store class, install hint). The only store registry.
STORES: dict[str, tuple[str, str | None]] = {
    "file": ("enginefarm.cache.stores.local:LocalStore", None),
    "s3": ("enginefarm.cache.stores.s3:S3Store", "pip install 'enginefarm[s3]'"),
    "http": ("enginefarm.cache.stores.http:HttpStore", None),
    "https": ("enginefarm.cache.stores.http:HttpStore", None),
}


def scheme_of(url: str) -> str:
    head, sep, _ = url.partition("://")
    if not sep or len(head) == 1:  # "C://" on Windows is a path, not a scheme
        return "file"
    return head.lower()


def open_store(url: str | Path, *, must_exist: bool = False) -> Store:
    """`must_exist`: a local store path that is not there is a StoreNotFound (the user named it: likely a typo),
    not an empty store (which the default store is before its first build)."""
    url = str(url)
    scheme = scheme_of(url)
    if scheme not in STORES:
        raise StoreError(f"unknown store scheme {scheme!r} in {url}", hint=f"use one of: {', '.join(STORES)}")
    dotted, hint = STORES[scheme]
    module_name, _, class_name = dotted.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise StoreError(
            f"the {scheme}:// store is not available in this version ({exc.name} missing)",
            hint=hint or "the local store (a directory path) works everywhere",
        ) from None
    store = getattr(module, class_name)(url)
    root = getattr(store, "root", None)
    if must_exist and root is not None and not Path(root).is_dir():
        raise StoreNotFound(
            f"no store at {root}",
            hint="check the path (--store / ENGINEFARM_STORE); `enginefarm build RECIPE --store PATH` creates one",
        )
    return store


def missing_local_root(store: Store) -> Path | None:
    """The folder of a local store that does not exist yet (an empty store until a build creates it), else None."""
    root = getattr(store, "root", None)
    return None if root is None or Path(root).is_dir() else Path(root)


__all__ = ["STORES", "Store", "missing_local_root", "open_store", "scheme_of"]
