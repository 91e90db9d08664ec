"""A job: one artifact to build (component × precision × profile × target), as plain data the planner makes and
the build worker, re-validation and the on-device compile read. Its build key is computed once (`build_key`) and
travels with the job, pickled, into its worker process.

It sits below every builder module that handles jobs (planner, build, gate, revalidate, executor) and imports none
of them, so those modules never import each other for the type.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from enginefarm.backends import get_backend
from enginefarm.cache import precision_table
from enginefarm.cache.build_keys import build_key, canonical_json
from enginefarm.cache.manifest import Target
from enginefarm.formats.onnx_io import TensorInfo

from .prep import prep_versions
from .profiles import Resolved
from .recipe import Resources, ValidateSpec
from .sources import LocalSource


@dataclass(frozen=True)
class Job:
    recipe_path: Path
    recipe_digest: str
    model: str
    model_version: str
    component: str
    precision: str
    profile_name: str
    profile: Resolved
    target: Target
    source_url: str
    source: LocalSource
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    opset: int
    validate: ValidateSpec
    resources: Resources = Resources()
    options: dict[str, Any] = field(default_factory=dict)  # the backend's build options, defaults filled in
    checkpoint: LocalSource | None = None  # base weights whose names the artifact's weight map speaks
    fp16_keep: tuple[str, ...] = ()  # op types or node names the recipe keeps fp32 in fp16 ONNX
    weight_bytes: int = 0  # the source's weights: what the job's memory need is estimated from (memory.py)

    @property
    def id(self) -> str:
        """Stable across toolchains: names *what* to build, where the key names *exactly which* artifact."""
        ident = [self.model, self.component, self.precision, self.profile_name, str(self.target)]
        return hashlib.sha256(canonical_json(ident)).hexdigest()[:12]

    @property
    def label(self) -> str:
        return f"{self.model}/{self.component} {self.precision} {self.profile_name} {self.target}"

    def onnx_precision(self) -> str:
        backend = get_backend(self.target.backend)
        return self.precision if backend.onnx_precision == "same" else precision_table.REFERENCE

    def toolchain(self) -> dict[str, str]:
        """Every version that shapes the artifact. Raises BackendUnavailable if the SDK is missing."""
        return dict(self._toolchain)

    @cached_property
    def _toolchain(self) -> dict[str, str]:
        backend = get_backend(self.target.backend)
        versions = dict(backend.versions())
        versions.update(prep_versions(self.onnx_precision()))
        versions["opset"] = str(self.opset)
        return versions

    @cached_property
    def build_key(self) -> str:
        """The key, computed once per job: the plan, the build worker (the job is pickled with it) and the on-device
        compile read this one."""
        return self.key(self.toolchain())

    def key(self, toolchain: dict[str, str]) -> str:
        return build_key(
            {
                "model": self.model,
                "model_version": self.model_version,
                "source": self.source.digest,
                "component": self.component,
                "precision": self.precision,
                "profile": self.profile,
                "target": str(self.target),
                "toolchain": toolchain,
                "options": self.options,
                **({"checkpoint": self.checkpoint.digest} if self.checkpoint else {}),
                # the keep-list shapes fp16 and bf16 ONNX, and OpenVINO's fp16 (backends/openvino_precise.py)
                **(
                    {"fp16_keep_fp32": list(self.fp16_keep)}
                    if self.fp16_keep and (precision_table.reduced(self.onnx_precision()) or self.precision == "fp16")
                    else {}
                ),
            }
        )
