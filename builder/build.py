"""One job, end to end: prep → backend build → validate → benchmark → pack → publish.

`build()` checks, hashes and logs; each backend's module does the SDK work. A failed validation never publishes.
Each stage's time and peak memory are measured where the work happens (stages.py) and reported with the job.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from enginefarm.backends import Feature, get_backend, job_refusal
from enginefarm.cache import precision_table
from enginefarm.cache.artifacts import heal_index, missing_blobs, pack_files, publish, read_index, read_manifest
from enginefarm.cache.atomic import sha256_file
from enginefarm.cache.manifest import ArtifactFile, Manifest
from enginefarm.cache.progress import ProgressLike
from enginefarm.cache.space import disk_full, is_full
from enginefarm.cache.stores.base import Store
from enginefarm.cache.workdirs import own
from enginefarm.errors import BuildError, EnginefarmError, ValidationFailed

from .bench import measure_in_subprocess
from .gate import stale, thresholds, validation_report
from .golden_samples import attach as attach_golden
from .hostlock import building
from .job import Job
from .memory import job_need_bytes
from .oom import asked_bytes, out_of_memory
from .prep import prepare
from .references import reference_outputs_cached
from .revalidate import revalidate
from .sdk_errors import sdk_text
from .stages import Stages
from .validate import sample_cases
from .weight_map_step import attach as attach_weight_map
from .workcache import source_folder

log = logging.getLogger(__name__)

Step = Callable[[str], None]


@dataclass
class BuildResult:
    job_id: str
    label: str
    key: str | None
    status: str  # built | exists | revalidated | missing | failed
    reason: str = ""
    seconds: float = 0.0
    manifest: Manifest | None = None
    what: dict[str, str] = field(default_factory=dict)  # model, component, precision, profile, target: for reports
    stages: list[dict[str, Any]] = field(default_factory=list)  # time and peak memory per stage (stages.py)
    detail: str = ""  # the SDK's own traceback behind a failure, for `-v` and the report
    planned_mb: float | None = None  # what the plan said the job needs (memory.job_need_bytes), beside its peak

    @classmethod
    def of(
        cls,
        job: Job,
        key: str | None,
        status: str,
        reason: str = "",
        seconds: float = 0.0,
        manifest: Manifest | None = None,
        stages: Stages | None = None,
    ) -> BuildResult:
        what = {
            "model": job.model,
            "component": job.component,
            "precision": job.precision,
            "profile": job.profile_name,
            "target": str(job.target),
        }
        records = list(stages.records) if stages else []
        planned = round(job_need_bytes(job) / 2**20, 1)
        return cls(job.id, job.label, key, status, reason, seconds, manifest, what, records, planned_mb=planned)

    @property
    def peak_rss_mb(self) -> float | None:
        return max((s["peak_rss_mb"] for s in self.stages), default=None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job_id,
            "label": self.label,
            "key": self.key,
            "status": self.status,
            "reason": self.reason,
            "seconds": round(self.seconds, 2),
            **self.what,
            "peak_rss_mb": self.peak_rss_mb,
            "planned_mb": self.planned_mb,
            "stages": self.stages,
            **({"detail": self.detail} if self.detail else {}),
        }


def repair(store: Store, stored: Manifest, rebuilt: Manifest, blobs: dict[str, Path], lost: list[str]) -> str:
    """A stored manifest names blobs the store lost (a `gc` that raced an older publish, a person): upload the
    rebuilt ones. A build whose bytes differ from the stored ones (not every SDK is reproducible) cannot restore
    them: the broken manifest, which nothing can load, is replaced by the rebuilt one. Returns the build's note."""
    if all(digest in blobs for digest in lost):
        return f"repaired: {len(lost)} missing blob(s) uploaded again"
    log.warning(
        "%s [%s]: the rebuild's bytes differ from the stored manifest's, whose blobs are lost; replacing that manifest",
        stored.ref,
        stored.build_key[:12],
    )
    store.delete_manifest(stored.build_key)
    return (
        f"repaired: rebuilt ({len(lost)} blob(s) of the stored manifest were missing, and the rebuild's bytes differ)"
    )


def compile_artifact(
    job: Job,
    workroot: Path,
    *,
    bench: bool = True,
    step: Step | None = None,
    store: Store | None = None,
    stages: Stages | None = None,
) -> tuple[Manifest, Path]:
    """Build, validate and (optionally) benchmark one job. Returns an unpacked manifest and the artifact folder.

    `store`, when given, lends backends that keep shared build caches (TensorRT's timing cache) their
    `before_build(store, job, outdir)` / `after_build(store, job, outdir)` hooks. `stages` receives each stage's
    time and peak memory (the manifest's provenance keeps them too).
    Raises ValidationFailed if the artifact misses the reference, BuildError if the backend fails."""
    step = step or (lambda _msg: None)
    stages = stages if stages is not None else Stages()
    backend = get_backend(job.target.backend)
    refusal = job_refusal(job)  # `plan` leaves such jobs out; a caller that did not plan learns why here
    if refusal is not None:
        raise BuildError(f"{job.label}: {refusal[0]}", hint=refusal[1])
    toolchain = job.toolchain()
    key = job.build_key
    workdir = job_workdir(workroot, key)
    shutil.rmtree(workdir, ignore_errors=True)
    outdir = workdir / "artifact"
    outdir.mkdir(parents=True)

    with building(say=step):  # a wait for another process's benchmark is said on the job's line
        manifest = _built_and_validated(job, backend, toolchain, key, outdir, workroot, step, store, stages)
    here = backend.available(job.target.device) if bench else None
    if here is not None and not here.can_load:  # resolution then ranks it by kind, as for --no-bench
        manifest = replace(manifest, provenance={**manifest.provenance, "benchmark": f"skipped: {here.reason}"})
    elif bench:
        step("benchmark")
        manifest_path = workdir / "draft-manifest.json"
        manifest_path.write_bytes(manifest.to_json())
        opt_feeds = dict(sample_cases(job.inputs, job.profile, job.validate)[1][1])
        with stages.stage("benchmark") as probe:
            try:
                measured = measure_in_subprocess(outdir, manifest_path, opt_feeds, workdir)
            except BuildError as exc:  # a crash while benchmarking fails this job like a crash while building
                raise BuildError(f"{job.label}: {exc}", hint=exc.hint) from None
            probe.subprocess(int(measured.get("peak_rss_mb", 0) * 2**20))
        manifest = replace(manifest, benchmarks=(measured,))
    manifest = replace(
        manifest, provenance={**manifest.provenance, "stages": stages.records, "peak_rss_mb": stages.peak_rss_mb}
    )
    return manifest, outdir


def _built_and_validated(
    job: Job,
    backend,
    toolchain: dict[str, str],
    key: str,
    outdir: Path,
    workroot: Path,
    step: Step,
    store: Store | None,
    stages: Stages,
) -> Manifest:
    """Prep, build and validate (the part that shares the host with other builds; benchmarks wait for it)."""
    step("prep")
    # Prepared models and reference outputs are reused across jobs, per source and prep toolchain (workcache.py).
    folder = source_folder(workroot, job.source.digest)
    with stages.stage("prep"):
        prepared = prepare(
            job.source.path,
            job.onnx_precision(),
            folder,
            job.fp16_keep if precision_table.reduced(job.onnx_precision()) else (),
        )
    step(f"build {job.target}")
    _build_cache(backend, backend.before_build, "fetching the build cache", store, job, outdir)
    with stages.stage("compile") as probe:
        started = time.perf_counter()
        try:
            built = backend.build(prepared.path, job, outdir)
        except EnginefarmError:
            raise
        except Exception as exc:  # an SDK failure is the job's failure, not the farm's
            asked = asked_bytes(f"{type(exc).__name__}: {exc}")
            if asked is not None:
                raise out_of_memory(job, f"{job.target.backend}'s build", asked) from exc
            raise BuildError(f"{job.label}: {job.target.backend} failed: {sdk_text(exc, workroot)}") from exc
        build_s = time.perf_counter() - started
        build_notes = built.notes
        probe.subprocess(
            int(build_notes.get("build_process_peak_rss_mb", 0) * 2**20)
        )  # backends that build in a subprocess
    _build_cache(backend, backend.after_build, "publishing the build cache", store, job, outdir)
    for item in built.files:
        if not (outdir / item.path).is_file():
            raise BuildError(f"{job.label}: backend reported {item.path} but did not write it")

    manifest = Manifest(
        build_key=key,
        model=job.model,
        model_version=job.model_version,
        component=job.component,
        precision=job.precision,
        profile_name=job.profile_name,
        profile=job.profile,
        target=str(job.target),
        toolchain=toolchain,
        files=tuple(plain_file(outdir, item.path, item.role) for item in built.files),
        io={"inputs": [t.to_dict() for t in job.inputs], "outputs": [t.to_dict() for t in job.outputs]},
        constraints=backend.constraints(job),
        options=dict(job.options),
        provenance={
            "recipe": str(job.recipe_path),
            "recipe_digest": job.recipe_digest,
            "source": job.source_url,
            "source_digest": job.source.digest,
            "git_commit": _git_commit(job.recipe_path.parent),
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "prep_notes": prepared.notes,
            "build_seconds": round(build_s, 2),
            "build_notes": build_notes,
        },
    )

    if job.checkpoint is not None:
        step("weight map")
        with stages.stage("weight map"):
            fp32 = (
                prepared
                if job.onnx_precision() == precision_table.REFERENCE
                else prepare(job.source.path, precision_table.REFERENCE, prepared.path.parent)
            )
            manifest = attach_weight_map(
                manifest, outdir, backend, job.checkpoint.path, job.checkpoint.digest, fp32.path
            )

    step("validate")
    report = validation_report(job, backend, outdir, manifest, workroot, stages)
    if report["executed"] is False:  # published unvalidated: the first device that runs it checks it (golden.py)
        step("golden samples")
        cases = sample_cases(job.inputs, job.profile, job.validate)
        with stages.stage("golden samples") as probe:
            references = reference_outputs_cached(job.source.path, cases, folder, probe)
            manifest, report["golden"] = attach_golden(manifest, outdir, cases, list(references), thresholds(job))
    manifest = replace(manifest, validation=report)
    if report["passed"] is False:
        raise ValidationFailed(
            f"{job.label}: validation failed: {report['failure']}", key=key, report=report, hint=report["hint"] or None
        )
    return manifest


# Why a job found its artifact stored: the caller plans before building, so another builder published it since.
MEANWHILE = "published by another builder meanwhile"


def build(
    job: Job,
    store: Store,
    workroot: Path,
    *,
    bench: bool = True,
    step: Step | None = None,
    progress: ProgressLike = None,
    validate_only: bool = False,
) -> BuildResult:
    """Build one job into `store` unless its key is already there; a stored artifact judged under other [validate]
    settings is re-validated instead. `validate_only`: re-validate what is stored, build nothing.
    `progress` receives the upload's bytes."""
    started = time.perf_counter()
    key = None
    stages = Stages()
    now = ["plan"]  # the step under way, for a failure nobody foresaw

    def tell(name: str) -> None:
        now[0] = name
        if step:
            step(name)

    try:
        key = job.build_key
        stored = read_manifest(store, key)
        if stored is None and validate_only:
            return BuildResult.of(
                job, key, "missing", "not in the store: build it first", time.perf_counter() - started
            )
        lost = missing_blobs(store, stored) if stored is not None and not validate_only else []
        if stored is not None and not lost:
            heal_index(store, key)  # a publish killed after its manifest left the index without it
            entry = read_index(store, job.model).entries.get(key)
            if not validate_only and not stale(job, entry, stored):
                return BuildResult.of(job, key, "exists", MEANWHILE, seconds=time.perf_counter() - started)
            return _revalidated(job, key, store, stored, workroot, tell, started)
        manifest, outdir = compile_artifact(job, workroot, bench=bench, step=tell, store=store, stages=stages)
        tell("publish")
        with stages.stage("publish"):
            files, blobs = pack_files(outdir, [(f.path, f.role) for f in manifest.files], outdir.parent / "blobs")
            manifest = replace(manifest, files=tuple(files))
            note = ""
            if stored is not None and lost:  # (blobs are lost only from a stored artifact)
                note = repair(store, stored, manifest, blobs, lost)
                if not note.startswith("repaired: rebuilt"):
                    manifest = stored  # the same bytes again: the stored manifest stays, and its blobs are back
            written = publish(store, manifest, blobs, progress=progress)
        if not written and not lost:  # another builder's manifest won the race: its artifact is the one stored
            return BuildResult.of(job, key, "exists", MEANWHILE, seconds=time.perf_counter() - started, stages=stages)
        return BuildResult.of(
            job, key, "built", note, seconds=time.perf_counter() - started, manifest=manifest, stages=stages
        )
    except EnginefarmError as exc:  # ValidationFailed included: a failed artifact is reported, never published
        reason = f"{exc} (hint: {exc.hint})" if exc.hint and exc.hint not in str(exc) else str(exc)  # the fix, too
        result = BuildResult.of(job, key, "failed", reason, time.perf_counter() - started, stages=stages)
        if exc.__cause__ is not None:
            result.detail = "".join(traceback.format_exception(exc.__cause__))
        return result
    except Exception as exc:  # a full disk, no memory, or a bug: still the job's reason, never a dead worker
        if is_full(exc):
            full = disk_full(Path(getattr(exc, "filename", None) or workroot).parent, None)
            return BuildResult.of(
                job,
                key,
                "failed",
                f"{job.label}: {now[0]}: {full} (hint: {full.hint})",
                time.perf_counter() - started,
                stages=stages,
            )
        log.debug("%s: %s failed", job.label, now[0], exc_info=True)
        result = BuildResult.of(
            job,
            key,
            "failed",
            f"{job.label}: {now[0]} failed: {_first_line(exc)}",
            time.perf_counter() - started,
            stages=stages,
        )
        result.detail = traceback.format_exc()
        return result
    finally:
        if key is not None:
            shutil.rmtree(job_workdir(workroot, key), ignore_errors=True)


def job_workdir(workroot: Path, key: str) -> Path:
    """This process's work folder for a job: two builds sharing ENGINEFARM_HOME never touch each other's, and a
    killed build's folder is reclaimed by the next run (its owner is gone)."""
    return own(workroot / "jobs", key[:24])


def _revalidated(
    job: Job, key: str, store: Store, stored: Manifest, workroot: Path, step: Step | None, started: float
) -> BuildResult:
    """The engine is stored but was judged under other [validate] settings: judge it again, rebuild nothing."""
    report = revalidate(job, store, stored, workroot, own(workroot / "jobs", f"{key[:24]}-revalidate"), step)
    seconds = time.perf_counter() - started
    if report["passed"] is False:
        return BuildResult.of(
            job,
            key,
            "failed",
            f"{job.label}: failed re-validation (stored, no longer served): {report['failure']}"
            + (f" (hint: {report['hint']})" if report.get("hint") else ""),
            seconds,
        )
    return BuildResult.of(
        job, key, "revalidated", "" if report["passed"] else report.get("why", "not run here"), seconds
    )


def _build_cache(backend, hook, what: str, store: Store | None, job: Job, outdir: Path) -> None:
    """A shared build cache only speeds builds up: if the store cannot serve or keep it, the build goes on cold."""
    if store is None or not backend.has(Feature.BUILD_CACHE):
        return
    try:
        hook(store, job, outdir)
    except EnginefarmError as exc:
        log.warning("%s: %s skipped: %s", job.label, what, exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300]}" if text else type(exc).__name__


def plain_file(root: Path, rel: str, role: str) -> ArtifactFile:
    path = root / rel
    size, digest = path.stat().st_size, sha256_file(path)
    return ArtifactFile(rel, role, size, digest, "none", size, digest)


def _git_commit(where: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
