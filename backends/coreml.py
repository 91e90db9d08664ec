"""Apple Core ML: ONNX → torch (onnx2torch) → coremltools ML program (.mlpackage), stored as one tar file.

The package is a folder, so the artifact is `model.mlpackage.tar` (role "model"), packed deterministically by
`enginefarm.cache.archive` and extracted, safely, only after the device cache has hashed it. Conversion runs on
any OS; Core ML itself runs only on macOS. Off macOS the build validates what it can run: the traced torch module
that coremltools converted, against the fp32 ONNX Runtime reference, plus the package's spec (names, shapes).
The manifest's validation says that the package itself was not executed.
"""

from __future__ import annotations

import json
import logging
import platform
import re
import shutil
import tempfile
import weakref
from pathlib import Path

import numpy as np

from enginefarm.cache.archive import extract, pack_dir
from enginefarm.errors import BackendUnavailable, BuildError

from ._coreml_sdk import INSTALL, IO_DTYPES, coremltools, quiet_convert, sdk_problem
from .base import Availability, Backend, Built, BuiltFile, Feature, Rank
from .build_job import BuildJob, PlannedJob
from .manifest_files import role_file

log = logging.getLogger(__name__)

# Recipe options ([components.X.options.coreml]); a tuple lists the allowed values, the first is the default.
OPTIONS = {
    "shapes": ("range", "enumerated"),  # flexible inputs as RangeDim bounds, or only the profile's min/opt/max shapes
    "deployment_target": ("macOS13", "macOS14", "macOS15"),
}
PACKAGE = "model.mlpackage"
ARCHIVE = PACKAGE + ".tar"
TRACED = "coreml-traced.pt"  # beside the artifact folder: what was converted, for validation off macOS


# Build ------------------------------------------------------------------------------------------------------


def normalize_package(package: Path) -> None:
    """Make the same conversion give the same bytes (and the same blob digest): coremltools names the package's
    items with random UUIDs (named here by path instead), and writes the spec's protobuf maps in an order that
    changes between processes (rewritten here with deterministic serialization, which sorts map keys)."""
    import uuid

    from coremltools.proto import Model_pb2

    path = package / "Manifest.json"
    manifest = json.loads(path.read_text())
    for entry in manifest.get("itemInfoEntries", {}).values():
        if entry.get("path", "").endswith(".mlmodel"):
            spec_path = package / "Data" / entry["path"]
            spec = Model_pb2.Model()
            spec.ParseFromString(spec_path.read_bytes())
            spec_path.write_bytes(spec.SerializeToString(deterministic=True))
    renames = {
        old: str(uuid.uuid5(uuid.NAMESPACE_URL, "enginefarm:" + entry["path"])).upper()
        for old, entry in manifest.get("itemInfoEntries", {}).items()
    }
    manifest["itemInfoEntries"] = {renames[old]: entry for old, entry in manifest["itemInfoEntries"].items()}
    if "rootModelIdentifier" in manifest:
        manifest["rootModelIdentifier"] = renames[manifest["rootModelIdentifier"]]
    path.write_text(json.dumps(manifest, indent=4, sort_keys=True))


def spec_summary(package: Path) -> dict:
    """What the package declares: inputs (name, dtype, default shape, ranges or enumerated shapes), outputs,
    and the ops and dtypes of its ML program. Read without loading the model, so it works on any OS."""
    ct = coremltools()
    spec = ct.models.MLModel(str(package), skip_model_load=True).get_spec()
    inputs = []
    for feature in spec.description.input:
        array = feature.type.multiArrayType
        entry = {
            "name": feature.name,
            "dtype": ct.proto.FeatureTypes_pb2.ArrayFeatureType.ArrayDataType.Name(array.dataType),
            "shape": list(array.shape),
        }
        if array.HasField("shapeRange"):
            entry["ranges"] = [[r.lowerBound, r.upperBound] for r in array.shapeRange.sizeRanges]
        if array.HasField("enumeratedShapes"):
            entry["enumerated"] = [list(s.shape) for s in array.enumeratedShapes.shapes]
        inputs.append(entry)
    ops: dict[str, int] = {}
    op_dtypes: dict[str, set[str]] = {}  # op type → dtypes of its outputs: what the program computes in
    for function in spec.mlProgram.functions.values():
        for block in function.block_specializations.values():
            for op in block.operations:
                ops[op.type] = ops.get(op.type, 0) + 1
                for out in op.outputs:
                    if out.type.HasField("tensorType"):
                        op_dtypes.setdefault(op.type, set()).add(
                            ct.proto.MIL_pb2.DataType.Name(out.type.tensorType.dataType)
                        )
    return {
        "inputs": inputs,
        "outputs": [f.name for f in spec.description.output],
        "ops": ops,
        "op_dtypes": {op: sorted(found) for op, found in op_dtypes.items()},
        "dtypes": sorted(set().union(*op_dtypes.values())),
        "spec_version": spec.specificationVersion,
    }


def _check_spec(summary: dict, manifest) -> list[str]:
    problems = []
    want_in = [t["name"] for t in manifest.io.get("inputs", [])]
    want_out = [t["name"] for t in manifest.io.get("outputs", [])]
    if [i["name"] for i in summary["inputs"]] != want_in:
        problems.append(f"inputs {[i['name'] for i in summary['inputs']]} != {want_in}")
    if summary["outputs"] != want_out:
        problems.append(f"outputs {summary['outputs']} != {want_out}")
    for entry in summary["inputs"]:
        bounds = manifest.profile.get(entry["name"])
        if bounds is None:
            continue
        for corner in ("min", "opt", "max"):
            shape = bounds[corner]
            if "ranges" in entry:
                fits = len(shape) == len(entry["ranges"]) and all(
                    lo <= s <= (hi if hi > 0 else s) for s, (lo, hi) in zip(shape, entry["ranges"], strict=True)
                )
            elif "enumerated" in entry:
                fits = shape in entry["enumerated"]
            else:
                fits = shape == entry["shape"]
            if not fits:
                problems.append(f"input {entry['name']!r} does not accept the profile's {corner} shape {shape}")
    return problems


# Validation and load --------------------------------------------------------------------------------------


class TorchStandIn:
    """The traced torch module that was converted: what can run where Core ML cannot."""

    compute_precision = "fp32"

    def __init__(self, traced, input_names: list[str], input_dtypes: list[str], output_names: list[str]) -> None:
        self._traced = traced
        self.input_names = input_names
        self._dtypes = input_dtypes
        self.output_names = output_names

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        args = tuple(
            torch.from_numpy(np.ascontiguousarray(feeds[n], dtype=d))
            for n, d in zip(self.input_names, self._dtypes, strict=True)
        )
        with torch.no_grad():
            out = self._traced(*args)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return {name: value.numpy() for name, value in zip(self.output_names, outs, strict=True)}


class CoreMLSession:
    def __init__(self, model, manifest, folder: Path) -> None:
        self._model = model
        inputs = manifest.io.get("inputs", [])
        self.input_names = [t["name"] for t in inputs]
        self._dtypes = {t["name"]: IO_DTYPES.get(t["dtype"], np.float32) for t in inputs}
        self.output_names = [t["name"] for t in manifest.io.get("outputs", [])]
        self.compute_precision = manifest.precision
        # The extracted package lives as long as the session.
        self._cleanup = weakref.finalize(self, shutil.rmtree, folder, True)

    def close(self) -> None:
        self._model = None
        self._cleanup()  # the extracted package goes with the model

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = self._model.predict(
            {name: np.asarray(feeds[name], dtype=self._dtypes[name]) for name in self.input_names}
        )
        return {
            name: np.asarray(out[name], dtype=np.float32)
            if np.asarray(out[name]).dtype == np.float16
            else np.asarray(out[name])
            for name in self.output_names
        }


def _archive(manifest) -> str:
    return role_file(manifest, "model")


class CoreML(Backend):
    probes = ("apple",)
    name = "coreml"
    devices = re.compile(r"^(apple|apple-m[1-9])$")
    device_hint = "apple (any Apple-silicon Mac) or apple-mN"
    install = INSTALL
    extra = "coreml"
    onnx_precision = "fp32"  # fp16 is coremltools' compute precision; inputs and outputs stay float32
    options = OPTIONS
    vendor_label = "apple"
    example_device = "apple"
    hosted_runners = {"apple": ["macos-14"]}
    features = frozenset({Feature.OWN_VALIDATION})

    def available(self, device: str) -> Availability:
        problem = sdk_problem()
        if problem:
            return Availability.missing(f"{problem} ({INSTALL})")
        if platform.system() != "Darwin":
            return Availability(
                True,
                False,
                f"Core ML runs only on macOS (this is {platform.system()}): packages are converted here, not run",
            )
        return Availability(True, True)

    def versions(self) -> dict[str, str]:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return {name: version(name) for name in ("coremltools", "onnx2torch", "torch")}
        except PackageNotFoundError as exc:
            raise BackendUnavailable(f"{exc.name} is not installed", hint=INSTALL) from None

    def constraints(self, job: BuildJob) -> dict:
        return {"os": ["darwin"], "macos": ">=" + job.options.get("deployment_target", "macOS13").removeprefix("macOS")}

    def build(self, prepared_onnx: Path, job: BuildJob, workdir: Path) -> Built:
        if not isinstance(job, PlannedJob):  # an engine compiled on a device from a stored artifact has no I/O specs
            raise BuildError(f"{job.label}: Core ML converts from the planner's job (its inputs and outputs)")
        import torch

        from .coreml_convert import convert_to_mlprogram, to_traceable_torch

        example = tuple(torch.from_numpy(np.zeros(job.profile[t.name]["opt"], dtype=t.dtype)) for t in job.inputs)
        with quiet_convert():
            module = to_traceable_torch(Path(prepared_onnx))
            with torch.no_grad():
                traced = torch.jit.trace(module, example, check_trace=False)
            torch.jit.save(traced, str(workdir.parent / TRACED))
            mlmodel, shapes = convert_to_mlprogram(traced, job)
        staging = workdir.parent / "coreml-package"
        shutil.rmtree(staging, ignore_errors=True)
        package = staging / PACKAGE
        mlmodel.save(str(package))
        normalize_package(package)
        pack_dir(package, workdir / ARCHIVE)
        shutil.rmtree(staging, ignore_errors=True)
        return Built([BuiltFile(ARCHIVE, "model")], {"coreml_shapes": shapes})

    def load(self, artifact_dir: Path, manifest, device: str = "apple") -> CoreMLSession:
        from enginefarm.settings import load_settings

        here = self.available(device)
        if not here.can_load:
            raise BackendUnavailable(
                here.reason or "Core ML cannot load here",  # available() always says why
                hint=INSTALL if not here.can_build else "load Core ML packages on a Mac",
            )
        ct = coremltools()
        # A fresh copy per session, extracted from the archive the device cache has just hashed.
        folder = Path(tempfile.mkdtemp(prefix=".coreml-", dir=artifact_dir))
        try:
            package = extract(Path(artifact_dir) / _archive(manifest), folder, PACKAGE)
            units = getattr(ct.ComputeUnit, load_settings().coreml_compute_units)
            model = ct.models.MLModel(str(package), compute_units=units)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return CoreMLSession(model, manifest, folder)

    def validation_session(self, artifact_dir: Path, manifest, device: str):
        """On macOS: the package itself. Elsewhere: the package's spec is checked against the manifest, and the
        traced torch module that was converted stands in for it."""
        here = self.available(device)
        if here.can_load:
            return self.load(artifact_dir, manifest, device), {}
        import torch

        with tempfile.TemporaryDirectory(prefix="coreml-spec-") as tmp:
            summary = spec_summary(extract(Path(artifact_dir) / _archive(manifest), Path(tmp), PACKAGE))
        problems = _check_spec(summary, manifest)
        if problems:
            raise BuildError(f"{manifest.ref}: the Core ML package does not match its manifest: {'; '.join(problems)}")
        with quiet_convert():
            traced = torch.jit.load(str(Path(artifact_dir).parent / TRACED))
        inputs = manifest.io.get("inputs", [])
        session = TorchStandIn(
            traced,
            [t["name"] for t in inputs],
            [t["dtype"] for t in inputs],
            [t["name"] for t in manifest.io.get("outputs", [])],
        )
        note = {
            "executed": False,
            "ran_instead": "the traced torch module that coremltools converted (fp32, CPU); the package's spec was "
            "checked",
            "why": here.reason,
            "spec": {"inputs": summary["inputs"], "outputs": summary["outputs"], "dtypes": summary["dtypes"]},
        }
        return session, note

    def device_classes(self, device) -> tuple[str, ...]:
        return ("apple",) if device.kind == "apple" else ()

    def rank(self, device_class: str) -> Rank:
        return Rank.PORTABLE_IR


BACKEND = CoreML()
