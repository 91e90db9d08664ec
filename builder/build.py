"""One job, end to end: prep → backend build → validate → benchmark → pack → publish.

`build()` checks, hashes and logs; each backend's module does the SDK work. A failed validation never publishes.
Each stage's time and peak memory are measured where the work happens (stages.py) and reported with the job.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from enginefarm.cache.artifacts import pack_files, publish
from enginefarm.cache.atomic import sha256_file
from enginefarm.cache.manifest import ArtifactFile, Manifest
from enginefarm.cache.progress import ProgressLike
from enginefarm.cache.stores.base import Store
from enginefarm.errors import BuildError, EnginefarmError, ValidationFailed

from . import rss
from .backends import get_backend
from .bench import measure_in_subprocess
from .planner import Job
from .prep import prepare
from .references import reference_outputs_cached
from .stages import Stages
from .validate import Thresholds, sample_cases, validate
from .weightmap import attach as attach_weight_map
from .workcache import source_folder

log = logging.getLogger(__name__)

Step = Callable[[str], None]


@dataclass
class BuildResult:
    job_id: str
    label: str
    key: str | None
    status: str  # built | exists | failed
    reason: str = ""
    seconds: float = 0.0
    manifest: Manifest | None = None
    what: dict[str, str] = field(default_factory=dict)  # model, component, precision, profile, target: for reports
    stages: list[dict[str, Any]] = field(default_factory=list)  # time and peak memory per stage (stages.py)

    @classmethod
    def of(cls, job: Job, key: str | None, status: str, reason: str = "", seconds: float = 0.0, manifest: Manifest | None = None,
           stages: Stages | None = None) -> "BuildResult":
        what = {"model": job.model, "component": job.component, "precision": job.precision, "profile": job.profile_name, "target": str(job.target)}
        return cls(job.id, job.label, key, status, reason, seconds, manifest, what, list(stages.records) if stages else [])

    @property
    def peak_rss_mb(self) -> float | None:
        return max((s["peak_rss_mb"] for s in self.stages), default=None)

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job_id, "label": self.label, "key": self.key, "status": self.status, "reason": self.reason,
                "seconds": round(self.seconds, 2), **self.what, "peak_rss_mb": self.peak_rss_mb, "stages": self.stages}


def compile_artifact(job: Job, workroot: Path, *, bench: bool = True, step: Step | None = None, store: Store | None = None,
                     stages: Stages | None = None) -> tuple[Manifest, Path]:
    """Build, validate and (optionally) benchmark one job. Returns an unpacked manifest and the artifact folder.

    `store`, when given, lends backends that keep shared build caches (TensorRT's timing cache) their
    `before_build(store, job, outdir)` / `after_build(store, job, outdir)` hooks. `stages` receives each stage's
    time and peak memory (the manifest's provenance keeps them too).
    Raises ValidationFailed if the artifact misses the reference, BuildError if the backend fails."""
    step = step or (lambda _msg: None)
    stages = stages if stages is not None else Stages()
    backend = get_backend(job.target.backend)
    toolchain = job.toolchain()
    key = job.key(toolchain)
    workdir = workroot / "jobs" / key[:24]
    shutil.rmtree(workdir, ignore_errors=True)
    outdir = workdir / "artifact"
    outdir.mkdir(parents=True)

    step("prep")
    # Prepared models and reference outputs are reused across jobs, per source and prep toolchain (workcache.py).
    folder = source_folder(workroot, job.source.digest)
    with stages.stage("prep"):
        prepared = prepare(job.source.path, job.onnx_precision(), folder)
    step(f"build {job.target}")
    _hook(backend, "before_build", store, job, outdir)
    with stages.stage("compile") as probe:
        started = time.perf_counter()
        try:
            built = backend.build(prepared.path, job, outdir)
        except EnginefarmError:
            raise
        except Exception as exc:  # an SDK failure is the job's failure, not the farm's
            raise BuildError(f"{job.label}: {job.target.backend} failed: {_first_line(exc)}") from exc
        build_s = time.perf_counter() - started
        notes_path = outdir / "notes.json"
        build_notes = json.loads(notes_path.read_text()) if notes_path.exists() else {}
        notes_path.unlink(missing_ok=True)
        probe.subprocess(int(build_notes.get("build_process_peak_rss_mb", 0) * 2**20))  # backends that build in a subprocess
    _hook(backend, "after_build", store, job, outdir)
    for item in built:
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
        files=tuple(plain_file(outdir, item.path, item.role) for item in built),
        io={"inputs": [t.to_dict() for t in job.inputs], "outputs": [t.to_dict() for t in job.outputs]},
        constraints=backend.constraints(job),
        options=dict(job.options),
        provenance={
            "recipe": str(job.recipe_path),
            "recipe_digest": job.recipe_digest,
            "source": job.source_url,
            "source_digest": job.source.digest,
            "git_commit": _git_commit(job.recipe_path.parent),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "prep_notes": prepared.notes,
            "build_seconds": round(build_s, 2),
            "build_notes": build_notes,
        },
    )

    if job.checkpoint is not None:
        step("weight map")
        with stages.stage("weight map"):
            fp32 = prepared if job.onnx_precision() == "fp32" else prepare(job.source.path, "fp32", prepared.path.parent)
            manifest = attach_weight_map(manifest, outdir, backend, job.checkpoint.path, job.checkpoint.digest, fp32.path)

    step("validate")
    cases = sample_cases(job.inputs, job.profile, job.validate)
    here = backend.available(job.target.device)
    references = None
    if here.can_load:  # computed (or read back) before the artifact loads: the two are never in memory at once
        with stages.stage("reference") as probe:
            references = reference_outputs_cached(job.source.path, cases, folder, probe)
    # A backend whose artifact may not run on the build host (TensorRT-RTX or MIGraphX without their GPU, Core ML
    # off macOS) offers `validation_session`: its own session, what it can run instead, or None; plus a note the
    # manifest keeps. The record always says whether the artifact itself ran here (`executed`), and if not, `why`.
    opener = getattr(backend, "validation_session", None)
    with stages.stage("validate") as probe:
        try:
            session, note = opener(outdir, manifest, job.target.device) if opener else (backend.load(outdir, manifest, job.target.device), {})
            if session is None:
                report = {"passed": None, "executed": False, **note}
            else:
                if references is None:  # a stand-in runs here though the artifact cannot (Core ML's traced module)
                    references = reference_outputs_cached(job.source.path, cases, folder, probe)
                report = {**validate(session, cases, references, Thresholds.for_job(job.precision, job.validate)), "executed": True, **note}
        except EnginefarmError:
            raise
        except Exception as exc:  # the SDK could not load or run what it built: the job fails, not the farm
            raise BuildError(f"{job.label}: the built artifact does not load or run: {_first_line(exc)}") from exc
        del session
        rss.give_back()  # the artifact's memory goes back to the system before the benchmark process starts
    manifest = replace(manifest, validation=report)
    if report["passed"] is not None and not report["passed"]:
        raise ValidationFailed(f"{job.label}: validation failed: {report['failure']}", key=key, report=report)

    if bench and not here.can_load:  # resolution then ranks it by kind, as for --no-bench
        manifest = replace(manifest, provenance={**manifest.provenance, "benchmark": f"skipped: {here.reason}"})
    elif bench:
        step("benchmark")
        manifest_path = workdir / "draft-manifest.json"
        manifest_path.write_bytes(manifest.to_json())
        opt_feeds = dict(cases[1][1])
        with stages.stage("benchmark") as probe:
            try:
                measured = measure_in_subprocess(outdir, manifest_path, opt_feeds, workdir)
            except BuildError as exc:  # a crash while benchmarking fails this job like a crash while building
                raise BuildError(f"{job.label}: {exc}", hint=exc.hint) from None
            probe.subprocess(int(measured.get("peak_rss_mb", 0) * 2**20))
        manifest = replace(manifest, benchmarks=(measured,))
    manifest = replace(manifest, provenance={**manifest.provenance, "stages": stages.records, "peak_rss_mb": stages.peak_rss_mb})
    return manifest, outdir


def build(job: Job, store: Store, workroot: Path, *, bench: bool = True, step: Step | None = None, progress: ProgressLike = None) -> BuildResult:
    """Build one job into `store` unless its key is already there. `progress` receives the upload's bytes."""
    started = time.perf_counter()
    key = None
    stages = Stages()
    now = ["plan"]  # the step under way, for a failure nobody foresaw

    def tell(name: str) -> None:
        now[0] = name
        if step:
            step(name)

    try:
        key = job.key(job.toolchain())
        if store.get_manifest_bytes(key) is not None:
            return BuildResult.of(job, key, "exists", seconds=time.perf_counter() - started)
        manifest, outdir = compile_artifact(job, workroot, bench=bench, step=tell, store=store, stages=stages)
        tell("publish")
        with stages.stage("publish"):
            files, blobs = pack_files(outdir, [(f.path, f.role) for f in manifest.files], outdir.parent / "blobs")
            manifest = replace(manifest, files=tuple(files))
            publish(store, manifest, blobs, progress=progress)
        return BuildResult.of(job, key, "built", seconds=time.perf_counter() - started, manifest=manifest, stages=stages)
    except EnginefarmError as exc:  # ValidationFailed included: a failed artifact is reported, never published
        reason = f"{exc} (hint: {exc.hint})" if exc.hint and exc.hint not in str(exc) else str(exc)  # the fix, too
        return BuildResult.of(job, key, "failed", reason, time.perf_counter() - started, stages=stages)
    except Exception as exc:  # a full disk, no memory, or a bug: still the job's reason, never a dead worker
        log.exception("%s: %s failed", job.label, now[0])
        return BuildResult.of(job, key, "failed", f"{job.label}: {now[0]} failed: {_first_line(exc)}", time.perf_counter() - started, stages=stages)
    finally:
        if key is not None:
            shutil.rmtree(workroot / "jobs" / key[:24], ignore_errors=True)


def _hook(backend, name: str, store: Store | None, job: Job, outdir: Path) -> None:
    """A shared build cache only speeds builds up: if the store cannot serve or keep it, the build goes on cold."""
    hook = getattr(backend, name, None)
    if hook is None or store is None:
        return
    try:
        hook(store, job, outdir)
    except EnginefarmError as exc:
        log.warning("%s: %s skipped: %s", job.label, name.replace("_", " "), exc)


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
