"""Closing what you open: `Session.close()`, `with enginefarm.load(...) as s:`, `Pipeline.close()`. Memory really
goes back (measured by the process itself, RSS), and load/close cycles do not grow it."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from enginefarm.errors import SessionClosed
from tests.conftest import builds

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="RSS from /proc and malloc_trim are Linux's"
)

WIDTH, LAYERS = 1024, 12  # 48 MB of fp32 weights: well above the noise of a Python process's RSS


def _chain(path, width: int = WIDTH, layers: int = LAYERS):
    """A chain of `layers` MatMuls of width x width fp32 weights (also tests/runner/test_warm.py's, smaller)."""
    import onnx
    import onnx.helper as h
    import onnx.numpy_helper as nh

    rng = np.random.default_rng(0)
    inits, nodes, prev = [], [], "x"
    for i in range(layers):
        inits.append(nh.from_array((rng.standard_normal((width, width)) / width**0.5).astype(np.float32), f"w{i}"))
        nodes.append(h.make_node("MatMul", [prev, f"w{i}"], [f"y{i}"]))
        prev = f"y{i}"
    graph = h.make_graph(
        nodes,
        "chain",
        [h.make_tensor_value_info("x", 1, ["batch", width])],
        [h.make_tensor_value_info(prev, 1, ["batch", width])],
        inits,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(
        h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10),
        str(path),
        save_as_external_data=True,
        location=f"{path.name}.data",
    )
    return path


@pytest.fixture(scope="module")
@builds
def chain_store(tmp_path_factory):
    from tests.conftest import run_cli

    root = tmp_path_factory.mktemp("lifecycle")
    _chain(root / "models" / "chain.onnx")
    (root / "recipe.toml").write_text("""
[model]
name = "chain"
version = "1"

[defaults]
precisions = ["fp32"]
targets = ["onnxruntime:cpu", "openvino:cpu"]

[components.net]
source = "models/chain.onnx"

[components.net.profiles.default]
batch = [1, 1, 4]
""")
    env = {"ENGINEFARM_HOME": str(root / "home"), "ENGINEFARM_STORE": str(root / "store")}
    run_cli("build", str(root / "recipe.toml"), "--store", str(root / "store"), "--no-bench", env=env, check=True)
    return root


_CYCLES = """
import json, sys
import numpy as np
import enginefarm
from enginefarm.hardware.rss import current_bytes
target = sys.argv[1]
x = np.ones((2, 1024), np.float32)
def cycle():
    with enginefarm.load("chain/net", device="cpu", target=target) as s:
        s.run({"x": x})
        return current_bytes()
cycle()  # the first load imports the SDK: its libraries stay, whatever happens to the session
base = current_bytes()
loaded = [cycle() for _ in range(20)]
print(json.dumps({"base": base, "loaded": loaded[0], "after": current_bytes()}))
"""


@linux_only
@pytest.mark.parametrize("target", ["onnxruntime:cpu", "openvino:cpu"])
def test_close_gives_the_memory_back_and_cycles_do_not_grow(chain_store, target, monkeypatch):
    monkeypatch.setenv("ENGINEFARM_HOME", str(chain_store / "home"))
    monkeypatch.setenv("ENGINEFARM_STORE", str(chain_store / "store"))
    out = subprocess.run(
        [sys.executable, "-c", _CYCLES, target], capture_output=True, text=True, check=True, timeout=600
    ).stdout
    rss = json.loads(out.strip().splitlines()[-1])
    assert rss["loaded"] - rss["base"] > 40 << 20  # the session really held its 48 MB of weights
    assert rss["after"] <= rss["base"] * 1.05, rss  # 20 load/close cycles later: back within 5% of before


def test_a_closed_session_refuses_to_run_and_closing_twice_is_harmless(chain_store, monkeypatch):
    import enginefarm

    monkeypatch.setenv("ENGINEFARM_HOME", str(chain_store / "home"))
    monkeypatch.setenv("ENGINEFARM_STORE", str(chain_store / "store"))
    session = enginefarm.load("chain/net", device="cpu", target="onnxruntime:cpu")
    x = np.ones((1, WIDTH), np.float32)
    assert session.run({"x": x})[session.output_names[0]].shape == (1, WIDTH)
    session.close()
    session.close()
    assert session.closed and session.output_names == ["y11"]
    with pytest.raises(SessionClosed, match="closed") as caught:
        session.run({"x": x})
    assert "enginefarm.load" in caught.value.hint


_PROBED = """
import json, sys
import enginefarm
session = enginefarm.load("chain/net", target=sys.argv[1])
print(json.dumps({"openvino": "openvino" in sys.modules, "pynvml": "pynvml" in sys.modules}))
"""


def test_a_load_runs_only_the_device_probes_its_candidates_need(chain_store, monkeypatch):
    """Candidates all for ONNX Runtime on the CPU: no GPU probe runs (OpenVINO's, which lists Intel GPUs, costs about
    half a second of a first inference), so neither OpenVINO nor NVML is imported. With OpenVINO candidates, it is."""
    monkeypatch.setenv("ENGINEFARM_HOME", str(chain_store / "home"))
    monkeypatch.setenv("ENGINEFARM_STORE", str(chain_store / "store"))

    def imported(target: str) -> dict:
        out = subprocess.run(
            [sys.executable, "-c", _PROBED, target], capture_output=True, text=True, check=True, timeout=300
        ).stdout
        return json.loads(out.strip().splitlines()[-1])

    assert imported("onnxruntime:cpu") == {"openvino": False, "pynvml": False}
    assert imported("openvino:cpu")["openvino"] is True
