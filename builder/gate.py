"""The validation gate, one for the build and for re-validation: an artifact folder run against the fp32 ONNX
Runtime reference under the job's current [validate] settings, and the digest of those settings that every verdict
records (`validation_settings`), so a stored verdict reached under other settings is known to be stale.

`build.py` calls it on what it just built, `revalidate.py` on what it fetched from the store, the planner asks
`stale` whether a stored artifact needs judging again. It imports neither of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from enginefarm.backends import Feature
from enginefarm.cache.atomic import sha256_file
from enginefarm.cache.build_keys import build_key
from enginefarm.errors import BuildError, EnginefarmError
from enginefarm.hardware import rss

from .job import Job
from .oom import OutOfMemory, asked_bytes, out_of_memory
from .references import reference_outputs_cached
from .sdk_errors import sdk_text
from .stages import Stages
from .validate import GATE_VERSION, Thresholds, model_traits, sample_cases, validate
from .workcache import source_folder

if TYPE_CHECKING:
    from enginefarm.cache.index import IndexEntry
    from enginefarm.cache.manifest import Manifest


def validation_settings(job: Job) -> str:
    """The digest of everything that decides a verdict besides the artifact: the gate's own version, the
    thresholds it applies, the seeded inputs and the recipe's sample files (by content)."""
    spec = job.validate
    quantized, _ = model_traits(job.source.path)
    inputs = {
        name: {"low": s.low, "high": s.high, "file": sha256_file(s.file) if s.file else None}
        for name, s in spec.inputs.items()
    }
    return build_key(
        {
            "gate": GATE_VERSION,
            "thresholds": Thresholds.for_job(job.precision, spec, quantized=quantized).to_dict(),
            "inputs": inputs,
            "samples": sha256_file(spec.samples) if spec.samples else None,
            "seed": spec.seed,
        }
    )


def stale(job: Job, entry: IndexEntry | None, manifest: Manifest | None) -> bool:
    """Whether the stored verdict was reached under other settings than the recipe's current ones."""
    if entry is not None and entry.validation:
        settings = entry.validation.settings
    else:
        settings = (manifest.validation if manifest is not None else {}).get("settings")
    return settings != validation_settings(job)


def thresholds(job: Job) -> Thresholds:
    """The tolerances the job's artifact is held to: its precision's, widened for a quantized source."""
    return Thresholds.for_job(job.precision, job.validate, quantized=model_traits(job.source.path)[0])


def validation_report(
    job: Job, backend, artifact_dir: Path, manifest: Manifest, workroot: Path, stages: Stages | None = None
) -> dict[str, Any]:
    """Run the gate on an artifact folder with the job's current [validate] settings; `settings` names them.

    The fp32 references are computed (or read back from the source's work folder) before the artifact loads, so
    the two are never in memory at once. A backend whose artifact may not run on the build host (TensorRT-RTX or
    MIGraphX without their GPU, Core ML off macOS) offers `validation_session`: its own session, what it can run
    instead, or None; plus a note the manifest keeps. The record always says whether the artifact itself ran here
    (`executed`), and if not, `why`."""
    stages = stages if stages is not None else Stages()
    folder = source_folder(workroot, job.source.digest)
    cases = sample_cases(job.inputs, job.profile, job.validate)
    settings = validation_settings(job)
    references = None
    if backend.available(job.target.device).can_load:
        with stages.stage("reference") as probe:
            references = _references(job, cases, folder, probe)
    with stages.stage("validate") as probe:
        try:
            if backend.has(Feature.OWN_VALIDATION):
                session, note = backend.validation_session(artifact_dir, manifest, job.target.device)
            else:
                session, note = backend.load(artifact_dir, manifest, job.target.device), {}
            if session is None:
                return {"passed": None, "executed": False, "settings": settings, **note}
            if references is None:  # a stand-in runs here though the artifact cannot (Core ML's traced module)
                references = _references(job, cases, folder, probe)
            checked = validate(session, cases, references, thresholds(job))
            report = {**checked, "executed": True, "settings": settings, **note}
        except EnginefarmError:
            raise
        except Exception as exc:  # the SDK could not load or run what it built: the job fails, not the farm
            asked = asked_bytes(f"{type(exc).__name__}: {exc}")
            if asked is not None:
                raise out_of_memory(job, "validation", asked) from exc
            why = sdk_text(exc, workroot)
            raise BuildError(f"{job.label}: the built artifact does not load or run: {why}") from exc
        del session
        rss.give_back_memory()  # the artifact's memory goes back to the system before the benchmark process starts
    return report


def _references(job: Job, cases, folder: Path, probe):
    """The reference outputs; a reference run that runs out of memory is the profile's size, said with the job."""
    try:
        return reference_outputs_cached(job.source.path, cases, folder, probe)
    except OutOfMemory as exc:
        raise out_of_memory(job, "the fp32 reference run (ONNX Runtime)", exc.asked) from exc
