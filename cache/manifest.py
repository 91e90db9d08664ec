"""The artifact manifest: the contract between the builder that writes artifacts and the runner that uses them."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from enginefarm.errors import IntegrityError

from .keys import ARTIFACT_FORMAT_VERSION

ROLES = ("engine", "weights", "ir", "model", "cache", "map")
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")


@dataclass(frozen=True, order=True)
class Target:
    """`backend:device`, e.g. `openvino:cpu`, `tensorrt:sm_89`, `tensorrt-rtx:ampere+`."""

    backend: str
    device: str

    @classmethod
    def parse(cls, text: str) -> "Target":
        backend, sep, device = text.strip().partition(":")
        if not sep or not backend or not device:
            raise ValueError(f"target {text!r} is not 'backend:device'")
        return cls(backend, device)

    def __str__(self) -> str:
        return f"{self.backend}:{self.device}"

    def matches(self, selector: str) -> bool:
        """A user's --target: a whole target (`openvino:cpu`) or a backend (`openvino`)."""
        return selector in (str(self), self.backend)


def target_matches(target: str, selectors) -> bool:
    """True if `target` (text) matches any selector, or there are none."""
    if not selectors:
        return True
    try:
        parsed = Target.parse(target)
    except ValueError:
        return False
    return any(parsed.matches(s) for s in selectors)


@dataclass(frozen=True)
class ArtifactFile:
    path: str  # relative to the artifact root, '/'-separated
    role: str
    size: int
    sha256: str
    codec: str  # how the blob is stored: "zstd" or "none"
    stored_size: int
    stored_sha256: str  # the blob's digest in the store

    def __post_init__(self) -> None:
        if not _SAFE_PATH.match(self.path) or ".." in self.path.split("/"):
            raise IntegrityError(f"unsafe artifact file path {self.path!r}")


@dataclass(frozen=True)
class Manifest:
    build_key: str
    model: str
    model_version: str
    component: str
    precision: str
    profile_name: str
    profile: dict[str, dict[str, list[int]]]  # input → {min, opt, max}
    target: str
    toolchain: dict[str, str]
    files: tuple[ArtifactFile, ...]
    io: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # inputs/outputs: name, dtype, shape
    constraints: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    validation: dict[str, Any] = field(default_factory=dict)
    benchmarks: tuple[dict[str, Any], ...] = ()
    provenance: dict[str, Any] = field(default_factory=dict)
    format_version: int = ARTIFACT_FORMAT_VERSION

    @property
    def ref(self) -> str:
        return f"{self.model}/{self.component}"

    @property
    def parsed_target(self) -> Target:
        return Target.parse(self.target)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["files"] = [asdict(f) for f in self.files]
        data["benchmarks"] = list(self.benchmarks)
        return data

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True).encode()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Manifest":
        version = data.get("format_version")
        if version != ARTIFACT_FORMAT_VERSION:
            raise IntegrityError(
                f"manifest format {version!r} is not {ARTIFACT_FORMAT_VERSION}",
                hint="upgrade enginefarm to read artifacts built by a newer version",
            )
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise IntegrityError(f"manifest has unknown fields {sorted(unknown)}")
        try:
            values = dict(data)
            values["files"] = tuple(ArtifactFile(**f) for f in data["files"])
            values["benchmarks"] = tuple(data.get("benchmarks", ()))
            return cls(**values)
        except (KeyError, TypeError) as exc:
            raise IntegrityError(f"manifest is malformed: {exc}") from None

    @classmethod
    def from_json(cls, raw: bytes, *, expect_key: str | None = None) -> "Manifest":
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise IntegrityError(f"manifest is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise IntegrityError("manifest is not a JSON object")
        manifest = cls.from_dict(data)
        if expect_key is not None and manifest.build_key != expect_key:
            raise IntegrityError(f"manifest {expect_key[:12]} claims build key {manifest.build_key[:12]}")
        return manifest

    def index_entry(self) -> dict[str, Any]:
        """What resolution needs, without the file list: one index GET answers 'what exists'."""
        return {
            "build_key": self.build_key,
            "model_version": self.model_version,
            "component": self.component,
            "precision": self.precision,
            "profile_name": self.profile_name,
            "profile": self.profile,
            "target": self.target,
            "toolchain": self.toolchain,
            "constraints": self.constraints,
            "benchmarks": list(self.benchmarks),
            "size": sum(f.size for f in self.files),
            "stored_size": sum(f.stored_size for f in self.files),
            "created": self.provenance.get("created"),
            "validation": verdict_summary(self.validation),
        }


def verdict_summary(validation: dict[str, Any]) -> dict[str, Any]:
    """What resolution needs of a validation record: the verdict, the settings it was reached under, the scores."""
    keep = ("passed", "executed", "settings", "min_cosine", "failure", "revalidated", "why")
    return {k: validation[k] for k in keep if k in validation}
