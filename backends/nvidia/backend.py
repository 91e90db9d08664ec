"""`NvidiaBackend`: what the TensorRT and TensorRT-RTX backend classes share."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import ClassVar

import numpy as np

from ..base import Backend
from .devices import gpu_description
from .plan import require_refittable
from .sdk import INDEX_NOTE, sdk
from .session import TrtSession


class NvidiaBackend(Backend, abstract=True):
    """What TensorRT and TensorRT-RTX share: NVIDIA GPUs matched by compute capability, farm runners labelled nvidia,
    builds that hold the weights about three times (builder/memory.py)."""

    probes = ("nvidia",)
    sdk_module: ClassVar[str]  # every NVIDIA backend has its SDK module (Backend's None is for those that have none)
    extra: ClassVar[str]  # its pip extra: set from its name below

    def __init_subclass__(cls, **kwargs) -> None:
        if "name" in cls.__dict__:  # each NVIDIA SDK's pip extra is named after its backend
            cls.extra = cls.name
            cls.install = f"pip install 'enginefarm[{cls.name}]'"
        super().__init_subclass__(**kwargs)

    vendor_label = "nvidia"
    onnx_precision = "same"  # strongly typed: the prepared ONNX says fp16 or fp32
    build_memory_factor = 3.0
    example_device = "ampere+"
    family_floors: dict[str, tuple[int, int]] = {}  # family class -> lowest compute capability it covers
    left_out: frozenset[int] = frozenset()  # capabilities (major*10+minor) this backend does not run at all

    def device_classes(self, device) -> tuple[str, ...]:
        """The GPU's exact arch, then every family class whose floor it reaches."""
        digits = str(device.info.get("arch", "")).removeprefix("sm_")
        if device.kind != "nvidia" or not digits.isdigit() or len(digits) < 2 or int(digits) in self.left_out:
            return ()
        capability = (int(digits[:-1]), int(digits[-1]))
        return (f"sm_{digits}", *[name for name, floor in self.family_floors.items() if capability >= floor])

    artifact_noun = "plan"  # what errors call the artifact: TensorRT's plan, TensorRT-RTX's engine
    install_note = INDEX_NOTE  # where the SDK's wheels come from, added to the install hint

    def sdk(self) -> ModuleType:
        return sdk(self.sdk_module, self.extra, self.install_note)

    def bench_device(self, manifest) -> dict:
        return gpu_description(manifest.parsed_target.device, self.family_floors)

    def open(self, artifact_dir: Path, manifest, weights: dict[str, np.ndarray] | None) -> TrtSession:
        """The artifact's engine, refitted with `weights` when given."""
        raise NotImplementedError

    def load(self, artifact_dir: Path, manifest, device: str = "") -> TrtSession:
        return self.open(Path(artifact_dir), manifest, None)

    def refit(self, artifact_dir: Path, manifest, weights: dict[str, np.ndarray], device: str = "") -> TrtSession:
        """Load like `load`, then replace the named weights (ONNX initializer names, float32 in ONNX layout; cast to the
        engine's dtype). Every call starts from the artifact's own weights, so nothing of an earlier refit remains."""
        self.check_refit(manifest)
        return self.open(Path(artifact_dir), manifest, weights)

    def check_refit(self, manifest) -> None:
        require_refittable(manifest, self.options, self.artifact_noun)
