"""Re-validation without a rebuild: a stored artifact checked again against the recipe's current [validate].

The build key does not cover [validate] (changing a threshold must not rebuild an engine), so each validation
record carries the digest of the settings it ran under (`settings`). When the recipe's digest differs, `build`
re-checks the stored artifact instead of saying "exists", and `enginefarm validate` does so on demand. The verdict
is written once to the store (caches/validation/<build key>/<settings>.json) and into the model's index entry,
which resolution reads: an artifact that fails its current gate is no longer picked.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from enginefarm.backends import get_backend
from enginefarm.cache.artifacts import VERDICTS, record_verdict
from enginefarm.cache.device_cache import DeviceCache
from enginefarm.cache.manifest import Manifest
from enginefarm.cache.stores.base import Store

from .gate import validation_report
from .hostlock import building
from .job import Job


def revalidate(
    job: Job, store: Store, manifest: Manifest, workroot: Path, workdir: Path, step: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Fetch the stored artifact, run the gate with the current settings, record the verdict. Returns the report."""
    step = step or (lambda _msg: None)
    cache = DeviceCache(workdir / "fetched")  # a private cache: re-checking a farm's store does not fill the user's
    try:
        step("fetch")
        path = cache.fetch(store, manifest)  # verified as it is fetched
        step("validate")
        with building():  # CPU-heavy like a build: no benchmark runs beside it
            report = validation_report(job, get_backend(job.target.backend), path, manifest, workroot)
    finally:
        shutil.rmtree(workdir / "fetched", ignore_errors=True)
    report = {**report, "revalidated": datetime.now(UTC).isoformat(timespec="seconds")}
    record_verdict(
        store,
        replace(manifest, validation=report),
        f"{VERDICTS}/{manifest.build_key}/{report['settings']}.json",
        json.dumps(report, sort_keys=True).encode(),
    )
    return report
