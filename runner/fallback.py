"""On-device compile: when no stored artifact fits, build one here through the same builder code, and cache it."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from enginefarm.backends import job_availability, job_refusal, precision_refusal, rank_of
from enginefarm.builder.build import compile_artifact, job_workdir
from enginefarm.builder.planner import Job, expand, precision_here
from enginefarm.builder.recipe import Recipe, load_recipe
from enginefarm.builder.workcache import prune, source_folder
from enginefarm.cache import precision_table
from enginefarm.cache.device_cache import DeviceCache
from enginefarm.cache.manifest import Manifest
from enginefarm.errors import ArtifactNotFoundError, EnginefarmError
from enginefarm.hardware.devices import Device

log = logging.getLogger(__name__)


def find_recipe(model: str, recipe: str | Path | None, search: tuple[Path, ...]) -> Recipe | None:
    if recipe is not None:
        return load_recipe(recipe)
    for folder in search:
        for path in sorted(Path(folder).glob("*.toml")) if Path(folder).is_dir() else [Path(folder)]:
            try:
                candidate = load_recipe(path)
            except EnginefarmError:
                continue
            if candidate.name == model:
                return candidate
    return None


def pick_job(
    recipe: Recipe,
    component: str,
    precision: str | None,
    devices: list[Device],
    downloads: Path,
    offline: bool,
    target: str | None = None,
) -> Job:
    if component not in recipe.components:
        raise ArtifactNotFoundError(
            f"recipe {recipe.path} has no component {component!r}", hint=f"components: {', '.join(recipe.components)}"
        )
    local = replace(recipe, components={component: recipe.components[component]})
    runnable = {t for d in devices for t in d.targets}
    jobs = [
        j
        for j in expand(local, downloads, offline=offline)
        if str(j.target) in runnable and (precision is None or j.precision == precision)
    ]
    # Cheap checks first: job_refusal may read the model.
    jobs = [
        j
        for j in jobs
        if (target is None or j.target.matches(target))
        and not precision_refusal(j.target, j.precision)
        and not precision_here(j)
        and job_availability(j).can_build
        and job_refusal(j) is None
    ]  # bf16 only where it computes
    if not jobs:
        raise ArtifactNotFoundError(
            f"nothing stored fits {recipe.name}/{component}, and its recipe has no target this device can build",
            hint=f"this device runs: {', '.join(sorted(runnable))}",
        )
    order = {d.kind: i for i, d in enumerate(devices)}
    device_rank = {t: order[d.kind] for d in devices for t in d.targets}
    # Prefer the first device, then the most specific backend, then the table's tie order (fp32 first: safer numerics
    # when unbenchmarked).
    return min(
        jobs,
        key=lambda j: (device_rank.get(str(j.target), 99), rank_of(j.target), precision_table.tie_order(j.precision)),
    )


def compile_on_device(job: Job, cache: DeviceCache, step: Callable[[str], None]) -> Manifest:
    existing = cache.manifest(job.build_key)
    if (
        existing is not None and cache.built_here_dir(job.build_key) is not None
    ):  # not a store's artifact claiming this key
        return existing
    log.info("compiling %s on this device", job.label)
    workroot = cache.home / "build"
    try:
        manifest, outdir = compile_artifact(job, workroot, bench=False, step=step)
        cache.add_local(replace(manifest, provenance={**manifest.provenance, "built_on_device": True}), outdir)
        # On a user's device the prepared models (GBs for a UNet) serve nothing once the artifact is cached.
        shutil.rmtree(source_folder(workroot, job.source.digest), ignore_errors=True)
    finally:  # only this process's folder: another build may be using the same ENGINEFARM_HOME
        shutil.rmtree(job_workdir(workroot, job.build_key), ignore_errors=True)
        prune(workroot)
    return cache.manifest_in_use(manifest.build_key)
