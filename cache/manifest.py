"""The artifact manifest: the contract between the builder that writes artifacts and the runner that uses them."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from functools import cached_property, lru_cache
from typing import Any

from enginefarm.errors import IntegrityError

from . import fields as f
from .build_keys import ARTIFACT_FORMAT_VERSION
from .records import Constraints, benchmarks

ROLES = ("engine", "weights", "ir", "model", "cache", "map", "golden")
_SAFE_PATH = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*")


@dataclass(frozen=True, order=True)
class Target:
    """`backend:device`, e.g. `openvino:cpu`, `tensorrt:sm_89`, `tensorrt-rtx:ampere+`."""

    backend: str
    device: str

    @classmethod
    def parse(cls, text: str) -> Target:
        return _parse_target(text)

    def __str__(self) -> str:
        return f"{self.backend}:{self.device}"

    def matches(self, selector: str) -> bool:
        """A user's --target: a whole target (`openvino:cpu`) or a backend (`openvino`)."""
        return selector in (str(self), self.backend)


@lru_cache(maxsize=1024)  # targets are few and immutable; an index of 10^5 entries names each many times
def _parse_target(text: str) -> Target:
    backend, sep, device = text.strip().partition(":")
    if not sep or not backend or not device:
        raise ValueError(f"target {text!r} is not 'backend:device'")
    return Target(backend, device)


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
        if not isinstance(self.path, str) or not _SAFE_PATH.fullmatch(self.path) or ".." in self.path.split("/"):
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

    @cached_property
    def parsed_target(self) -> Target:
        """Parsed once per object (the text was checked when it was read from the store)."""
        return Target.parse(self.target)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["files"] = [asdict(f) for f in self.files]
        data["benchmarks"] = list(self.benchmarks)
        return data

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True).encode()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        version = data.get("format_version")
        if version != ARTIFACT_FORMAT_VERSION:
            raise IntegrityError(
                f"manifest format {version!r} is not {ARTIFACT_FORMAT_VERSION}",
                hint="upgrade enginefarm to read artifacts built by a newer version",
            )
        known = {x.name for x in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise IntegrityError(f"manifest has unknown fields {sorted(unknown)}")
        try:
            values = _checked(data)
            values["files"] = tuple(ArtifactFile(**x) for x in values["files"])
            return cls(**values)
        except f.FieldError as exc:
            raise IntegrityError(f"manifest is malformed: {exc}") from None
        except (KeyError, TypeError) as exc:
            raise IntegrityError(f"manifest is malformed: {exc}") from None

    @classmethod
    def from_json(cls, raw: bytes, *, expect_key: str | None = None) -> Manifest:
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise IntegrityError(f"manifest is not JSON: {exc}") from None
        except RecursionError:
            raise IntegrityError("manifest is not JSON: nested too deeply") from None
        if not isinstance(data, dict):
            raise IntegrityError("manifest is not a JSON object")
        manifest = cls.from_dict(data)
        if expect_key is not None and manifest.build_key != expect_key:
            raise IntegrityError(f"manifest {expect_key[:12]} claims build key {manifest.build_key[:12]}")
        return manifest


_REQUIRED_TEXT = ("build_key", "model", "model_version", "component", "precision", "profile_name", "target")
_FILE_FIELDS = ("path", "role", "size", "sha256", "codec", "stored_size", "stored_sha256")


def _checked(data: dict[str, Any]) -> dict[str, Any]:
    """Every field's type, so a malformed manifest is refused when it is read (and never cached), instead of
    failing later inside resolution, a backend or a session. Raises FieldError naming the field."""
    values = dict(data)
    for name in _REQUIRED_TEXT:
        f.text(data.get(name), name, pattern=f.HEX64 if name == "build_key" else None)
    try:
        Target.parse(data["target"])
    except ValueError as exc:
        raise f.FieldError("target", str(exc)) from None
    f.profile(data.get("profile"), "profile")
    f.text_map(data.get("toolchain"), "toolchain")
    files = []
    for i, item in enumerate(f.items(data.get("files"), "files")):
        where = f"files[{i}]"
        f.mapping(item, where)
        if set(item) != set(_FILE_FIELDS):
            raise f.FieldError(where, f"has fields {sorted(item)}, expected {sorted(_FILE_FIELDS)}")
        for name in ("path", "role", "codec"):
            f.text(item[name], f"{where}.{name}")
        for name in ("sha256", "stored_sha256"):
            f.text(item[name], f"{where}.{name}", pattern=f.HEX64)
        for name in ("size", "stored_size"):
            f.integer(item[name], f"{where}.{name}")
        files.append(item)
    values["files"] = files
    io = f.mapping(data.get("io", {}), "io")
    for side, tensors in io.items():
        for i, tensor in enumerate(f.items(tensors, f"io.{side}")):
            where = f"io.{side}[{i}]"
            f.text(f.mapping(tensor, where).get("name"), f"{where}.name")
            _dtype(tensor.get("dtype"), f"{where}.dtype")
    Constraints.from_dict(data.get("constraints", {}))  # checked; the manifest keeps the JSON as stored
    for name in ("options", "validation", "provenance"):
        f.mapping(data.get(name, {}), name)
    benchmarks(data.get("benchmarks", []), "benchmarks")
    values["benchmarks"] = tuple(data.get("benchmarks", []))
    f.integer(data.get("format_version"), "format_version")
    return values


def _dtype(value: Any, field: str) -> str:
    import numpy as np

    f.text(value, field)
    try:
        np.dtype(value)
    except TypeError:
        raise f.FieldError(field, f"{value[:40]!r} is not a numpy dtype") from None
    return value
