"""The planner: recipes → jobs (component × precision × profile × target), each with its build key."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enginefarm.backends import (
    builds_on_cpu,
    get_backend,
    gpu_build_reason,
    job_availability,
    job_options,
    job_refusal,
    precision_refusal,
)
from enginefarm.backends.base import Availability
from enginefarm.cache.manifest import target_matches
from enginefarm.cache.stores.base import Store
from enginefarm.errors import BackendUnavailable, EnginefarmError, RecipeError
from enginefarm.formats.onnx_io import TensorInfo, io_of, load_header, opset_of

from .ci_runners import Runner, route, runner_labels
from .gate import stale
from .job import Job
from .memory import gb, job_need_bytes, source_weight_bytes, too_big_here
from .profiles import STATIC_PROFILE, is_static, resolve_profile
from .recipe import Recipe, Resources, ValidateSpec
from .sources import LocalSource, materialize

log = logging.getLogger(__name__)

__all__ = ["Job", "PlannedJob", "expand", "plan", "precision_here"]  # Job lives in job.py; importable here as before


@dataclass
class PlannedJob:
    job: Job
    availability: Availability
    key: str | None = None
    toolchain: dict[str, str] = field(default_factory=dict)
    built: bool = False
    stale_validation: bool = False  # built, but judged under other [validate] settings than the recipe's
    missing_blobs: int = 0  # its manifest is stored but names blobs the store lost: `build` repairs it
    runs_on: list[str] = field(default_factory=list)  # filled at plan time: the farm's runner, or the backend's labels
    unroutable: str = ""  # why no runner of the farm can build it (only with a runners file)
    # "refused: why; fix": the SDK would refuse it on any host, or the device class cannot compute in its precision
    refused: str = ""

    @property
    def status(self) -> str:
        if self.built:
            return "built, to re-validate ([validate] changed)" if self.stale_validation else "built"
        if self.missing_blobs:
            return f"stored, but {self.missing_blobs} blob(s) missing: to repair (`enginefarm build` rebuilds it)"
        if self.refused:
            return self.refused
        if self.unroutable:
            return self.unroutable
        if not self.availability.can_build:
            where = f"; needs a runner with {', '.join(self.runs_on)}" if self.runs_on else ""
            return f"unavailable here: {self.availability.reason}{where}"
        too_big = too_big_here(job_need_bytes(self.job))
        if too_big:
            return f"not here: {too_big}"
        if not self.availability.can_load:
            return f"to build here ({self.availability.reason})"
        return "to build"

    def to_dict(self) -> dict[str, Any]:
        job = self.job
        return {
            "id": job.id,
            "key": self.key,
            "model": job.model,
            "component": job.component,
            "precision": job.precision,
            "profile": job.profile_name,
            "target": str(job.target),
            "recipe": str(job.recipe_path),
            "status": self.status,
            "runs_on": self.runs_on,
            "memory_gb": gb(job_need_bytes(job)),
        }


def expand(recipe: Recipe, downloads: Path, *, offline: bool = False) -> list[Job]:
    jobs: list[Job] = []
    for comp in recipe.components.values():
        key = f"components.{comp.name}"
        try:
            source = materialize(comp.source, downloads, offline=offline)
        except EnginefarmError as exc:
            raise RecipeError(recipe.path, f"{key}.source", str(exc), hint=exc.hint) from None
        try:
            header = load_header(source.path)
        except EnginefarmError as exc:
            raise RecipeError(recipe.path, f"{key}.source", str(exc), hint=exc.hint) from None
        inputs, outputs = io_of(header)
        weights = source_weight_bytes(source.path)
        checkpoint = _checkpoint(recipe, comp.checkpoint, f"{key}.checkpoint") if comp.checkpoint else None
        _check_validate_inputs(recipe, comp.validate, inputs, f"{key}.validate.inputs")
        if comp.profiles:
            profiles = {
                name: resolve_profile(spec, inputs, recipe.path, f"{key}.profiles.{name}")
                for name, spec in comp.profiles.items()
            }
        elif is_static(inputs):
            profiles = {STATIC_PROFILE: resolve_profile(None, inputs, recipe.path, f"{key}.profiles")}
        else:
            resolve_profile(None, inputs, recipe.path, f"{key}.profiles.default")  # raises, naming the dynamic axis
            raise AssertionError("unreachable")
        if comp.validate.samples is not None:
            _check_samples(recipe, comp.validate.samples, inputs, profiles, f"{key}.validate.samples")
        if comp.fp16_keep_fp32:
            _check_keep(recipe, comp.fp16_keep_fp32, header, f"{key}.fp16_keep_fp32")
        for precision in comp.precisions:
            for profile_name, profile in profiles.items():
                for target in comp.targets:
                    if any(rule.covers(target, precision) for rule in comp.exclude):
                        continue
                    jobs.append(
                        Job(
                            recipe.path,
                            recipe.digest,
                            recipe.name,
                            recipe.version,
                            comp.name,
                            precision,
                            profile_name,
                            profile,
                            target,
                            comp.source.url,
                            source,
                            tuple(inputs),
                            tuple(outputs),
                            opset_of(header),
                            comp.validate,
                            comp.resources,
                            job_options(target, comp.options),
                            checkpoint,
                            comp.fp16_keep_fp32,
                            weights,
                        )
                    )
    return jobs


def _checkpoint(recipe: Recipe, path: Path, key: str) -> LocalSource:
    from enginefarm.cache.atomic import sha256_file
    from enginefarm.formats.safetensors_io import SafeTensors

    try:
        SafeTensors(path)  # a malformed header fails the plan, not the build
    except EnginefarmError as exc:
        raise RecipeError(recipe.path, key, str(exc), hint=exc.hint) from None
    return LocalSource(path, sha256_file(path))


def _check_keep(recipe: Recipe, keep: tuple[str, ...], header, key: str) -> None:
    """An op type or node name that is not in the model is a typo: it would keep nothing fp32."""
    present = {n.op_type for n in header.graph.node} | {n.name for n in header.graph.node if n.name}
    present |= {f"input:{i.name}" for i in header.graph.input}  # an input path (fp16_rules.input_path)
    unknown = [
        k
        for k in keep
        if k not in present and not (k.endswith("/") and any(n.name.startswith(k) for n in header.graph.node))
    ]
    if unknown:
        ops = sorted({n.op_type for n in header.graph.node})
        raise RecipeError(
            recipe.path,
            key,
            f"the model has no op or node named {', '.join(map(repr, unknown))}",
            hint=f"op types in the model: {', '.join(ops[:30])}{', …' if len(ops) > 30 else ''}",
        )


def _check_validate_inputs(recipe: Recipe, spec: ValidateSpec, inputs: list[TensorInfo], key: str) -> None:
    names = {t.name for t in inputs}
    for name in spec.inputs:
        if name not in names:
            raise RecipeError(
                recipe.path,
                f"{key}.{name}",
                f"the model has no input {name!r}",
                hint=f"model inputs: {', '.join(sorted(names))}",
            )


def plan(
    recipes: list[Recipe],
    downloads: Path,
    *,
    store: Store | None = None,
    targets: tuple[str, ...] = (),
    precisions: tuple[str, ...] = (),
    components: tuple[str, ...] = (),
    job_ids: tuple[str, ...] = (),
    offline: bool = False,
    runners: list[Runner] | None = None,
    runner_labels_filter: tuple[str, ...] = (),
) -> list[PlannedJob]:
    jobs = [job for recipe in recipes for job in expand(recipe, downloads, offline=offline)]
    selected = [
        job
        for job in jobs
        if target_matches(str(job.target), targets)
        and (not precisions or job.precision in precisions)
        and (not components or job.component in components)
        and (not job_ids or job.id in job_ids)
    ]
    if not selected:
        asked = ", ".join(
            f"{n}={'/'.join(v)}"
            for n, v in (("target", targets), ("precision", precisions), ("component", components), ("job", job_ids))
            if v
        )
        offers = {
            "targets": {str(j.target) for j in jobs},
            "precisions": {j.precision for j in jobs},
            "components": {j.component for j in jobs},
        }
        wanted = [
            name
            for name, given in (("targets", targets), ("precisions", precisions), ("components", components))
            if given
        ] or ["targets"]
        hint = "; ".join(f"the recipes offer {name}: {', '.join(sorted(offers[name]))}" for name in wanted)
        if job_ids:
            hint = "; ".join(
                filter(
                    None,
                    [hint if targets or precisions or components else "", "`enginefarm plan RECIPE` lists the job ids"],
                )
            )
        raise EnginefarmError(f"no jobs match {asked or 'the recipes'}", hint=hint)
    planned: list[PlannedJob] = []
    indexes: dict[str, dict] = {}
    for job in selected:
        entry = PlannedJob(job, job_availability(job))
        precision_why = precision_refusal(job.target, job.precision)
        refusal = None if precision_why else job_refusal(job)  # job_refusal may read the model: only when still needed
        if precision_why:
            entry.refused = f"refused: {precision_why}"
            entry.availability = Availability.missing(precision_why)
        elif refusal is not None:
            entry.refused = f"refused: {refusal[0]}; {refusal[1]}"
        elif entry.availability.can_build:
            not_here = precision_here(job)
            if not_here:
                entry.availability = Availability.missing(not_here)
        if entry.availability.can_build:
            try:
                entry.toolchain = job.toolchain()
                entry.key = job.build_key
            except BackendUnavailable as exc:
                entry.availability = Availability.missing(str(exc))
            except ImportError as exc:
                entry.availability = Availability.missing(f"missing {exc.name} (pip install 'enginefarm[build]')")
        if entry.key and store is not None:
            entry.built, entry.stale_validation, entry.missing_blobs = _stored_state(store, job, entry.key, indexes)
        if runners is not None:
            runner, why = route(
                str(job.target),
                Resources(job_need_bytes(job) / 1e9, job.resources.gpu_vram_gb),
                runners,
                on_cpu=builds_on_cpu(job),
                gpu_needed=gpu_build_reason(job),
            )
            entry.runs_on, entry.unroutable = (list(runner.labels), "") if runner else ([], why)
        else:
            entry.runs_on = runner_labels(job.target, builds_on_cpu(job))
        if runner_labels_filter and not (entry.runs_on and set(entry.runs_on) <= set(runner_labels_filter)):
            continue
        planned.append(entry)
    return planned


def precision_here(job: Job) -> str | None:
    """Why this host cannot build and validate the job's precision although its device class runs it (OpenVINO bf16
    on a CPU without bf16 instructions would compute, and be validated, in fp32)."""
    return get_backend(job.target.backend).precision_here(job.precision, job.target.device)


def _stored_state(store: Store, job: Job, key: str, indexes: dict[str, dict]) -> tuple[bool, bool, int]:
    """(built, validated under other settings than the recipe's now, blobs its manifest names that the store lost).
    A key the index does not list is looked up directly (an index can lag its manifests); a stored manifest whose
    blobs are gone is not built: `build` repairs it."""
    from enginefarm.cache.artifacts import missing_blobs, read_index, read_manifest

    if job.model not in indexes:
        indexes[job.model] = read_index(store, job.model).entries
    entry = indexes[job.model].get(key)
    try:
        manifest = read_manifest(store, key)
    except EnginefarmError:
        return True, False, 0  # unreadable: never rebuilt over; `enginefarm index` and `gc` say why
    if manifest is None:
        return False, False, 0
    lost = len(missing_blobs(store, manifest))
    if lost:
        return False, False, lost
    return True, stale(job, entry if entry is not None and entry.validation else None, manifest), 0


def _check_samples(recipe: Recipe, path: Path, inputs: list[TensorInfo], profiles: dict, key: str) -> None:
    """Samples run as one more validation case of every job: a wrong name or shape fails the plan, not the build
    (where it would read as an artifact that does not run)."""
    from .sample_files import SampleError, npz_shapes

    try:
        shapes = {name: list(shape) for name, shape in npz_shapes(path).items()}
    except SampleError as exc:
        raise RecipeError(
            recipe.path, key, f"cannot read {path.name}: {exc}", hint="save it with numpy.savez(path, NAME=array, ...)"
        ) from None
    names = [t.name for t in inputs]
    if sorted(shapes) != sorted(names):
        raise RecipeError(
            recipe.path,
            key,
            f"{path.name} holds {sorted(shapes)}, the model's inputs are {sorted(names)}",
            hint="one array per model input, named as the input",
        )
    for profile_name, profile in profiles.items():
        for name, shape in shapes.items():
            low, high = profile[name]["min"], profile[name]["max"]
            if len(shape) != len(low) or any(not lo <= d <= hi for d, lo, hi in zip(shape, low, high, strict=True)):
                raise RecipeError(
                    recipe.path,
                    key,
                    f"{name} has shape {shape}, outside profile {profile_name!r} ({low} .. {high})",
                    hint="give samples that fit every profile of the component",
                )
