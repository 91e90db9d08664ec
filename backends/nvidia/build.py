"""Building a plan: the job as a `BuildSpec` handed to a separate build process (build_process.py), which imports
the SDK itself, so a segfault, abort or out-of-memory kill inside the SDK fails the job with a reason instead of
taking the build farm down."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from enginefarm.cache.atomic import write_bytes_atomic
from enginefarm.errors import BuildError

from ..base import Built, BuiltFile
from ..build_job import BuildJob

log = logging.getLogger(__name__)

_CHILD = "enginefarm.backends.nvidia.build_process"


@dataclass
class BuildSpec:
    """Everything the build process needs, as plain data (it crosses a process boundary as JSON)."""

    sdk: str  # module to import: tensorrt | tensorrt_rtx
    onnx: str
    plan: str  # where the plan is written
    profile: dict[str, dict[str, list[int]]]  # input → min/opt/max
    precision: str
    strip_weights: bool
    refittable: bool
    weight_streaming: bool = False  # streamable plan: the runtime keeps only a budget of its weights on the GPU
    version_compatible: bool = False
    hardware_compatible: bool = False  # TensorRT's ampere+ level
    compute_capabilities: list[str] = field(default_factory=list)  # TensorRT-RTX: ComputeCapability member names
    timing_caches: list[str] = field(default_factory=list)  # serialized caches to merge before building
    timing_cache_out: str | None = None
    progress: str | None = None  # where the build process appends its phases (JSON lines), when someone watches
    # More optimization profiles after `profile` (profiles.py: the recipe's opt_profiles), each its own opt
    extra_profiles: list[dict[str, dict[str, list[int]]]] = field(default_factory=list)


# (done, total, phase) of the engine build, as the SDK's progress monitor reports it.
BuildProgress = Callable[[int, int, str], None]


def build_in_subprocess(
    spec: BuildSpec,
    workdir: Path,
    what: str,
    *,
    hints: dict[str, str] | None = None,
    progress: BuildProgress | None = None,
) -> dict[str, Any]:
    """Run the SDK build in a fresh Python process and return its notes. Its crash, abort or OOM kill becomes a
    BuildError; so does the SDK's refusal, in its own words. `hints`: text in the SDK's error → the fix to suggest.
    `progress` receives the build's phases while it runs."""
    spec_path = workdir.parent / "build-spec.json"
    result_path = workdir.parent / "build-result.json"
    progress_path = workdir.parent / "build-progress.jsonl"
    result_path.unlink(missing_ok=True)
    progress_path.unlink(missing_ok=True)
    if progress is not None:
        spec = replace(spec, progress=str(progress_path))
    write_bytes_atomic(spec_path, json.dumps(asdict(spec)).encode())
    env = dict(os.environ)
    # The child imports exactly what this process can: same interpreter, same module path.
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    process = subprocess.Popen(
        [sys.executable, "-m", _CHILD, str(spec_path), str(result_path), str(os.getpid())], env=env
    )
    read = 0
    try:
        while True:
            try:
                code = process.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                code = None
            if progress is not None:
                read = _forward_progress(progress_path, read, progress)
            if code is not None:
                break
    except BaseException:
        process.kill()
        process.wait()
        raise
    result = json.loads(result_path.read_text()) if result_path.is_file() else None
    if result and result.get("error"):
        error = result["error"]
        hint = next((fix for text, fix in (hints or {}).items() if text in error), None)
        raise BuildError(f"{what}: {error}", hint=hint, sdk_errors=result.get("sdk_errors", []))
    if code != 0 or not result:
        raise BuildError(
            f"{what}: the build process died ({describe_exit(code)})",
            hint="a crash or out-of-memory in the SDK; the other jobs go on",
        )
    return result.get("notes", {})


def _forward_progress(path: Path, offset: int, progress: BuildProgress) -> int:
    """Reports the complete lines the build process appended since `offset`; returns the new offset."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            chunk = handle.read()
    except FileNotFoundError:
        return offset
    complete = chunk[: chunk.rfind(b"\n") + 1]
    for line in complete.splitlines():
        try:
            step = json.loads(line)
            progress(int(step["done"]), int(step["total"]), str(step["phase"]))
        except (ValueError, KeyError, TypeError):
            continue
        except Exception:  # the watcher's own failure never fails the build
            log.debug("build progress callback failed", exc_info=True)
    return offset + len(complete)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}" + (": out of memory?" if name == "SIGKILL" else "")
    return f"exit code {code}"


def die_with_parent(parent: int) -> None:
    """Linux: the build process dies with the worker that started it, so an interrupted farm leaves no orphan
    builds. Called first thing in the build process (not as a preexec_fn, which is unsafe in a threaded parent)."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            return
    if os.getppid() != parent:  # the parent died before we asked to follow it
        os._exit(1)


def build_engine(
    sdk: str,
    prepared_onnx: Path,
    job: BuildJob,
    workdir: Path,
    options: dict[str, Any],
    *,
    hints: dict[str, str] | None = None,
    progress: BuildProgress | None = None,
    **sdk_fields,
) -> Built:
    """What both SDKs' builds share: the job's profile (and the more profiles its `opt_profiles` rule adds) and
    precision, weight stripping and refit, run in the build process; `sdk_fields` are the BuildSpec fields only one
    of them sets."""
    from .profiles import optimization_profiles

    first, *more = optimization_profiles(job.profile, options.get("opt_profiles", "opt"))
    spec = BuildSpec(
        sdk=sdk,
        onnx=str(prepared_onnx),
        plan=str(workdir / "model.plan"),
        profile=first,
        extra_profiles=more,
        precision=job.precision,
        strip_weights=options["strip_weights"],
        refittable=options["refittable"],
        weight_streaming=options.get("weight_streaming", False),
        **sdk_fields,
    )
    notes = build_in_subprocess(spec, workdir, f"{job.label}: {job.target.backend}", hints=hints, progress=progress)
    return Built(stripped_files(prepared_onnx, workdir, options["strip_weights"]), notes)


def stripped_files(prepared_onnx: Path, workdir: Path, strip_weights: bool) -> list[BuiltFile]:
    """The plan, plus the ONNX its weights are refitted from when it is weight-stripped."""
    files = [BuiltFile("model.plan", "engine")]
    if strip_weights:
        from enginefarm.formats.onnx_data import (
            link_or_copy,  # the prepared files are never rewritten: a link is a copy for free
        )

        link_or_copy(prepared_onnx, workdir / "weights.onnx")
        files.append(BuiltFile("weights.onnx", "weights"))
        data = prepared_onnx.with_name(prepared_onnx.name + ".data")
        if data.exists():  # external data keeps the file name the ONNX graph refers to
            link_or_copy(data, workdir / data.name)
            files.append(BuiltFile(data.name, "weights"))
    return files
