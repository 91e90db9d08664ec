"""NVIDIA TensorRT: plans for one GPU architecture (sm_XX) or hardware-compatible plans (ampere+).

Builds run in their own process (`nvidia.build.build_in_subprocess`) with the job's optimization profile, strongly
typed from the prepared ONNX (fp16 weights and math, float32 I/O), and a timing cache shared through the store
per (build GPU arch, TensorRT version). Plans are weight-stripped by default and refitted on load from the
ONNX shipped beside them, so every TensorRT artifact of a model stores its weights once.

Recipe options (`[components.NAME.options.tensorrt]`, all in the build key):
    strip_weights      ship a weightless plan plus weights.onnx, refitted on load (default true)
    refittable         any weights can be refitted (custom weights, LoRA); otherwise only the build's own
    version_compatible the plan also runs on newer TensorRT of the same major version (embeds the lean runtime)
    opt_profiles       "edges" (default): more optimization profiles, each its opt at a size users ask (the job's opt,
                       the image height and/or width at the max); "opt": one (nvidia/profiles.py)
"""

from __future__ import annotations

import hashlib
import logging
import platform
import re
from pathlib import Path

import numpy as np

from enginefarm.cache.artifacts import newest_cache_objects
from enginefarm.errors import BackendUnavailable

from .base import Availability, Built, Feature, Rank, option_defaults
from .build_job import BuildJob
from .nvidia.activations import new_context, plan_size
from .nvidia.backend import NvidiaBackend
from .nvidia.build import build_engine
from .nvidia.devices import build_host_arch, matching_gpu
from .nvidia.plan import open_engine
from .nvidia.profiles import OPT_RULES
from .nvidia.sdk import sdk_missing
from .nvidia.session import TrtSession, cudart

log = logging.getLogger(__name__)

OPTIONS = {
    "strip_weights": True,
    "refittable": False,
    "version_compatible": False,
    "weight_streaming": False,
    "opt_profiles": OPT_RULES,  # optimization profiles per plan (nvidia/profiles.py): the opt plus its edges at the max
}
FAMILY_FLOORS = {"ampere+": (8, 0)}
TIMING_PREFIX = "tensorrt-timing"
# The oldest driver each CUDA major runs on with minor-version compatibility (CUDA release notes), Linux x86-64.
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}


def _cuda_major() -> int | None:
    """The CUDA major TensorRT was installed for, from its wheel's name (tensorrt-cu12-libs, ...)."""
    from importlib import metadata

    for dist in metadata.distributions():
        match = re.fullmatch(r"tensorrt[-_]cu(\d+)([-_]libs)?", (dist.metadata["Name"] or "").lower())
        if match:
            return int(match.group(1))
    return None


# The timing cache in the store: caches/tensorrt-timing/<build GPU arch>/trt-<version>/<sha256>. Each build
# merges the newest objects under its prefix (ITimingCache.combine; `enginefarm gc` prunes older ones) and publishes
# what it measured as a new content-addressed object, written once: no shared object is ever rewritten, and racing
# builders only add.
def _timing_dir(workdir: Path) -> Path:
    return workdir.parent / "tensorrt-timing"


def _timing_prefix() -> str | None:
    arch = build_host_arch()
    return None if arch is None else f"{TIMING_PREFIX}/{arch}/trt-{BACKEND.versions()['tensorrt']}"


class TensorRT(NvidiaBackend):
    name = "tensorrt"
    sdk_module = "tensorrt"
    devices = re.compile(r"^(sm_\d{2,3}|ampere\+)$")
    device_hint = "sm_XX for one GPU architecture (sm_86, sm_89, sm_120) or ampere+ for hardware-compatible plans"
    options = OPTIONS
    family_floors = FAMILY_FLOORS
    features = frozenset({Feature.REFIT, Feature.BUILD_CACHE})

    def available(self, device: str) -> Availability:
        try:
            trt = self.sdk()
        except BackendUnavailable as exc:
            return sdk_missing(exc, matching_gpu(device, FAMILY_FLOORS)[1])
        gpu, why = matching_gpu(device, FAMILY_FLOORS)
        if gpu is None:
            return Availability.missing(f"TensorRT {trt.__version__} is installed, but {why}")
        try:
            cudart()
        except BackendUnavailable as exc:
            return Availability.missing(f"{exc} (needed to run plans)")
        return Availability(True, True)

    def constraints(self, job: BuildJob) -> dict:
        version = self.versions()["tensorrt"]
        options = {**option_defaults(OPTIONS), **job.options}
        # A plan runs only on the TensorRT that built it, unless it is version-compatible: then on any newer one of
        # the same major version.
        runtime = f">={version},<{int(version.split('.')[0]) + 1}" if options["version_compatible"] else f"=={version}"
        found = {
            "runtime": {"tensorrt": runtime},
            "os": [platform.system().lower()],
            "engine": {
                "arch": job.target.device,
                "hardware_compatibility": "ampere+" if job.target.device == "ampere+" else "none",
                "version_compatible": options["version_compatible"],
                "weights": "stripped, refitted on load" if options["strip_weights"] else "embedded",
            },
        }
        driver = MIN_DRIVER.get(_cuda_major() or 0)
        if driver and platform.system() == "Linux":
            found["min_driver"] = driver
        return found

    def build(self, prepared_onnx: Path, job: BuildJob, workdir: Path) -> Built:
        options = {**option_defaults(OPTIONS), **job.options}
        timing = _timing_dir(workdir)
        return build_engine(
            "tensorrt",
            prepared_onnx,
            job,
            workdir,
            options,
            version_compatible=options["version_compatible"],
            hardware_compatible=job.target.device == "ampere+",
            timing_caches=[str(p) for p in sorted((timing / "fetched").glob("*.cache"))],
            timing_cache_out=str(timing / "updated.cache"),
        )

    def open(self, artifact_dir: Path, manifest, weights: dict[str, np.ndarray] | None) -> TrtSession:
        trt = self.sdk()
        engine, gpu, how = open_engine(
            trt, artifact_dir, manifest, {**OPTIONS, **manifest.options}, FAMILY_FLOORS, "plan", weights
        )
        context, shared = new_context(trt, engine)  # the pipeline's shared activation buffer, when it shares one
        return TrtSession(
            trt,
            engine,
            context,
            manifest.precision,
            how=how,
            device_index=gpu["index"],
            shared=shared,
            plan_bytes=plan_size(manifest),
        )

    def before_build(self, store, job: BuildJob, workdir: Path) -> None:
        prefix = _timing_prefix()
        if prefix is None:
            return
        folder = _timing_dir(workdir) / "fetched"
        folder.mkdir(parents=True, exist_ok=True)
        for name in newest_cache_objects(store.list_cache_entries(prefix)):  # each is a merged superset of older ones
            digest = name.rsplit("/", 1)[-1]
            data = store.get_cache_object(name)
            if data is None or hashlib.sha256(data).hexdigest() != digest:
                log.warning("timing cache %s does not match its name; not used", name)
                continue
            (folder / f"{digest}.cache").write_bytes(data)

    def after_build(self, store, job: BuildJob, workdir: Path) -> None:
        prefix = _timing_prefix()
        updated = _timing_dir(workdir) / "updated.cache"
        if prefix is None or not updated.is_file():
            return
        data = updated.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if (_timing_dir(workdir) / "fetched" / f"{digest}.cache").exists():
            return  # nothing new was measured
        store.put_cache_object(f"{prefix}/{digest}", data)

    def rank(self, device_class: str) -> Rank:
        return Rank.HARDWARE_COMPATIBLE if device_class.endswith("+") else Rank.EXACT_ARCH


BACKEND = TensorRT()
