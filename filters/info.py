"""What a filter is, as its export wrote it: `filter.json` in the model's assets folder, published beside its
artifacts. The runtime reads the kind from it and the kind's class reads its own details (an upscaler's scale, a
safety checker's thresholds)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enginefarm.errors import ConfigError

INFO_FILE = "filter.json"

# kind → what it does, in the words of an app's menu
KINDS = {
    "upscaler": "enlarges an image (RealESRGAN, ESRGAN, SwinIR-class)",
    "face_restorer": "restores faces (GFPGAN, CodeFormer)",
    "face_detector": "finds faces and their landmarks for a face restorer",
    "preview_decoder": "turns latents into a quick preview image (TAESD-class)",
    "safety_checker": "flags images a safety concept matches",
    "preprocessor": "makes a ControlNet's control image from a photo (depth, lines, poses)",
}


@dataclass(frozen=True)
class FilterInfo:
    name: str  # the model's name in the store
    kind: str  # one of KINDS
    architecture: str  # what the export recognised, e.g. "RRDBNet"
    components: tuple[str, ...]  # the store components it runs, each loaded with enginefarm.load
    details: dict[str, Any] = field(default_factory=dict)  # the kind's own facts (scale, thresholds, input range)
    folder: Path | None = None  # the assets folder: files the kind reads beside filter.json

    def to_json(self) -> str:
        record = {
            "kind": self.kind,
            "architecture": self.architecture,
            "components": list(self.components),
            "details": self.details,
        }
        return json.dumps(record, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_folder(cls, folder: str | Path, name: str) -> FilterInfo:
        folder = Path(folder)
        path = folder / INFO_FILE
        if not path.is_file():
            raise ConfigError(
                f"{name} is not a filter: its assets have no {INFO_FILE}",
                hint="load diffusion models with enginefarm.diffusion.Pipeline.load; export a filter's file with "
                "`enginefarm export FILE --out DIR`",
            )
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            kind, architecture = record["kind"], record["architecture"]
            components = tuple(record["components"])
            details = dict(record.get("details", {}))
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"{path}: not a filter description ({exc})", hint="re-export the filter with `enginefarm export`"
            ) from None
        if kind not in KINDS:
            raise ConfigError(
                f"{name} is a {kind!r} filter, which this enginefarm does not know",
                hint=f"known kinds: {', '.join(KINDS)}; a newer enginefarm may run it",
            )
        if not components or not all(isinstance(c, str) and c for c in components):
            raise ConfigError(f"{path}: names no components", hint="re-export the filter with `enginefarm export`")
        return cls(name, kind, str(architecture), components, details, folder)
