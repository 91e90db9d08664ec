"""One job, end to end: prep → backend build → validate → benchmark → pack → publish.

`build()` checks, hashes and logs; each backend's module does the SDK work. A failed validation never publishes.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import time
import traceback
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from enginefarm.cache.artifacts import pack_files, publish, read_index, read_manifest
from enginefarm.cache.atomic import sha256_file
from enginefarm.cache.keys import build_key
from enginefarm.cache.manifest import ArtifactFile, Manifest
from enginefarm.cache.progress import ProgressLike
from enginefarm.cache.stores.base import Store
from enginefarm.errors import BuildError, EnginefarmError, ValidationFailed

from .backends import get_backend
from .bench import measure_in_subprocess
from .hostlock import building
from .planner import Job
from .prep import prepare
from .revalidate import revalidate, stale, validation_settings
from .validate import Thresholds, model_traits, reference_outputs, sample_cases, validate
from .weightmap import attach as attach_weight_map

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
    detail: str = ""  # the SDK's own traceback behind a failure, for `-v` and the report

    @classmethod
    def of(cls, job: Job, key: str | None, status: str, reason: str = "", seconds: float = 0.0, manifest: Manifest | None = None) -> "BuildResult":
        what = {"model": job.model, "component": job.component, "precision": job.precision, "profile": job.profile_name, "target": str(job.target)}
        return cls(job.id, job.label, key, status, reason, seconds, manifest, what)

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job_id, "label": self.label, "key": self.key, "status": self.status, "reason": self.reason,
                "seconds": round(self.seconds, 2), **self.what, **({"detail": self.detail} if self.detail else {})}


def compile_artifact(job: Job, workroot: Path, *, bench: bool = True, step: Step | None = None, store: Store | None = None) -> tuple[Manifest, Path]:
    """Build, validate and (optionally) benchmark one job. Returns an unpacked manifest and the artifact folder.

    `store`, when given, lends backends that keep shared build caches (TensorRT's timing cache) their
    `before_build(store, job, outdir)` / `after_build(store, job, outdir)` hooks.
    Raises ValidationFailed if the artifact misses the reference, BuildError if the backend fails."""
    step = step or (lambda _msg: None)
    backend = get_backend(job.target.backend)
    toolchain = job.toolchain()
    key = job.key(toolchain)
    workdir = workroot / "jobs" / key[:24]
    shutil.rmtree(workdir, ignore_errors=True)
    outdir = workdir / "artifact"
    outdir.mkdir(parents=True)

    with building():
        manifest = _built_and_validated(job, backend, toolchain, key, workdir, outdir, workroot, step, store)
    here = backend.available(job.target.device) if bench else None
    if here is not None and not here.can_load:  # resolution then ranks it by kind, as for --no-bench
        manifest = replace(manifest, provenance={**manifest.provenance, "benchmark": f"skipped: {here.reason}"})
    elif bench:
        step("benchmark")
        manifest_path = workdir / "draft-manifest.json"
        manifest_path.write_bytes(manifest.to_json())
        opt_feeds = dict(sample_cases(job.inputs, job.profile, job.validate)[1][1])
        try:
            measured = measure_in_subprocess(outdir, manifest_path, opt_feeds, workdir)
        except BuildError as exc:  # a crash while benchmarking fails this job like a crash while building
            raise BuildError(f"{job.label}: {exc}", hint=exc.hint) from None
        manifest = replace(manifest, benchmarks=(measured,))
    return manifest, outdir


def _built_and_validated(job: Job, backend, toolchain: dict[str, str], key: str, workdir: Path, outdir: Path, workroot: Path, step: Step,
                         store: Store | None) -> Manifest:
    """Prep, build and validate (the part that shares the host with other builds; benchmarks wait for it)."""
    step("prep")
    # Prepared models are reused across jobs, per source and per prep toolchain (a new version never reuses an old prep).
    keep = job.fp16_keep if job.onnx_precision() in ("fp16", "bf16") else ()
    prep_id = build_key({"source": job.source.digest, "prep": {k: v for k, v in toolchain.items() if k in ("prep", "onnx", "onnxsim", "fp16_converter", "bf16_retype")},
                         **({"fp16_keep_fp32": list(keep)} if keep else {})})
    prepared = prepare(job.source.path, job.onnx_precision(), workroot / "prep" / prep_id[:24], keep)
    step(f"build {job.target}")
    _hook(backend, "before_build", store, job, outdir)
    started = time.perf_counter()
    try:
        built = backend.build(prepared.path, job, outdir)
    except EnginefarmError:
        raise
    except Exception as exc:  # an SDK failure is the job's failure, not the farm's
        raise BuildError(f"{job.label}: {job.target.backend} failed: {sdk_text(exc, workroot)}") from exc
    build_s = time.perf_counter() - started
    _hook(backend, "after_build", store, job, outdir)
    for item in built:
        if not (outdir / item.path).is_file():
            raise BuildError(f"{job.label}: backend reported {item.path} but did not write it")

    notes_path = outdir / "notes.json"
    build_notes = json.loads(notes_path.read_text()) if notes_path.exists() else {}
    notes_path.unlink(missing_ok=True)
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
        fp32 = prepared if job.onnx_precision() == "fp32" else prepare(job.source.path, "fp32", prepared.path.parent)
        manifest = attach_weight_map(manifest, outdir, backend, job.checkpoint.path, job.checkpoint.digest, fp32.path)

    step("validate")
    report = validation_report(job, backend, outdir, manifest, workroot)
    manifest = replace(manifest, validation=report)
    if report["passed"] is False:
        raise ValidationFailed(f"{job.label}: validation failed: {report['failure']}", key=key, report=report, hint=report["hint"] or None)
    return manifest


def validation_report(job: Job, backend, artifact_dir: Path, manifest: Manifest, workroot: Path) -> dict[str, Any]:
    """Run the gate on an artifact folder with the job's current [validate] settings; `settings` names them.

    A backend whose artifact may not run on the build host (TensorRT-RTX or MIGraphX without their GPU, Core ML off
    macOS) offers `validation_session`: its own session, what it can run instead, or None; plus a note the manifest
    keeps. The record always says whether the artifact itself ran here (`executed`), and if not, `why`."""
    cases = sample_cases(job.inputs, job.profile, job.validate)
    opener = getattr(backend, "validation_session", None)
    settings = validation_settings(job)
    try:
        session, note = opener(artifact_dir, manifest, job.target.device) if opener else (backend.load(artifact_dir, manifest, job.target.device), {})
        if session is None:
            return {"passed": None, "executed": False, "settings": settings, **note}
        quantized, feeding = model_traits(job.source.path)
        references = reference_outputs(job.source.path, cases, feeding)
        limits = Thresholds.for_job(job.precision, job.validate, quantized=quantized)
        return {**validate(session, cases, references, limits), "executed": True, "settings": settings, **note}
    except EnginefarmError:
        raise
    except Exception as exc:  # the SDK could not load or run what it built: the job fails, not the farm
        raise BuildError(f"{job.label}: the built artifact does not load or run: {sdk_text(exc, workroot)}") from exc


def build(job: Job, store: Store, workroot: Path, *, bench: bool = True, step: Step | None = None, progress: ProgressLike = None,
          validate_only: bool = False) -> BuildResult:
    """Build one job into `store` unless its key is already there; a stored artifact judged under other [validate]
    settings is re-validated instead. `validate_only`: re-validate what is stored, build nothing.
    `progress` receives the upload's bytes."""
    started = time.perf_counter()
    key = None
    try:
        key = job.key(job.toolchain())
        stored = read_manifest(store, key)
        if stored is None and validate_only:
            return BuildResult.of(job, key, "missing", "not in the store: build it first", time.perf_counter() - started)
        if stored is not None:
            entry = read_index(store, job.model)["entries"].get(key)
            if not validate_only and not stale(job, entry, stored):
                return BuildResult.of(job, key, "exists", seconds=time.perf_counter() - started)
            return _revalidated(job, key, store, stored, workroot, step, started)
        manifest, outdir = compile_artifact(job, workroot, bench=bench, step=step, store=store)
        if step:
            step("publish")
        files, blobs = pack_files(outdir, [(f.path, f.role) for f in manifest.files], outdir.parent / "blobs")
        manifest = replace(manifest, files=tuple(files))
        publish(store, manifest, blobs, progress=progress)
        return BuildResult.of(job, key, "built", seconds=time.perf_counter() - started, manifest=manifest)
    except EnginefarmError as exc:  # ValidationFailed included: a failed artifact is reported, never published
        reason = f"{exc} (hint: {exc.hint})" if exc.hint and exc.hint not in str(exc) else str(exc)  # the fix, too
        result = BuildResult.of(job, key, "failed", reason, time.perf_counter() - started)
        if exc.__cause__ is not None:
            result.detail = "".join(traceback.format_exception(exc.__cause__))
        return result
    except Exception as exc:  # a bug in enginefarm: the job fails with its traceback instead of killing the worker silently
        result = BuildResult.of(job, key, "failed", f"{job.label}: enginefarm failed unexpectedly ({type(exc).__name__}: {exc}); please report it",
                                time.perf_counter() - started)
        result.detail = traceback.format_exc()
        return result
    finally:
        if key is not None:
            shutil.rmtree(workroot / "jobs" / key[:24], ignore_errors=True)


def _revalidated(job: Job, key: str, store: Store, stored: Manifest, workroot: Path, step: Step | None, started: float) -> BuildResult:
    """The engine is stored but was judged under other [validate] settings: judge it again, rebuild nothing."""
    workdir = workroot / "jobs" / f"{key[:24]}-revalidate"
    report = revalidate(job, store, stored, workdir, step)
    seconds = time.perf_counter() - started
    if report["passed"] is False:
        return BuildResult.of(job, key, "failed", f"{job.label}: failed re-validation (stored, no longer served): {report['failure']}"
                              + (f" (hint: {report['hint']})" if report.get("hint") else ""), seconds)
    return BuildResult.of(job, key, "revalidated", "" if report["passed"] else report.get("why", "not run here"), seconds)


def _hook(backend, name: str, store: Store | None, job: Job, outdir: Path) -> None:
    """A shared build cache only speeds builds up: if the store cannot serve or keep it, the build goes on cold."""
    hook = getattr(backend, name, None)
    if hook is None or store is None:
        return
    try:
        hook(store, job, outdir)
    except EnginefarmError as exc:
        log.warning("%s: %s skipped: %s", job.label, name.replace("_", " "), exc)


SDK_TEXT_LIMIT = 4000


def sdk_text(exc: BaseException, workroot: Path) -> str:
    """An SDK's error as the user needs it: every line of it (bounded, cut at a line), with the job's temporary
    folders, which are gone by the time anyone reads the message, reduced to the file names inside them."""
    text = str(exc).strip()
    for root in {str(workroot), str(Path(workroot).resolve())}:
        text = re.sub(re.escape(root) + r"/(?:[^\s'\"]*/)?", "", text)
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    text = "\n".join(lines)
    if len(text) > SDK_TEXT_LIMIT:
        cut = text.rfind("\n", 0, SDK_TEXT_LIMIT)
        cut = cut if cut > SDK_TEXT_LIMIT // 2 else text.rfind(" ", 0, SDK_TEXT_LIMIT)
        text = f"{text[:cut]} … ({len(text) - cut} more characters; -v shows all)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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
