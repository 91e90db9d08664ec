"""Shared halves for backends whose build/load are not written yet (issue #4).

Their modules already declare the name and device classes, so recipes may target them today and `plan`
reports them as unavailable with this reason instead of rejecting the recipe.
"""

from __future__ import annotations

from enginefarm.errors import BackendUnavailable

from .base import Availability

REASON = "backend not implemented in this release (tracked in issue #4)"


def available(device: str) -> Availability:
    return Availability.missing(REASON)


def versions() -> dict[str, str]:
    raise BackendUnavailable(REASON)


def constraints(job) -> dict:
    raise BackendUnavailable(REASON)


def build(prepared_onnx, job, workdir):
    raise BackendUnavailable(REASON)


def load(artifact_dir, manifest, device):
    raise BackendUnavailable(REASON)
