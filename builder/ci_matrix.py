"""What a farm's CI needs from a plan: a GitHub Actions build matrix that batches jobs per runner (the labels each
job builds on are filled in by the planner: `PlannedJob.runs_on`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from enginefarm.backends import get_backend

from .memory import gb, job_need_bytes

if TYPE_CHECKING:
    from .planner import PlannedJob

GITHUB_MATRIX_CAP = 256


def workflow_path(path: Path) -> str:
    """Recipe paths as the workflow's checkout sees them (relative to the working directory when possible)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _extras(chunk: list[PlannedJob]) -> str:
    """`all`, plus the extras of backends whose SDK is not in it."""
    extras = {get_backend(p.job.target.backend).extra for p in chunk}
    return ",".join(["all"] + sorted(e for e in extras if e))


def github_matrix(planned: list[PlannedJob], cap: int = GITHUB_MATRIX_CAP) -> dict[str, Any]:
    """One GitHub Actions matrix: an entry per batch of jobs for the same runner labels, never more than `cap`
    entries. Jobs already built and jobs no runner can build are left out (the latter listed under `skipped`)."""
    todo = [p for p in planned if not p.built and not p.unroutable and not p.refused]
    groups: dict[tuple[str, ...], list[PlannedJob]] = {}
    for p in sorted(todo, key=lambda p: (p.runs_on, str(p.job.target), p.job.id)):
        groups.setdefault(tuple(p.runs_on), []).append(p)
    batch = 1
    while sum(-(-len(jobs) // batch) for jobs in groups.values()) > cap:
        batch += 1
    include = []
    for labels, jobs in groups.items():
        for start in range(0, len(jobs), batch):
            chunk = jobs[start : start + batch]
            targets = sorted({str(p.job.target) for p in chunk})
            include.append(
                {
                    "name": f"{', '.join(targets)} ({start // batch + 1}/{-(-len(jobs) // batch)})",
                    "runs-on": list(labels),
                    "jobs": " ".join(p.job.id for p in chunk),
                    "recipes": " ".join(sorted({workflow_path(p.job.recipe_path) for p in chunk})),
                    "extras": _extras(chunk),
                    "memory_gb": max(
                        gb(job_need_bytes(p.job)) for p in chunk
                    ),  # the largest job's need: one at a time fits
                }
            )
    skipped = [
        {"id": p.job.id, "label": p.job.label, "why": p.refused or p.unroutable}
        for p in planned
        if p.unroutable or p.refused
    ]
    return {"jobs": len(todo), "entries": len(include), "matrix": {"include": include}, "skipped": skipped}
