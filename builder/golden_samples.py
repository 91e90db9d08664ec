"""Golden samples: what an artifact published unvalidated carries, so that the first device that can run it checks it.

TensorRT-RTX engines built on a CPU, MIGraphX programs cross-compiled for another gfx and Core ML packages converted
off macOS cannot run where they are built. Such an artifact ships one more file, `golden.safetensors` (role
`golden`, hashed like every file): the validation cases (seeded inputs at the profile's min/opt/max, plus the
recipe's samples) and the fp32 ONNX Runtime reference outputs for each. `validation.golden` in the manifest names
the file, the cases and the thresholds the farm would have applied. The device side (runner/golden_check.py) needs
neither ONNX Runtime nor the source model: it runs the artifact on these inputs and applies builder/validate.py's
own gate.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from enginefarm.cache.atomic import sha256_file
from enginefarm.cache.manifest import ArtifactFile, Manifest
from enginefarm.formats.safetensors_io import write_safetensors

from .validate import Reference, Thresholds

FILE = "golden.safetensors"
ROLE = "golden"
MAX_BYTES = 64 << 20  # beyond this, the largest cases are left out (recorded): samples should stay small


def tensor_name(case: str, side: str, name: str) -> str:
    """`side` is "in" (an input fed to the artifact) or "out" (the reference output)."""
    return f"{case}/{side}/{name}"


def attach(
    manifest: Manifest,
    outdir: Path,
    cases: list[tuple[str, dict[str, np.ndarray]]],
    references: list[Reference],
    thresholds: Thresholds,
) -> tuple[Manifest, dict[str, Any]]:
    """Write the golden file beside the artifact and list it in the manifest. Returns the manifest and the record
    for `validation.golden` (with each output's carried magnitude, which the gate's noise floor needs)."""
    sizes = {
        case: sum(a.nbytes for a in feeds.values()) + sum(a.nbytes for a in ref.outputs.values())
        for (case, feeds), ref in zip(cases, references, strict=True)
    }
    kept = [case for case, _ in cases]
    for case in sorted(kept, key=lambda c: sizes[c], reverse=True):
        if sum(sizes[c] for c in kept) <= MAX_BYTES or len(kept) == 1:
            break
        kept.remove(case)
    tensors: dict[str, np.ndarray] = {}
    for (case, feeds), ref in zip(cases, references, strict=True):
        if case in kept:
            tensors.update({tensor_name(case, "in", n): a for n, a in feeds.items()})
            tensors.update({tensor_name(case, "out", n): np.asarray(a) for n, a in ref.outputs.items()})
    path = outdir / FILE
    write_safetensors(path, tensors)
    size, digest = path.stat().st_size, sha256_file(path)
    record = {
        "file": FILE,
        "cases": kept,
        "reference": "fp32 ONNX Runtime run of the source model",
        "thresholds": asdict(thresholds),
        "scales": {case: ref.scales for (case, _), ref in zip(cases, references, strict=True) if case in kept},
        **({"left_out": {c: sizes[c] for c, _ in cases if c not in kept}} if len(kept) < len(cases) else {}),
    }
    return replace(
        manifest, files=manifest.files + (ArtifactFile(FILE, ROLE, size, digest, "none", size, digest),)
    ), record
