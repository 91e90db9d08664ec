"""Intel OpenVINO: IR (xml + bin) with dynamic bounds from the profile, plus a compiled CPU blob when it loads
faster."""

from __future__ import annotations

import logging
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from enginefarm.cache.space import ensure_room, sdk_writes
from enginefarm.errors import BackendUnavailable
from enginefarm.hardware.device_info import cpu_description
from enginefarm.sessions.openvino import OpenVinoSession, open_ir

from .base import Availability, Backend, Built, BuiltFile, BundleSpec, Feature, Rank
from .build_job import BuildJob
from .manifest_files import role_file
from .openvino_disk import build_bytes
from .openvino_disk import hint as disk_hint

log = logging.getLogger(__name__)

BLOB_MIN_GAIN = 0.9  # ship the compiled blob only if importing it takes < 90% of compiling the IR
# Above this many bytes of IR weights the blob trial is skipped: a compiled blob holds the weights again, so
# importing it costs what reading them does, and it never won on SD 1.5 (import / compile: VAE decoder 198 MB
# 296-486 / 202-211 ms, text encoder 492 MB 446-1214 / 459-566 ms), while the trial (two compiles, two imports,
# the blob in memory) cost the UNet 17-36 s and doubled the text encoder's peak memory
# (docs/large-models.md, "Size rules").
BLOB_TRIAL_MAX_BYTES = 128 << 20


# The CPU instructions OpenVINO's CPU plugin computes bf16 with (it lists BF16 among its capabilities then).
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


_HINTS = {"fp16": ("FP16", "f16"), "bf16": ("BF16", "bf16")}


def inference_config(core, device: str, precision: str) -> dict[str, str]:
    """Ask for the precision the artifact promises; OpenVINO's CPU plugin would otherwise pick bf16 on some CPUs.
    Where the device cannot compute in it, f32 (and the session's compute_precision says so)."""
    hint = "f32"
    if precision in _HINTS:
        capability, wanted = _HINTS[precision]
        caps = core.get_property(device, "OPTIMIZATION_CAPABILITIES") if device == "CPU" else ["FP16"]
        hint = wanted if capability in caps else "f32"
    return {"INFERENCE_PRECISION_HINT": hint, "PERFORMANCE_HINT": "LATENCY"}


def _maybe_blob(core, xml: Path, precision: str, workdir: Path) -> tuple[list[BuiltFile], dict]:
    """The compiled blob when importing it beats compiling the IR, and the build notes that say how it went."""
    weights = xml.with_suffix(".bin").stat().st_size
    if weights > BLOB_TRIAL_MAX_BYTES:
        log.info("openvino: %.1f GiB of weights: no compiled-blob trial, IR only", weights / 2**30)
        return [], {
            "blob_shipped": False,
            "blob_trial": f"skipped: {weights / 2**30:.1f} GiB of weights (limit {BLOB_TRIAL_MAX_BYTES / 2**30:.1f} "
            "GiB)",
        }
    config = inference_config(core, "CPU", precision)
    compile_ms, compiled = _best_of(2, lambda: core.compile_model(core.read_model(str(xml)), "CPU", config))
    blob = workdir / "model.blob"
    exported = compiled.export_model()
    blob.write_bytes(exported.getvalue() if hasattr(exported, "getvalue") else exported)
    import_ms, _ = _best_of(2, lambda: core.import_model(blob.read_bytes(), "CPU", config))
    used = import_ms < BLOB_MIN_GAIN * compile_ms
    notes = {
        "openvino_compile_ms": round(compile_ms, 1),
        "openvino_import_ms": round(import_ms, 1),
        "blob_shipped": used,
    }
    log.info(
        "openvino: compile IR %.0f ms, import blob %.0f ms → %s",
        compile_ms,
        import_ms,
        "ship blob" if used else "IR only",
    )
    if not used:
        blob.unlink()
        return [], notes
    return [BuiltFile("model.blob", "engine")], notes


def _best_of(n: int, fn):
    best, result = float("inf"), None
    for _ in range(n):
        start = time.perf_counter()
        result = fn()
        best = min(best, (time.perf_counter() - start) * 1000)
    return best, result


def blob_compatible(manifest) -> str | None:
    """Why the shipped blob cannot be used here, or None if it can."""
    wanted = manifest.constraints.get("engine", {})
    if wanted.get("openvino") != BACKEND.versions()["openvino"]:
        return f"blob is for OpenVINO {wanted.get('openvino')}, this is {BACKEND.versions()['openvino']}"
    if wanted.get("cpu_flags") != cpu_description()["flags"]:
        return "blob was compiled for a CPU with other instruction sets"
    return None


def _ir(artifact_dir: Path, manifest) -> Path:
    return Path(artifact_dir) / role_file(manifest, "ir")


# An app bundle (`enginefarm bundle`) holds the core library, the IR frontend (artifacts are IR), TBB and the plugin of
# its device class. Left out: the model frontends (ONNX, TensorFlow, TF Lite, Paddle, PyTorch, JAX, GGUF read models,
# an artifact is IR already), the other devices' plugins, AUTO/HETERO/BATCH (load() names the device), the C API,
# headers, cmake files, type stubs, the torch.compile backend and tools/ (the ovc converter: it alone imports
# openvino-telemetry and packaging). Globs are written for the wheels' file names on Linux, macOS and Windows.
_OV_DROP = (
    "openvino/libs/*",
    "openvino/frontend/*/*",
    "openvino/tools/*",
    "openvino/include/*",
    "openvino/cmake/*",
    "openvino/torch/*",
    "*.pyi",
)
_OV_CORE = (
    "openvino/libs/*openvino.*",
    "openvino/libs/*openvino_ir_frontend*",
    "openvino/libs/*tbb*.so*",
    "openvino/libs/*tbb*.dll",
    "openvino/libs/*tbb*.dylib",
    "openvino/libs/*hwloc*",
)


def _ov_bundle(device: str, plugin: str, needs: str, cache: tuple[str, ...] = ()) -> BundleSpec:
    return BundleSpec(
        ("openvino",),
        drop=_OV_DROP,
        keep=(*_OV_CORE, f"openvino/libs/*openvino_intel_{plugin}_plugin*", *cache),
        runs_here=device == "CPU",
        notes=needs,
    )


class OpenVINO(Backend):
    probes = ("cpu", "intel")
    name = "openvino"
    sdk_module = "openvino"
    devices = re.compile(r"^(cpu|gpu|npu)$")
    device_hint = "cpu, gpu or npu"
    install = "pip install 'enginefarm[openvino]'"
    onnx_precision = "fp32"  # fp16 is done by OpenVINO's own weight compression
    # its fp32 validation holds the IR's weights and the compiled model's at once: SDXL's UNet (10.3 GB) peaked at
    # 19.4 GB (1.88x), SD 1.5's at 2.35x its weights with an unfused 512 px reference (docs/large-models.md)
    build_memory_factor = 2.2
    computes = frozenset({"fp32", "fp16", "bf16"})  # bf16 on CPUs with avx512_bf16 or AMX only (precision_here)
    features = frozenset({Feature.PATCH_WEIGHTS, Feature.WEIGHTS_AT_LOAD})
    vendor_label = "intel"
    bundles = {
        "cpu": _ov_bundle("CPU", "cpu", ""),
        # cache.json: the GPU plugin's kernel tuning cache.
        "gpu": _ov_bundle(
            "GPU",
            "gpu",
            "an Intel GPU driver with its OpenCL runtime (libOpenCL.so.1 / OpenCL.dll) from the system",
            ("openvino/libs/cache.json",),
        ),
        "npu": _ov_bundle("NPU", "npu", "the Intel NPU driver from the system"),
    }

    _spare_core = None  # the Core `available` opened, handed to the next `load`: a Core costs 20-60 ms to create

    def available(self, device: str) -> Availability:
        try:
            ov = self.sdk()
            core = self._spare_core = self._spare_core or ov.Core()
            devices = core.available_devices
        except BackendUnavailable as exc:
            return Availability.missing(str(exc))
        want = device.upper()
        if not any(d.split(".")[0] == want for d in devices):
            return Availability.missing(f"no OpenVINO {want} device here (found: {', '.join(devices) or 'none'})")
        return Availability(True, True)

    def versions(self) -> dict[str, str]:
        from enginefarm.backends.upsample_conv import FOLD_VERSION

        return {"openvino": self.sdk().get_version().split("-")[0], "upsample_fold": FOLD_VERSION}

    def constraints(self, job: BuildJob) -> dict:
        # IR is read by the same or a newer OpenVINO. A compiled blob, if one ships, only by the identical
        # OpenVINO on a CPU with the same instruction sets; elsewhere the loader compiles the IR instead.
        found: dict[str, Any] = {"runtime": {"openvino": ">=" + self.versions()["openvino"]}}
        if job.target.device == "cpu":
            found["engine"] = {"openvino": self.versions()["openvino"], "cpu_flags": cpu_description()["flags"]}
            if job.precision == "bf16":  # elsewhere it would compute in fp32: the fp32 artifact, slower to fetch
                found["cpu_flags_any"] = list(BF16_CPU_FLAGS)
        return found

    def build(self, prepared_onnx: Path, job: BuildJob, workdir: Path) -> Built:
        from enginefarm.backends.upsample_conv import fold_upsample_convs
        from enginefarm.formats.onnx_data import write_rewritten

        ov = self.sdk()
        core = ov.Core()
        folded_dir = workdir / ".upsample-folded"  # the graph only: its weights stay linked to the prepared files
        try:
            folded = write_rewritten(prepared_onnx, folded_dir, fold_upsample_convs, keep_unchanged=False)
            source = folded_dir / prepared_onnx.name if folded else prepared_onnx
            return self._build(ov, core, source, job, workdir, {"upsample_convs_folded": folded} if folded else {})
        finally:
            shutil.rmtree(folded_dir, ignore_errors=True)

    def _build(self, ov, core, prepared_onnx: Path, job: BuildJob, workdir: Path, rewrites: dict) -> Built:
        model = core.read_model(str(prepared_onnx))
        bounds = {}
        for name, shapes in job.profile.items():
            dims = [
                ov.Dimension(lo) if lo == hi else ov.Dimension(lo, hi)
                for lo, hi in zip(shapes["min"], shapes["max"], strict=True)
            ]
            bounds[name] = ov.PartialShape(dims)
        model.reshape(bounds)
        xml = workdir / "model.xml"
        kept: dict = dict(rewrites)
        staged: tuple = ()
        fp16 = job.precision == "fp16"
        names = None
        if fp16 and job.fp16_keep:  # the recipe's keep-list, as the ONNX fp16 builds keep it
            from .openvino_precise import precise_names

            names = precise_names(prepared_onnx, job.fp16_keep)
        need = build_bytes(model, fp16, names)
        ensure_room(workdir, need, hint=disk_hint(workdir))  # refused now, not after the SDK wrote most of it
        with sdk_writes(workdir, need, disk_hint(workdir)):
            if names is not None:
                from .openvino_precise import keep_fp32

                model, count, staged = keep_fp32(ov, core, model, names, workdir)
                kept = {"fp16_kept_fp32": count}
            ov.save_model(model, str(xml), compress_to_fp16=fp16)
        files = [BuiltFile("model.xml", "ir"), BuiltFile("model.bin", "weights")]
        del model  # the graph and its weights: the blob trial reads the saved IR
        for path in staged:
            path.unlink(missing_ok=True)
        if job.target.device != "cpu":
            return Built(files, kept)
        blob, notes = _maybe_blob(core, xml, job.precision, workdir)
        return Built(files + blob, {**notes, **kept})

    def _core(self):
        """The Core `available` just listed devices with (used once: no Core outlives the load that took it), else a
        new one."""
        core, self._spare_core = self._spare_core, None
        return core or self.sdk().Core()

    def load(self, artifact_dir: Path, manifest, device: str = "cpu") -> OpenVinoSession:
        """The shipped blob imported where it is for this OpenVINO and CPU, else the IR compiled through the
        device's compiled-model cache in the artifact's folder (sessions/openvino_compiled.py)."""
        core = self._core()
        dev = manifest.parsed_target.device.upper()
        config = inference_config(core, dev, manifest.precision)
        root = Path(artifact_dir)
        plan = {
            "module": "enginefarm.sessions.openvino",
            "device": dev,
            "config": config,
            "ir": role_file(manifest, "ir"),
        }
        blob = next((f.path for f in manifest.files if f.role == "engine"), None)
        if blob and dev == "CPU":
            why_not = blob_compatible(manifest)
            if why_not is None:
                try:
                    session = open_ir(core, root, {**plan, "blob": blob})
                    session.reopen_plan = {**plan, "blob": blob}
                    return session
                except RuntimeError as exc:
                    log.warning(
                        "openvino: cannot import the compiled blob (%s); compiling the IR", str(exc).splitlines()[0]
                    )
            else:
                log.info("openvino: %s; compiling the IR", why_not)
        session = open_ir(core, root, plan)
        session.reopen_plan = plan
        return session

    def precision_refusal(self, precision: str, device: str) -> str | None:
        if precision == "bf16" and device == "gpu":
            return (
                "OpenVINO's GPU plugin computes in f32 or f16 only (its documented inference precisions); build "
                "fp16 for openvino:gpu"
            )
        if precision == "bf16" and device == "npu":
            return "OpenVINO's NPU computes in fp16 or int8, not bf16; build fp16 for openvino:npu"
        return super().precision_refusal(precision, device)

    def precision_here(self, precision: str, device: str) -> str | None:
        """A bf16 artifact built on a CPU without bf16 would be validated and benchmarked in fp32: not here."""
        if precision != "bf16" or device != "cpu":
            return None
        caps = self.sdk().Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
        if "BF16" in caps:
            return None
        return (
            f"this CPU cannot compute in bf16 (no {' or '.join(BF16_CPU_FLAGS)}), so a bf16 artifact could be neither "
            "validated "
            "nor benchmarked here; build it on a runner whose CPU has one"
        )

    # Custom weights: read and patched in the IR's files (openvino_ir.py), or replaced in memory at load. Imported
    # here, not at the top: its XML parser is no part of loading a plain artifact.
    def weight_shapes(self, artifact_dir: Path, manifest) -> dict[str, tuple[int, ...]]:
        from . import openvino_ir

        return openvino_ir.float_shapes(_ir(artifact_dir, manifest))

    def read_weights(self, artifact_dir: Path, manifest, names) -> dict[str, np.ndarray]:
        from . import openvino_ir

        return openvino_ir.read(_ir(artifact_dir, manifest), names)

    def patch_weights(
        self, artifact_dir: Path, manifest, weights: dict[str, np.ndarray], outdir: Path
    ) -> list[BuiltFile]:
        """A copy of the IR with `weights` (float32, ONNX layout) in its constants, recompiled like a fresh build."""
        from . import openvino_ir

        out_xml, out_bin = openvino_ir.write_patched(_ir(artifact_dir, manifest), weights, outdir)
        files = [BuiltFile(out_xml.name, "ir"), BuiltFile(out_bin.name, "weights")]
        if any(f.role == "engine" for f in manifest.files) and manifest.parsed_target.device == "cpu":
            files += _maybe_blob(self.sdk().Core(), out_xml, manifest.precision, outdir)[0]
        return files

    def load_with_weights(
        self, artifact_dir: Path, manifest, weights: dict[str, np.ndarray], device: str = "cpu"
    ) -> OpenVinoSession:
        """The IR read into memory, the constants named by `weights` (ONNX layout, float32 or the constant's own
        type) replaced by new ones of their own element type, then compiled: nothing is written. A value already in
        the constant's type is shared with it, not copied (a UNet's merged weights are hundreds of MB), and the session
        holds it as long as the compiled model may read it."""
        from openvino.utils import replace_node

        from enginefarm.errors import IntegrityError

        ov = self.sdk()
        core = ov.Core()
        dev = manifest.parsed_target.device.upper()
        model = core.read_model(str(_ir(artifact_dir, manifest)))
        left, held = dict(weights), []
        for node in model.get_ordered_ops():
            if node.get_type_name() != "Constant":
                continue
            names = node.output(0).get_names()
            hit = next((n for n in names if n in left), None)
            if hit is None:
                continue
            dtype = np.float16 if node.get_output_element_type(0) == ov.Type.f16 else np.float32
            held.append(np.ascontiguousarray(left.pop(hit).reshape(tuple(node.get_output_shape(0))), dtype=dtype))
            fresh = ov.op.Constant(held[-1], shared_memory=True)
            fresh.output(0).set_names(names)
            replace_node(node, fresh)
        if left:
            raise IntegrityError(
                f"{manifest.ref} [{manifest.build_key[:12]}]: no constant of the IR holds {sorted(left)[:5]}"
            )
        compiled = core.compile_model(model, dev, inference_config(core, dev, manifest.precision))
        return OpenVinoSession(compiled, "compiled IR with new weights in memory", held)

    def bundle_probe(self, device_class: str) -> dict:
        """Load the device's plugin through the Core, as compile_model would: OpenVINO resolves the registered plugin
        to its file in the bundle and loads it with its dependencies, or says which library the system lacks."""
        ov = self.sdk()
        core, device = ov.Core(), device_class.upper()
        try:
            version = core.get_versions(device)[device]
        except (
            RuntimeError
        ) as exc:  # 'Cannot load library "<plugin>": libOpenCL.so.1: cannot open shared object file: …'
            found = re.search(r'Cannot load library "([^"]+)": ([^:\s]+):', str(exc))
            if found is None:
                raise
            plugin, missing = found.groups()
            return {
                "loads": False,
                "plugin": plugin,
                "missing": missing,
                "line": f"the {device} plugin is registered and found in the bundle ({Path(plugin).name}); it needs "
                f"{missing} from the system to load, which this machine lacks",
            }
        return {
            "loads": True,
            "plugin": version.description,
            "missing": None,
            "line": f"the {device} plugin loads ({version.description} {version.build_number}); devices here: "
            f"{', '.join(core.available_devices) or 'none'}",
        }

    def device_classes(self, device) -> tuple[str, ...]:
        """The CPU, and the Intel GPUs and NPUs OpenVINO itself lists (hardware/devices.py: intel-gpu, intel-npu)."""
        return {"cpu": ("cpu",), "intel-gpu": ("gpu",), "intel-npu": ("npu",)}.get(device.kind, ())

    def rank(self, device_class: str) -> Rank:
        return Rank.PORTABLE_IR


BACKEND = OpenVINO()
