"""The shipped conformance suite (enginefarm/backends/conformance.py) on every backend this machine can exercise: the
real SDKs (ONNX Runtime, OpenVINO), the fake NVIDIA SDKs (tests/fakes: TensorRT on a faked RTX 4090), the toy
backend that lives outside the product, and a backend installed as a distribution with an entry point."""

from __future__ import annotations

import sys
import textwrap

import pytest

from enginefarm.backends import ENTRY_POINT_GROUP, get_backend, registry
from enginefarm.backends.conformance import BackendConformance
from tests import nvidia_fakes
from tests.toy_backend import BACKEND as TOY


class TestOnnxRuntime(BackendConformance):
    backend = "onnxruntime"
    device = "cpu"


class TestOpenVINO(BackendConformance):
    backend = "openvino"
    device = "cpu"


class TestToy(BackendConformance):
    backend = TOY  # an instance: the suite needs no registration
    device = "cpu"


class TestFakeTensorRT(BackendConformance):
    backend = "tensorrt"
    device = "sm_89"

    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    def fakes(cls, tmp_path_factory):
        with pytest.MonkeyPatch.context() as monkeypatch:
            yield nvidia_fakes.install_fakes(monkeypatch, tmp_path_factory.mktemp("fake-nvidia") / "calls.jsonl")
        nvidia_fakes.forget_fakes()


class TestFakeTensorRTRefittable(TestFakeTensorRT):
    build_options = {"refittable": True}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A distribution installed into a folder on sys.path: its module, and a real .dist-info whose entry_points.txt
    names it in the enginefarm.backends group (what `pip install` of an outside backend leaves)."""
    root = tmp_path_factory.mktemp("site")
    (root / "ef_outside_backend.py").write_text(
        textwrap.dedent("""
        from tests.toy_backend import Toy

        class Outside(Toy):
            name = "outside"
            install = "pip install ef-outside-backend"
    """)
    )
    info = root / "ef_outside_backend-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ef-outside-backend\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\noutside = ef_outside_backend:Outside\nonnxruntime = ef_outside_backend:Outside\n"
    )
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    sys.modules.pop("ef_outside_backend", None)


def test_an_installed_entry_point_adds_a_backend_and_never_replaces_a_built_in(installed, caplog, monkeypatch):
    found = registry()
    assert found["outside"] == "ef_outside_backend:Outside"
    assert found["onnxruntime"] == "enginefarm.backends.onnxruntime"  # the built-in stays, with a warning
    assert "takes the built-in backend name 'onnxruntime'" in caplog.text
    assert type(get_backend("onnxruntime")).__module__ == "enginefarm.backends.onnxruntime"  # found without the scan
    backend = get_backend("outside")
    assert (
        type(backend).__name__ == "Outside" and get_backend("outside") is backend
    )  # one object, as a module's BACKEND
    monkeypatch.setenv("ENGINEFARM_BACKENDS", "outside=tests.toy_backend")  # the variable wins over the entry point
    assert registry()["outside"] == "tests.toy_backend"


@pytest.mark.usefixtures("installed")  # module-scoped: installed before the suite's class fixtures look the name up
class TestEntryPointBackend(BackendConformance):
    backend = "outside"
    device = "cpu"


def test_the_planners_job_and_the_on_device_job_have_the_shape_backends_read():
    """Both job classes carry every member of the Protocols backends are typed with (build_job.py)."""
    from dataclasses import fields

    from enginefarm.backends.build_job import BuildJob, PlannedJob
    from enginefarm.builder.job import Job
    from enginefarm.runner.recompile import DeviceJob

    def members(protocol):
        return {name for name, value in vars(protocol).items() if isinstance(value, property)}

    def has(cls):
        return {f.name for f in fields(cls)} | {name for name in dir(cls) if not name.startswith("_")}

    assert members(BuildJob) == {"label", "component", "target", "precision", "profile", "options", "fp16_keep"}
    assert members(BuildJob) <= has(Job) and members(BuildJob) <= has(DeviceJob)
    assert members(PlannedJob) == {"inputs", "outputs", "source"} and members(PlannedJob) <= has(Job)
