"""What an export holds at once, known before torch loads anything: the largest component's model at fp32 (the
exporter loads each component at fp32, whatever its files store) and about as much again while torch traces it and
writes and checks the ONNX file (the measured peaks, 1.4x to 1.9x the model, are in docs/large-models.md). A model
whose export needs more than the machine has would swap, or be killed minutes in with no word; it is refused before
anything loads."""

from __future__ import annotations

import math
from pathlib import Path

from enginefarm.builder.memory import BASE, gb
from enginefarm.errors import ConfigError

from .source import ExportSource

FACTOR = 2.0
_OTHER_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt")  # pickles: counted at their size (their dtype is not read)


def folder_fp32_bytes(folder: Path) -> int:
    """The weights under `folder` at 4 bytes a float value: safetensors from their headers (every float dtype), other
    weight files at their size."""
    from enginefarm.formats.safetensors_io import FLOATS, SafeTensors

    total = 0
    for path in sorted(folder.rglob("*")):
        if path.suffix == ".safetensors":
            entries = SafeTensors(path).entries.values()
            total += sum(4 * math.prod(e.shape) for e in entries if e.dtype in FLOATS)
        elif path.suffix in _OTHER_WEIGHTS:
            total += path.stat().st_size
    return total


def export_need(found: ExportSource) -> tuple[int, str, int]:
    """(bytes the export needs, its largest component's folder, that folder's fp32 weights)."""
    folders = {found.family.component(name).folder for name in found.components}
    sizes = {folder: folder_fp32_bytes(found.folder(folder)) for folder in sorted(folders)}
    largest = max(sizes, key=lambda f: sizes[f])
    weights = sizes[largest]
    return max(int(FACTOR * weights), weights + BASE), largest, weights


def check_fits(found: ExportSource, limit: int | None = None) -> None:
    """Refuse an export whose need is over `limit` bytes (default: the machine's whole memory), before torch loads."""
    from enginefarm.builder.memory import total_bytes

    need, largest, weights = export_need(found)
    limit = total_bytes() if limit is None else limit
    if need > limit:
        raise ConfigError(
            f"exporting {largest} needs about {gb(need):g} GB ({FACTOR:g}x its {gb(weights):g} GB of weights at fp32), "
            f"over the {gb(limit):g} GB this export may use",
            hint="export on a machine with that much memory (the files it writes are the same anywhere), or pass "
            "--memory SIZE to try with less",
        )


def check_built_fits(found: ExportSource, limit: int | None = None) -> None:
    """Refuse an export whose models, as their configs build them (export/config_size.py: torch is imported by now),
    need more than `limit` bytes; the files' weights were checked by `check_fits` before torch loaded."""
    from enginefarm.builder.memory import total_bytes

    from .config_size import config_fp32_bytes

    limit = total_bytes() if limit is None else limit
    for folder in sorted({found.family.component(name).folder for name in found.components}):
        weights = config_fp32_bytes(found, folder)
        need = max(int(FACTOR * weights), weights + BASE)
        if need > limit:
            raise ConfigError(
                f"exporting {folder} needs about {gb(need):g} GB ({FACTOR:g}x the {gb(weights):g} GB of weights its "
                f"config.json builds at fp32), over the {gb(limit):g} GB this export may use",
                hint="check that config.json is the one saved with the weights; or export on a machine with that much "
                "memory, or pass --memory SIZE",
            )
