"""The disk an OpenVINO build writes in its work folder, checked before it writes: a full disk fails the job at once
with one line (DiskFullError: how much is needed, how much is free, and where) instead of the SDK's
`basic_ios::clear: iostream error` after minutes of work (met with SD3.5 Medium's transformer: docs/large-models.md)."""

from __future__ import annotations

import math
from pathlib import Path

# The XML beside the constants: about 0.5 KB a layer measured (40 KB for the 83 layers of a synthetic transformer),
# counted as 1 KB.
XML_BYTES_PER_OP = 1024

# Constants at least this big stand in the keep-list's staging IR (openvino_precise) as placeholders. Weights are
# far bigger; what the graph's shape inference reads as values (shapes, axes, indices) is far smaller, so every
# placeholder takes only its type and shape, which a Parameter keeps.
PLACEHOLDER_MIN_BYTES = 1 << 16


def hint(workdir: Path) -> str:
    return (
        f"free some space on the disk that holds {workdir}, or point ENGINEFARM_HOME at a bigger one (builds work in "
        "ENGINEFARM_HOME/build)"
    )


def constant_bytes(op) -> int:
    return op.get_output_element_type(0).size * math.prod(op.get_output_shape(0))


def placeheld(op, names: set[str]) -> bool:
    """Whether the staging IR holds a placeholder for `op` instead of its data."""
    return (
        op.get_type_name() == "Constant"
        and op.get_friendly_name() not in names
        and constant_bytes(op) >= PLACEHOLDER_MIN_BYTES
    )


def build_bytes(model, fp16: bool, names: set[str] | None) -> int:
    """About what the build writes for `model`: its IR (f32 constants halved when `fp16` compresses them, but those
    the keep-list `names` keeps), and with a keep-list (`names` not None) the staging IR before it, which holds the
    graph and the constants no placeholder replaces (openvino_precise). Equal constants are written once, so the
    constants' share is a bound; the reserve left free (cache/space.py) covers what the XML estimate misses."""
    ir = staged = 0
    for op in model.get_ops():
        ir += XML_BYTES_PER_OP
        staged += XML_BYTES_PER_OP
        if op.get_type_name() != "Constant":
            continue
        size = constant_bytes(op)
        kept = names is not None and op.get_friendly_name() in names
        ir += size // 2 if fp16 and op.get_output_element_type(0).get_type_name() == "f32" and not kept else size
        staged += 0 if names is None or placeheld(op, names) else size
    return ir + (staged if names is not None else 0)
