"""The NVIDIA SDKs (TensorRT, TensorRT-RTX) as the backends meet them: importing one with an install hint, and an
ILogger that keeps the SDK's own error words, since its calls mostly answer None or False and explain only in its
log."""

from __future__ import annotations

import logging

from enginefarm.errors import BackendUnavailable

from ..base import Availability, import_sdk

log = logging.getLogger(__name__)

INDEX_NOTE = "its wheels download from NVIDIA's package index, which must be reachable from where you install"


def sdk(module: str, extra: str, note: str = INDEX_NOTE):
    return import_sdk(module, f"pip install 'enginefarm[{extra}]' ({note})")


def sdk_missing(exc: BackendUnavailable, gpu_why: str = "", note: str = INDEX_NOTE) -> Availability:
    """Why a backend is unavailable when its SDK is not installed (`note`: where its wheels come from), plus
    (where building needs one) the GPU story."""
    return Availability.missing(f"{exc} — {note}" + (f"; and {gpu_why}" if gpu_why else ""))


# The SDK's generic follow-up to an error it has already logged in its own words; never the one to report.
_ECHOES = ("catchCudaError",)
KEPT_ERRORS = 20  # of the SDK's errors, kept in a failed build's result


class SdkError(RuntimeError):
    """The SDK refused a call; the message is its own last error."""


def capturing_logger(trt):
    """An ILogger subclass of this SDK that keeps its latest errors and passes warnings and worse to logging."""

    class CapturingLogger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity, msg) -> None:
            if int(severity) <= int(trt.ILogger.Severity.ERROR):
                self.errors.append(str(msg))
                del self.errors[:-KEPT_ERRORS]
            if int(severity) <= int(trt.ILogger.Severity.WARNING):
                log.warning("[%s] %s", trt.__name__, msg)

        def last_error(self) -> str:
            specific = [e for e in self.errors if not any(echo in e for echo in _ECHOES)]
            return (specific or self.errors or [""])[-1]

        def refused(self, what: str) -> SdkError:
            last = self.last_error()
            return SdkError(f"{what}: {last}" if last else f"{what}, and the SDK logged no error")

    return CapturingLogger()
