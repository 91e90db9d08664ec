"""Typed errors. A leaf module: every layer may raise these, and it imports nothing from the project.

`EnginefarmError` and its subclasses are user-facing: the CLI prints them as one line plus a hint.
Anything else that escapes is a bug in enginefarm and is shown with its traceback.
"""

from __future__ import annotations


class EnginefarmError(Exception):
    """Root of every error a user can cause or fix."""

    hint: str | None = None

    def __init__(self, message: str, *, hint: str | None = None, **context: object) -> None:
        super().__init__(message)
        self.message = message
        if hint is not None:
            self.hint = hint
        self.context = context
        for name, value in context.items():
            setattr(self, name, value)

    def __str__(self) -> str:
        return self.message


class RecipeError(EnginefarmError, ValueError):
    """A recipe is malformed. Names the file, the key and the reason."""

    def __init__(self, path: object, key: str, reason: str, *, hint: str | None = None) -> None:
        where = f"{path}: {key}" if key else f"{path}"
        super().__init__(f"{where}: {reason}", hint=hint, recipe=str(path), key=key, reason=reason)


class SourceError(EnginefarmError):
    """A model source cannot be read, or its digest does not match."""


class ModelError(EnginefarmError, ValueError):
    """An ONNX file is corrupt, unsafe or unusable."""


class BackendUnavailable(EnginefarmError, RuntimeError):
    """A backend's SDK is missing or cannot do what was asked on this machine."""


class BuildError(EnginefarmError, RuntimeError):
    """A backend failed to build an artifact."""


class OutOfMemory(BuildError, MemoryError):
    """A job's process could not get the memory it asked for (`asked`: bytes, 0 when the SDK did not say)."""

    def __init__(self, message: str, *, asked: int = 0, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.asked = asked


class ValidationFailed(EnginefarmError):
    """An artifact's outputs missed the reference by more than the recipe allows."""


class StoreError(EnginefarmError, OSError):
    """A store cannot be reached or written."""


class BlobChanged(StoreError):
    """The object changed under a transfer, or the server ignored a Range: the read must restart from zero."""


class TransferTooSlow(StoreError):
    """The server is slower than the throughput floor, or the transfer outlived its deadline."""


class Unreachable(StoreError):
    """A connection failed, reset or timed out before a response: worth another try."""


class StoreNotFound(StoreError):
    """A store named explicitly (--store, ENGINEFARM_STORE) does not exist: a typo, not an empty store."""


class ArtifactNotFoundError(EnginefarmError, FileNotFoundError):
    """No stored artifact matches what was asked."""


class UnknownModelError(ArtifactNotFoundError):
    """The store holds no model of that name at all (the message lists the names it holds)."""

    closest: str | None = None  # the stored name nearest to the one asked for, if any is near


class IntegrityError(EnginefarmError):
    """Bytes do not hash to what the manifest says: tampered, truncated or corrupt."""


class UnsafeArchiveError(IntegrityError):
    """An archive entry would escape its folder or is not a plain file or folder."""


class OfflineError(EnginefarmError):
    """The network is needed but ENGINEFARM_OFFLINE is set."""


class ConfigError(EnginefarmError, ValueError):
    """An environment variable or option has a value that cannot be used."""


class TrustError(EnginefarmError):
    """Release metadata or a released artifact failed verification: unsigned, rolled back, expired, mixed or
    tampered. `reason` names the check (rollback, expired, root-expired, signature, hash, too-long, mismatch, missing,
    invalid). The last trusted state is kept and nothing is cached."""


class ExportError(EnginefarmError, RuntimeError):
    """`enginefarm export` could not produce a correct ONNX model: the exported model disagrees with torch, or
    its inputs and outputs are not what the family table says. Nothing is written to the output folder."""


class WeightsError(EnginefarmError, ValueError):
    """A checkpoint or LoRA file cannot be used: malformed, unknown tensor names, or shapes that do not fit."""


class InputError(EnginefarmError, ValueError):
    """Inputs that do not fit the artifact: a missing name, the wrong rank, or a shape outside the profile."""


class SessionClosed(EnginefarmError, RuntimeError):
    """A session (or pipeline) was closed and then used: its memory was already given back."""


class ProofFailed(EnginefarmError):
    """`enginefarm bundle`'s proof: the bundle did not load or compute what the full install does."""


class DiskFullError(EnginefarmError, OSError):
    """Not enough free space for a write: `need` bytes at `path` (checked before a fetch, or a write hit ENOSPC).
    Whatever was half-written is removed; nothing already stored or cached is harmed."""


# Optional dependencies by top-level module → the extra that installs them. A missing one is a user's to fix.
OPTIONAL_MODULES = {
    "matplotlib": "report",
    "tuf": "release",
    "securesystemslib": "release",
    "cryptography": "release",
    "boto3": "s3",
    "botocore": "s3",
    "onnxsim": "build",
    "onnx": "build",
    "onnxruntime": "onnxruntime",
    "openvino": "openvino",
    "coremltools": "coreml",
    "onnx2torch": "coreml",
    "torch": "coreml",
    "torchvision": "coreml",
    "diffusers": "export",
    "transformers": "export",
    "safetensors": "export",
    "tensorrt_rtx": "tensorrt-rtx",
    "tensorrt": "tensorrt",
    "cuda": "tensorrt",
    "pynvml": "tensorrt",
    "click": "cli",
    "rich": "cli",
    "pygments": "cli",
}


def missing_extra(exc: ImportError) -> EnginefarmError | None:
    """The user-facing error for an optional dependency that is not installed, or None if `exc` is not one."""
    name = (getattr(exc, "name", None) or "").split(".")[0]
    extra = OPTIONAL_MODULES.get(name)
    if extra is None:
        return None
    return ConfigError(f"this needs {name}, which is not installed", hint=f"pip install 'enginefarm[{extra}]'")
