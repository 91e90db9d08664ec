"""The first-device check of artifacts published unvalidated (see builder/golden_samples.py).

The first time a device loads such an artifact, it runs it on the golden inputs and compares the outputs with the
stored fp32 references, through builder/validate.py's own gate and the thresholds the manifest records. The
verdict is kept in the device cache (`ENGINEFARM_HOME/verdicts/`), one per artifact and device, so later loads
cost nothing; a failing artifact is refused, with the numbers, and the next candidate is tried. Neither ONNX Runtime
nor the source model is needed.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import fields
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from enginefarm.cache.atomic import write_bytes_atomic
from enginefarm.cache.manifest import Manifest
from enginefarm.cache.progress import Progress
from enginefarm.errors import IntegrityError, ValidationFailed

if TYPE_CHECKING:
    from enginefarm.builder.validate import Thresholds

log = logging.getLogger(__name__)

VERDICTS = "verdicts"


def needs_check(manifest: Manifest) -> bool:
    validation = manifest.validation or {}
    return validation.get("executed") is False and isinstance(validation.get("golden"), dict)


def device_slot(device) -> str:
    """Who the verdict is for: the device class, and the driver where it has one (a new driver may compile
    differently)."""
    driver = (getattr(device, "info", None) or {}).get("driver")
    slot = device.bench_class + (f"-driver-{driver}" if driver else "")
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", slot)


def verdict_path(home: Path, manifest: Manifest, device) -> Path:
    return Path(home) / VERDICTS / manifest.build_key / f"{device_slot(device)}.json"


def gate(
    session, manifest: Manifest, artifact_dir: Path, home: Path, device, report: Progress
) -> dict[str, Any] | None:
    """Checks `session` (the artifact, loaded) on its golden samples unless this device already did; raises
    ValidationFailed with the numbers when it misses. Returns the verdict, or None for artifacts validated at build."""
    if not needs_check(manifest):
        return None
    path = verdict_path(home, manifest, device)
    verdict = _read(path)
    if verdict is None:
        report.message(
            f"first use of {manifest.ref} {manifest.target} [{manifest.build_key[:12]}] on this device: checking it "
            "against its golden samples"
        )
        verdict = {
            **check(session, manifest, artifact_dir),
            "device": device_slot(device),
            "checked": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        write_bytes_atomic(path, json.dumps(verdict, indent=1, sort_keys=True).encode())
    if not verdict["passed"]:
        raise ValidationFailed(
            f"{manifest.ref} {manifest.target} [{manifest.build_key[:12]}] failed its golden samples on this device "
            f"({verdict['device']}): {verdict['failure']}",
            hint="the artifact was published unvalidated and computes wrong numbers here; the verdict is kept in "
            f"{path} (delete it to check again)",
            key=manifest.build_key,
            report=verdict,
        )
    return verdict


def describe(verdict: dict[str, Any]) -> str:
    score = f", min cosine {verdict['min_cosine']:.6f}" if verdict.get("min_cosine") is not None else ""
    return (
        f"first-device check ({verdict['device']}, {verdict['checked']}): "
        f"{'passed' if verdict['passed'] else 'failed'} on its golden samples{score}"
    )


def check(session, manifest: Manifest, artifact_dir: Path) -> dict[str, Any]:
    # The gate's code is the builder's: imported only for an artifact that needs the check, never by a plain load.
    from enginefarm.builder.golden_samples import FILE, ROLE, tensor_name
    from enginefarm.builder.validate import Reference, validate
    from enginefarm.formats.safetensors_io import SafeTensors

    golden = manifest.validation["golden"]
    entry = next((f for f in manifest.files if f.role == ROLE), None)
    if entry is None or entry.path != golden.get("file", FILE):
        raise IntegrityError(
            f"{manifest.ref} [{manifest.build_key[:12]}]: its manifest names golden samples but lists no "
            f"{golden.get('file', FILE)}"
        )
    samples = SafeTensors(Path(artifact_dir) / entry.path)  # verified with the artifact: hashed against the manifest
    inputs = [t["name"] for t in manifest.io.get("inputs", [])]
    outputs = [t["name"] for t in manifest.io.get("outputs", [])]
    cases, references = [], []
    for case in golden["cases"]:
        try:
            cases.append((case, {n: np.array(samples.raw(tensor_name(case, "in", n))) for n in inputs}))
            references.append(
                Reference(
                    {n: np.array(samples.raw(tensor_name(case, "out", n))) for n in outputs},
                    {n: float(v) for n, v in (golden.get("scales") or {}).get(case, {}).items()},
                )
            )
        except KeyError as exc:
            raise IntegrityError(f"{manifest.ref} [{manifest.build_key[:12]}]: golden samples lack {exc}") from None
    return validate(session, cases, references, thresholds(golden["thresholds"]))


def thresholds(recorded: dict[str, Any]) -> Thresholds:
    from enginefarm.builder.validate import Thresholds

    """The recipe's thresholds as the farm recorded them; fields this version does not know are ignored."""
    known = {f.name for f in fields(Thresholds)}
    return Thresholds(**{k: v for k, v in recorded.items() if k in known})


def _read(path: Path) -> dict[str, Any] | None:
    try:
        verdict = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        log.warning("unreadable verdict %s; checking again", path)
        return None
    return verdict if isinstance(verdict, dict) and isinstance(verdict.get("passed"), bool) else None
