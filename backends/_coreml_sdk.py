"""What Core ML's build and load share: the SDK import (quiet off macOS), the install hint and the I/O dtypes. Its
own module so that the converter and the backend import it, not each other."""

from __future__ import annotations

import io
import logging
import warnings
from contextlib import contextmanager, redirect_stderr
from functools import lru_cache

import numpy as np

from .base import import_sdk

INSTALL = "pip install 'enginefarm[coreml]'"
# Core ML has no int64 inputs: int64 tensors travel as int32.
IO_DTYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int32, "int32": np.int32, "bool": np.bool_}


@contextmanager
def quiet_import():
    """coremltools warns at import off macOS (no native library, untested torch version): expected here, noise."""
    logger = logging.getLogger("coremltools")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextmanager
def quiet_convert():
    """torch.jit's deprecation and tracer warnings and coremltools' tqdm bars would print into the user's build
    progress; a failure still raises, and validation at min/opt/max catches what a tracer warning is about."""
    with warnings.catch_warnings(), redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


@lru_cache(maxsize=1)
def sdk_problem() -> str | None:
    try:
        with quiet_import():
            import coremltools  # noqa: F401
        import onnx  # noqa: F401
        import onnx2torch  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        return f"{exc.name or exc} is not installed"
    return None


def coremltools():
    with quiet_import():
        return import_sdk("coremltools", INSTALL)
