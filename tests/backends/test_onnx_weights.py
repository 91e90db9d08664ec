"""backends/onnx_weights.py: the protobuf reader agrees with onnx's own, and ONNX Runtime takes new weights at load
without importing onnx."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from enginefarm.backends import onnx_weights
from enginefarm.backends.conformance import tiny_onnx
from enginefarm.errors import IntegrityError


def mixed_model(path, external: bool):
    """Initializers of several types and ranks (a scalar, fp16, int64, a 4-D fp32), inline or as external data."""
    inits = [
        numpy_helper.from_array(np.ones((8, 4, 3, 3), np.float32), "conv.weight"),
        numpy_helper.from_array(np.full((5,), 0.5, np.float16), "half"),
        numpy_helper.from_array(np.array([3, 1], np.int64), "shape"),
        numpy_helper.from_array(np.array(2.0, np.float32), "scalar"),
    ]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        inits,
    )
    model = helper.make_model(graph)
    onnx.save(model, str(path), save_as_external_data=external, location=path.name + ".data", size_threshold=0)
    return path


@pytest.mark.parametrize("external", [False, True])
def test_initializer_kinds_match_onnx(tmp_path, external):
    path = mixed_model(tmp_path / "m.onnx", external)
    expected = {
        i.name: (i.data_type, tuple(i.dims)) for i in onnx.load(str(path), load_external_data=False).graph.initializer
    }
    assert onnx_weights.initializer_kinds(path) == expected
    assert onnx_weights.float_shapes(path) == {"conv.weight": (8, 4, 3, 3), "half": (5,), "scalar": ()}


def test_overrides_take_the_initializers_dtype_and_refuse_unknown_names(tmp_path):
    path = mixed_model(tmp_path / "m.onnx", False)
    found = onnx_weights.as_overrides(path, {"half": np.arange(5, dtype=np.float32)}, "the artifact")
    assert found["half"].dtype == np.float16 and found["half"].tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(
        IntegrityError, match=r"the artifact: no float initializer of m.onnx is named \['missing', 'shape'\]"
    ):
        onnx_weights.as_overrides(
            path, {"missing": np.zeros(1, np.float32), "shape": np.zeros(2, np.float32)}, "the artifact"
        )
    (tmp_path / "bad.onnx").write_bytes(b"\x3a\xff\xff\xff\xff\x0f")  # a graph field longer than the file
    with pytest.raises(IntegrityError, match="bad.onnx is not a readable ONNX model"):
        onnx_weights.initializer_kinds(tmp_path / "bad.onnx")


def test_onnx_runtime_takes_new_weights_at_load_without_onnx(tmp_path):
    model = tiny_onnx(tmp_path / "model.onnx")
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        import numpy as np
        from enginefarm.backends import get_backend
        from enginefarm.backends.conformance import ConformanceJob, manifest_of, B, X, W
        from enginefarm.backends.base import BuiltFile
        from enginefarm.cache.manifest import Target

        job = ConformanceJob(Target("onnxruntime", "cpu"), {{}})
        manifest = manifest_of(Path({str(tmp_path)!r}), [BuiltFile("model.onnx", "model")], job, {{}})
        session = get_backend("onnxruntime").load_with_weights(Path({str(tmp_path)!r}), manifest, {{"w": 2 * W}}, "cpu")
        assert np.allclose(session.run({{"x": X}})["y"], X @ (2 * W) + B, atol=1e-5)
        print(sorted(m for m in sys.modules if m == "onnx" or m.startswith("onnx.")))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert model.exists() and out.stdout.strip() == "[]"
