"""A model's assets: the files a pipeline reads besides its engines (tokenizers, scheduler and component configs).

They are not compiled: `enginefarm build` publishes a recipe's `[model] assets` folder as an artifact of component
`assets` and target `assets:any`, so assets travel like every artifact: content-addressed blobs, a manifest, an
index entry, fetched into the device cache and verified byte by byte, kept by gc, versioned with the model, copied
by `publish`. Every device "runs" them: `fetch("MODEL/assets")` gives the verified folder."""

from __future__ import annotations

import re
from pathlib import Path

from enginefarm.errors import BuildError

from .base import Availability, Backend, Built, Rank
from .build_job import BuildJob, PlannedJob

COMPONENT = "assets"
TARGET = "assets:any"
ROLE = "asset"


class AssetsFolder:
    """What loading assets gives: their verified folder. They are read, not run."""

    compute_precision = "fp32"

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.input_names: list[str] = []
        self.output_names: list[str] = []

    def run(self, feeds):
        raise TypeError(f"{self.folder} holds a model's assets (files to read), not a model to run")


class Assets(Backend):
    probes = ("cpu",)
    name = "assets"
    devices = re.compile(r"^any$")
    device_hint = "any"
    install = "it ships with enginefarm"
    onnx_precision = "same"
    example_device = "any"

    def available(self, device: str) -> Availability:
        return Availability(True, True)

    def versions(self) -> dict[str, str]:
        return {"assets": "1"}

    def constraints(self, job: BuildJob) -> dict:
        return {}

    def build(self, prepared_onnx: Path, job: BuildJob, workdir: Path) -> Built:
        raise BuildError(
            "assets are published from a recipe's [model] assets folder, not built from ONNX",
            hint='remove the assets:any target from the recipe; set [model] assets = "FOLDER" instead',
        )

    def refusal(self, job: PlannedJob) -> tuple[str, str] | None:
        return (
            "assets are not built from ONNX",
            'set [model] assets = "FOLDER" in the recipe instead of an assets:any target',
        )

    def load(self, artifact_dir: Path, manifest, device: str) -> AssetsFolder:
        return AssetsFolder(Path(artifact_dir))

    def device_classes(self, device) -> tuple[str, ...]:
        return ("any",)

    def rank(self, device_class: str) -> Rank:
        return Rank.PORTABLE_IR


BACKEND = Assets()
