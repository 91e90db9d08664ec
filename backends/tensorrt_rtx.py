"""NVIDIA TensorRT-RTX: ahead-of-time builds on a CPU (no GPU needed), specialized on the device at first run.

A target names compute capabilities: `sm_XX` for one, or a family class (`turing+`, `ampere+`, `ada+`,
`blackwell+`) for every capability the installed TensorRT-RTX knows from that floor up (`ampere+` is the SDK's
default: 8.6 and later, future GPUs included). Kernels are compiled
just in time on the user's GPU; they are kept in a runtime cache in the local cache (ENGINEFARM_HOME), one per
(TensorRT-RTX version, GPU arch, driver, artifact), loaded before the first run and saved atomically after
each run with new input shapes.

Recipe options (`[components.NAME.options.tensorrt-rtx]`, in the build key): strip_weights and refittable, both false
by default, because TensorRT-RTX needs a GPU to build either ("CPU-only AoT does not support executing Myelin weights
engines"): such jobs go to runners with an NVIDIA GPU, and a farm without one refuses them at plan time. opt_profiles:
"opt" (one optimization profile, the default) or "edges" (nvidia/profiles.py).

What the SDK refuses whatever the host: fp32 GEMMs (MatMul, Gemm, Einsum of two operands) for Turing (SM75). Jobs
that would ask for that are refused at plan time, naming the model's nodes.
"""

from __future__ import annotations

import logging
import platform
import re
from pathlib import Path

import numpy as np

from enginefarm.cache.atomic import write_bytes_atomic
from enginefarm.errors import BackendUnavailable, BuildError

from .base import Availability, Built, Feature, Rank, option_defaults
from .build_job import BuildJob, PlannedJob
from .nvidia.activations import new_context, plan_size
from .nvidia.backend import NvidiaBackend
from .nvidia.build import BuildProgress, build_engine
from .nvidia.devices import matching_gpu
from .nvidia.plan import open_engine
from .nvidia.profiles import OPT_RULES
from .nvidia.sdk import sdk_missing
from .nvidia.session import TrtSession, cuda_devices, cudart

log = logging.getLogger(__name__)

# opt_profiles: one by default, as the runtime compiles kernels for the very shapes it meets (SPECIALIZATION below);
# "edges" builds TensorRT's several (nvidia/profiles.py) where someone measures a gain.
OPTIONS = {"strip_weights": False, "refittable": False, "weight_streaming": False, "opt_profiles": OPT_RULES[::-1]}
GPU_BUILD_OPTIONS = ("strip_weights", "refittable")  # what TensorRT-RTX cannot build without a GPU
# TensorRT-RTX runs on RTX GPUs: Turing (7.5), then Ampere from 8.6 (8.0 is a datacenter part it does not list).
FAMILY_FLOORS = {"turing+": (7, 5), "ampere+": (8, 6), "ada+": (8, 9), "blackwell+": (12, 0)}
NOT_RTX = {80}  # capabilities the SDK can name that family classes leave out


# How the runtime specialises kernels to the input shapes it meets (ENGINEFARM_TRT_RTX_SPECIALIZATION, read at load):
# "eager" (our default) compiles the kernels for a new shape before its first run, so every run of that shape, the
# first step of an image included, runs kernels specialised to it, the same ones from run to run, and the runtime
# cache saved after that run holds them; "lazy" (the SDK's default) runs generic kernels while compiling in the
# background, so the runs of one image may switch kernels midway and the cache saved after the first run may lack
# them; "none" never specialises.
SPECIALIZATION_ENV = "ENGINEFARM_TRT_RTX_SPECIALIZATION"
SPECIALIZATIONS = ("eager", "lazy", "none")


def kernel_specialization() -> str:
    """The strategy ENGINEFARM_TRT_RTX_SPECIALIZATION names ("eager" when unset); another value is a ConfigError."""
    import os

    from enginefarm.errors import ConfigError

    mode = os.environ.get(SPECIALIZATION_ENV, "").strip().lower() or SPECIALIZATIONS[0]
    if mode not in SPECIALIZATIONS:
        raise ConfigError(
            f"{SPECIALIZATION_ENV}={mode!r}", hint=f"use one of {', '.join(SPECIALIZATIONS)} (or leave it unset: eager)"
        )
    return mode


# Unlike TensorRT's, these are the real wheels, on PyPI (tensorrt_rtx_cu13 libs + bindings: 244 MB installed, measured).
INSTALL_NOTE = "real wheels from PyPI, 244 MB installed; it builds engines without a GPU"


TURING = ("sm_75", "turing+")  # the device classes whose engines include SM75


# The SDK's words for failures whose fix we know.
FAILURE_HINTS = {
    "FP32 GEMM is not supported": "Turing (SM75) runs GEMMs in fp16 only: build this target in fp16, or target "
    "ampere+ for fp32",
    "MyelinCheckException": "without a GPU TensorRT-RTX cannot build weight-stripped or refittable engines: set "
    "strip_weights = false and refittable = false, or build on a runner with an NVIDIA GPU",
}


def compute_capabilities(trt, device: str) -> list[str]:
    """ComputeCapability member names for a device class, from what this TensorRT-RTX knows. `ampere+` names none:
    the SDK's default engine runs on 8.6 and every later capability, future GPUs included."""
    members = getattr(trt.ComputeCapability, "__members__", {})
    known = {name: int(name[2:]) for name in members if re.fullmatch(r"SM\d+", name)}
    if device.startswith("sm_"):
        name = "SM" + device[3:]
        if name not in known:
            raise BuildError(
                f"TensorRT-RTX {trt.__version__} cannot target {device}",
                hint=f"it knows: {', '.join(sorted(known, key=lambda n: known[n]))}",
            )
        return [name]
    if device == "ampere+":
        return []
    major, minor = FAMILY_FLOORS[device]
    return sorted(
        (n for n, cc in known.items() if cc >= major * 10 + minor and cc not in NOT_RTX), key=lambda n: known[n]
    )


def runtime_cache_path(manifest, gpu: dict) -> Path:
    """Where this device keeps the JIT kernels of one artifact: never shared between GPUs, drivers or SDK versions."""
    from enginefarm.settings import load_settings

    slot = f"rtx-{BACKEND.versions()['tensorrt-rtx']}-{gpu['arch']}-driver-{gpu['driver']}"
    return (
        load_settings().home
        / "tensorrt-rtx-runtime-cache"
        / re.sub(r"[^A-Za-z0-9_.+-]", "_", slot)
        / f"{manifest.build_key}.bin"
    )


class TensorRTRTX(NvidiaBackend):
    name = "tensorrt-rtx"
    sdk_module = "tensorrt_rtx"
    install_note = INSTALL_NOTE
    devices = re.compile(r"^(sm_\d{2,3}|ampere\+|turing\+|ada\+|blackwell\+)$")
    device_hint = "sm_XX or a family class: turing+, ampere+, ada+, blackwell+"
    options = OPTIONS
    family_floors = FAMILY_FLOORS
    left_out = frozenset(NOT_RTX)
    computes = frozenset({"fp32", "fp16", "bf16"})  # bf16 from Ampere on (precision_refusal)
    # Custom weights and LoRAs on an engine built without refit (every engine a CPU farm builds) are compiled on the
    # device from the component's ONNX (runner/recompile.py); where CUDA has a GPU, refittable, so the next stack is a
    # refit.
    features = frozenset(
        {Feature.REFIT, Feature.OWN_VALIDATION, Feature.BUILDS_WITHOUT_DEVICE, Feature.COMPILES_STACKS_ON_DEVICE}
    )

    def available(self, device: str) -> Availability:
        try:
            trt = self.sdk()
        except BackendUnavailable as exc:
            return sdk_missing(exc, note=INSTALL_NOTE)
        gpu, why = matching_gpu(device, FAMILY_FLOORS)
        if gpu is None:
            return Availability(
                True, False, f"builds here without a GPU (TensorRT-RTX {trt.__version__}), cannot run here: {why}"
            )
        try:
            cudart()
        except BackendUnavailable as exc:
            return Availability(True, False, f"{exc} (needed to run plans)")
        return Availability(True, True)

    def constraints(self, job: BuildJob) -> dict:
        # Engines are not compatible across TensorRT-RTX releases.
        return {
            "runtime": {"tensorrt-rtx": "==" + self.versions()["tensorrt-rtx"]},
            "os": [platform.system().lower()],
            "engine": {
                "compute_capabilities": compute_capabilities(self.sdk(), job.target.device)
                or ["SM86 and later (SDK default)"],
                "weights": "stripped, refitted on load" if {**OPTIONS, **job.options}["strip_weights"] else "embedded",
            },
        }

    def build(
        self, prepared_onnx: Path, job: BuildJob, workdir: Path, *, progress: BuildProgress | None = None
    ) -> Built:
        options = {**option_defaults(OPTIONS), **job.options}
        return build_engine(
            "tensorrt_rtx",
            prepared_onnx,
            job,
            workdir,
            options,
            hints=FAILURE_HINTS,
            progress=progress,
            compute_capabilities=compute_capabilities(self.sdk(), job.target.device),
        )

    def open(self, artifact_dir: Path, manifest, weights: dict[str, np.ndarray] | None) -> TrtSession:
        """The engine, with this device's runtime cache of JIT-compiled kernels loaded and saved after new shapes,
        specialising its kernels to each new shape as ENGINEFARM_TRT_RTX_SPECIALIZATION says (eager by default)."""
        specialization = kernel_specialization()  # a wrong value is refused before anything is read
        trt = self.sdk()
        engine, gpu, how = open_engine(
            trt, artifact_dir, manifest, {**OPTIONS, **manifest.options}, FAMILY_FLOORS, "engine", weights
        )
        config = engine.create_runtime_config()
        strategies = getattr(trt, "DynamicShapesKernelSpecializationStrategy", None)
        if strategies is not None:
            config.dynamic_shapes_kernel_specialization_strategy = getattr(strategies, specialization.upper())
            how += f", {specialization} kernel specialisation"
        cache = config.create_runtime_cache()
        path = runtime_cache_path(manifest, gpu)
        if path.is_file() and not cache.deserialize(path.read_bytes()):
            log.warning(
                "%s %s: runtime cache %s was not usable; starting a new one", manifest.ref, manifest.target, path
            )
        config.set_runtime_cache(cache)
        seen: set = set()

        def save_new_kernels(shapes: dict) -> None:
            signature = tuple(sorted(shapes.items()))
            if signature not in seen:  # kernels are compiled per new shape; the same shapes add nothing
                seen.add(signature)
                write_bytes_atomic(path, bytes(cache.serialize()))

        context, shared = new_context(trt, engine, config)  # the pipeline's shared activation buffer, if any
        return TrtSession(
            trt,
            engine,
            context,
            manifest.precision,
            how=f"{how}, runtime cache {path.name}",
            after_run=save_new_kernels,
            device_index=gpu["index"],
            shared=shared,
            plan_bytes=plan_size(manifest),
        )

    artifact_noun = "engine"

    def validation_session(self, artifact_dir: Path, manifest, device: str):
        """The engine itself where its GPU is here; built on a CPU host, it is published unvalidated, saying why."""
        here = self.available(device)
        if not here.can_load:
            return None, {"why": f"built without the device to run it ({here.reason})"}
        return self.open(Path(artifact_dir), manifest, None), {}

    def gpu_build_reason(self, job: PlannedJob) -> tuple[str, str] | None:
        """(why, fix) when this job needs an NVIDIA GPU on the build host; None when any CPU with the SDK builds it."""
        options = {**option_defaults(OPTIONS), **job.options}
        wanted = [name for name in GPU_BUILD_OPTIONS if options[name]]
        if not wanted:
            return None
        why = (
            f"{' and '.join(f'{n} = true' for n in wanted)} needs an NVIDIA GPU at build time (TensorRT-RTX builds "
            "no weight-stripped or refittable engine without one)"
        )
        fix = (
            f"set {' and '.join(f'{n} = false' for n in wanted)} in [components.{job.component}.options.tensorrt-rtx] "
            "to build on a CPU, "
            "or build on a runner with an NVIDIA GPU"
        )
        return why, fix

    def can_build_refittable(self) -> bool:
        return cuda_devices() > 0

    def check_job(self, job: PlannedJob) -> str:
        """Why this job cannot be built on this machine ("" if it can): a GPU-only option and no NVIDIA GPU here."""
        needs = self.gpu_build_reason(job)
        if needs is None:
            return ""
        from enginefarm.hardware.device_info import nvidia_gpus

        gpus, why = nvidia_gpus()
        return "" if gpus else f"{needs[0]}, and this machine has none ({why})"

    def refusal(self, job: PlannedJob) -> tuple[str, str] | None:
        """(why, fix) when TensorRT-RTX would refuse this job on any host: fp32 GEMMs for Turing (SM75)."""
        if job.precision != "fp32" or job.target.device not in TURING:
            return None
        from enginefarm.formats.onnx_io import float32_gemms

        nodes = float32_gemms(job.source.path)
        if not nodes:
            return None
        shown = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
        return (
            f"TensorRT-RTX cannot compile fp32 GEMMs for Turing (SM75): 'FP32 GEMM is not supported' for {shown}",
            f'build {job.target} in fp16 (precisions = ["fp16"]), or target ampere+ for fp32',
        )

    def precision_refusal(self, precision: str, device: str) -> str | None:
        # Measured with TensorRT-RTX 1.7: a bf16 network for SM75 fails with "the model contains HW-specific datatypes:
        # b16".
        if precision == "bf16" and device in ("sm_75", "turing+"):
            return (
                "Turing GPUs (SM 7.5) have no bf16 math: TensorRT-RTX refuses to compile bf16 for them; use "
                "ampere+ (or fp16)"
            )
        return super().precision_refusal(precision, device)

    def rank(self, device_class: str) -> Rank:
        return Rank.JIT


BACKEND = TensorRTRTX()
