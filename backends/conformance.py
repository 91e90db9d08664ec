"""The backend conformance suite: what every backend must do, as pytest tests an outside backend's author runs too
(like fsspec's abstract filesystem tests). Subclass `BackendConformance` in a test module:

    from enginefarm.backends.conformance import BackendConformance

    class TestMyBackend(BackendConformance):
        backend = "mybackend"   # a registered name (built-in, entry point, ENGINEFARM_BACKENDS) or a Backend instance
        device = "cpu"          # a device class it builds

and run pytest. The suite builds one tiny ONNX model (y = x @ w + b, a dynamic batch) with the backend, loads it and
compares the output with numpy; with custom-weight features it replaces `w` and checks the new output. What this
host cannot do is skipped with the backend's own reason: versions without the SDK, the build where `available` says
it cannot build, the run where it cannot load. Needs pytest, numpy and onnx (the `export` extra).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from enginefarm.cache import precision_table
from enginefarm.cache.manifest import ArtifactFile, Manifest, Target
from enginefarm.errors import BackendUnavailable

from . import get_backend
from .base import FEATURE_HOOKS, Availability, Backend, Built, BuiltFile, Feature, Rank, option_defaults
from .build_job import BuildJob, PlannedJob

ROLES = {"engine", "weights", "ir", "model", "asset"}
PROFILE = {"x": {"min": [1, 4], "opt": [1, 4], "max": [2, 4]}}
W = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
B = np.array([0.5, -1.0, 2.0], np.float32)
X = np.array([[1.0, -2.0, 0.25, 3.0]], np.float32)


@dataclass(frozen=True)
class ConformanceJob:
    """A job as a backend sees it (both Protocols of build_job.py), for the tiny model."""

    target: Target
    options: dict[str, Any]
    precision: str = "fp32"
    component: str = "conformance"
    label: str = "conformance/tiny fp32"
    profile: dict[str, dict[str, list[int]]] = field(default_factory=lambda: PROFILE)
    inputs: tuple = ()
    outputs: tuple = ()
    source: Any = None
    fp16_keep: tuple[str, ...] = ()


def tiny_onnx(path: Path) -> Path:
    """y = x @ w + b, x float32 [batch, 4], opset 17."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
        "conformance",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def manifest_of(folder: Path, files: list[BuiltFile], job: ConformanceJob, constraints: dict) -> Manifest:
    """The manifest a farm would store for these files (their real sizes and digests)."""
    entries = []
    for f in files:
        data = (folder / f.path).read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        entries.append(ArtifactFile(f.path, f.role, len(data), digest, "none", len(data), digest))
    key = hashlib.sha256(json.dumps([str(job.target), sorted(e.sha256 for e in entries)]).encode()).hexdigest()
    return Manifest(
        key,
        "conformance",
        "1",
        job.component,
        job.precision,
        "default",
        job.profile,
        str(job.target),
        {},
        tuple(entries),
        constraints=constraints,
        options=dict(job.options),
    )


class BackendConformance:
    """The suite: subclass it in a test module and set `backend` (a registered name or a `Backend` instance) and
    `device` (a device class it builds); `build_options` adds build options over the backend's defaults."""

    backend: str | Backend
    device: str
    build_options: dict[str, Any] = {}  # over the backend's defaults, e.g. {"refittable": True} to check refit

    @pytest.fixture(scope="class")
    @classmethod
    def subject(cls) -> Backend:
        return cls.backend if isinstance(cls.backend, Backend) else get_backend(cls.backend)

    @pytest.fixture(scope="class")
    @classmethod
    def here(cls, subject) -> Availability:
        return subject.available(cls.device)

    @pytest.fixture(scope="class")
    @classmethod
    def job(cls, subject) -> ConformanceJob:
        options = {**option_defaults(subject.options), **cls.build_options}
        return ConformanceJob(Target(subject.name, cls.device), options)

    @pytest.fixture(scope="class")
    @classmethod
    def built(cls, subject, here, job, tmp_path_factory) -> tuple[Path, Built, Manifest]:
        if not here.can_build:
            pytest.skip(f"{subject.name}:{cls.device} cannot build here: {here.reason}")
        root = tmp_path_factory.mktemp(f"conformance-{subject.name}")
        workdir = root / "artifact"
        workdir.mkdir()
        result = subject.build(tiny_onnx(root / "model.onnx"), job, workdir)
        return workdir, result, manifest_of(workdir, result.files, job, subject.constraints(job))

    def loadable(self, subject, here) -> None:
        """Skip the calling test, with the backend's reason, where this host cannot load the device class."""
        if not here.can_load:
            pytest.skip(f"{subject.name}:{self.device} cannot run here: {here.reason}")

    def run(self, session) -> np.ndarray:
        """The tiny model's output `y` for the fixed input `x`; the session is closed afterwards."""
        try:
            return session.run({"x": X})["y"]
        finally:
            getattr(session, "close", lambda: None)()

    # What every backend declares.

    def test_declares_its_names(self, subject):
        assert subject.name and subject.device_hint and subject.install
        assert subject.devices.fullmatch(self.device), (
            f"{self.device!r} is not one of {subject.name}'s device classes ({subject.device_hint})"
        )
        assert subject.onnx_precision in (precision_table.REFERENCE, "same")
        assert all(not isinstance(d, tuple) or d for d in subject.options.values()), (
            "a tuple option lists its allowed values"
        )

    def test_features_come_with_their_hooks(self, subject):
        for feature, hooks in FEATURE_HOOKS.items():
            written = [h for h in hooks if getattr(type(subject), h) is not getattr(Backend, h)]
            assert written == (list(hooks) if feature in subject.features else []), feature

    def test_availability_says_why_not(self, here):
        assert isinstance(here, Availability)
        assert (here.can_build and here.can_load) or here.reason

    def test_versions_name_every_toolchain_part(self, subject):
        try:
            found = subject.versions()
        except BackendUnavailable as exc:
            pytest.skip(str(exc))
        assert found and all(isinstance(k, str) and isinstance(v, str) and v for k, v in found.items())

    def test_ranks_and_runner_labels(self, subject):
        assert isinstance(subject.rank(self.device), Rank)
        labels = subject.runner_labels(self.device)
        assert labels and all(isinstance(label, str) and label for label in labels)

    def test_fp32_is_never_refused(self, subject):
        assert subject.precision_refusal("fp32", self.device) is None
        refusals = [subject.precision_refusal(p, self.device) for p in precision_table.NAMES]
        assert all(isinstance(why, (str, type(None))) for why in refusals)

    def test_computes_only_precisions_of_the_table(self, subject):
        assert precision_table.REFERENCE in subject.computes and subject.computes <= set(precision_table.NAMES)
        assert all(subject.precision_refusal(p, self.device) for p in set(precision_table.NAMES) - subject.computes)

    def test_jobs_have_the_shape_backends_read(self, job):
        assert isinstance(job, BuildJob) and isinstance(job, PlannedJob)

    # What a build writes.

    def test_build_writes_what_it_lists(self, built):
        workdir, result, manifest = built
        assert result.files and {f.role for f in result.files} <= ROLES
        assert all((workdir / f.path).is_file() for f in result.files)
        json.dumps(result.notes), json.dumps(manifest.constraints)  # both are stored as JSON

    def test_load_runs_the_model(self, subject, here, built):
        self.loadable(subject, here)
        workdir, _, manifest = built
        session = subject.load(workdir, manifest, self.device)
        assert list(session.input_names) == ["x"] and list(session.output_names) == ["y"]
        assert session.compute_precision == "fp32"
        np.testing.assert_allclose(self.run(session), X @ W + B, atol=1e-4)

    # Custom weights, for the backends that declare them.

    def new_weights(self) -> dict[str, np.ndarray]:
        """The replacement for the initializer `w` that the custom-weight tests apply (reversed and negated)."""
        return {"w": -W[::-1].copy()}

    def test_weights_at_load(self, subject, here, built):
        if not subject.has(Feature.WEIGHTS_AT_LOAD):
            pytest.skip(f"{subject.name} does not declare {Feature.WEIGHTS_AT_LOAD.value}")
        self.loadable(subject, here)
        workdir, _, manifest = built
        session = subject.load_with_weights(workdir, manifest, self.new_weights(), self.device)
        np.testing.assert_allclose(self.run(session), X @ self.new_weights()["w"] + B, atol=1e-4)

    def test_patched_copy(self, subject, here, built, job, tmp_path):
        if not subject.has(Feature.PATCH_WEIGHTS):
            pytest.skip(f"{subject.name} does not declare {Feature.PATCH_WEIGHTS.value}")
        workdir, _, manifest = built
        assert tuple(subject.weight_shapes(workdir, manifest)["w"]) == W.shape
        np.testing.assert_array_equal(subject.read_weights(workdir, manifest, ["w"])["w"], W)
        files = subject.patch_weights(workdir, manifest, self.new_weights(), tmp_path)
        patched = manifest_of(tmp_path, files, job, manifest.constraints)
        np.testing.assert_array_equal(subject.read_weights(tmp_path, patched, ["w"])["w"], self.new_weights()["w"])
        self.loadable(subject, here)
        np.testing.assert_allclose(
            self.run(subject.load(tmp_path, patched, self.device)), X @ self.new_weights()["w"] + B, atol=1e-4
        )

    def test_refit(self, subject, here, built):
        if not subject.has(Feature.REFIT):
            pytest.skip(f"{subject.name} does not declare {Feature.REFIT.value}")
        self.loadable(subject, here)
        workdir, _, manifest = built
        try:
            subject.check_refit(manifest)
        except Exception as exc:  # its default build may not be refittable; then it must say so in a user error
            assert getattr(exc, "hint", None), f"check_refit raised {exc!r} without a hint"
            pytest.skip(f"the default build is not refittable: {exc}")
        session = subject.refit(workdir, manifest, self.new_weights(), self.device)
        np.testing.assert_allclose(self.run(session), X @ self.new_weights()["w"] + B, atol=1e-4)
