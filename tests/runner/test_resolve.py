"""Resolution, table-driven: fastest measured on this device class wins; constraints filter; explain says why."""

from __future__ import annotations

import pytest

from enginefarm.cache.index import IndexEntry
from enginefarm.runner.device import Device
from enginefarm.runner.resolve import resolve

CPU_V4 = Device("cpu", "Xeon", "cpu-x86_64-v4", ("openvino:cpu", "onnxruntime:cpu"))
CPU_V3 = Device("cpu", "Ryzen", "cpu-x86_64-v3", ("openvino:cpu", "onnxruntime:cpu"))


def entry(key: str, target: str, precision: str = "fp32", benches=(), runtime=None, component="vae"):
    return IndexEntry.from_dict({
        "build_key": key * 64 if len(key) == 1 else key, "component": component, "precision": precision, "target": target,
        "profile_name": "default", "profile": {}, "constraints": {"runtime": runtime or {}},
        "benchmarks": [{"device": {"class": cls}, "p50_ms": ms} for cls, ms in benches],
    }, "m")


def pick(entries, device=CPU_V4, precision=None):
    resolution = resolve("m/vae", [(e, "store") for e in entries], precision, [device])
    ranked = resolution.ranked
    return (ranked[0].entry.build_key[0] if ranked else None), resolution


CASES = [
    ("fastest on this class wins", [entry("a", "openvino:cpu", benches=[("cpu-x86_64-v4", 9.0)]), entry("b", "onnxruntime:cpu", benches=[("cpu-x86_64-v4", 5.0)])], CPU_V4, None, "b"),
    ("this class beats a faster other class", [entry("a", "openvino:cpu", benches=[("cpu-x86_64-v3", 1.0)]), entry("b", "onnxruntime:cpu", benches=[("cpu-x86_64-v4", 5.0)])], CPU_V4, None, "b"),
    ("similar class is a proxy", [entry("a", "openvino:cpu", benches=[("cpu-x86_64-v4", 4.0)]), entry("b", "onnxruntime:cpu", benches=[("cpu-x86_64-v4", 5.0)])], CPU_V3, None, "a"),
    ("measured beats unmeasured", [entry("a", "openvino:cpu"), entry("b", "onnxruntime:cpu", benches=[("cpu-x86_64-v4", 50.0)])], CPU_V4, None, "b"),
    ("no benchmarks: IR beats ONNX", [entry("a", "onnxruntime:cpu"), entry("b", "openvino:cpu")], CPU_V4, None, "b"),
    ("precision filter", [entry("a", "onnxruntime:cpu", "fp16", [("cpu-x86_64-v4", 1.0)]), entry("b", "onnxruntime:cpu", "fp32", [("cpu-x86_64-v4", 5.0)])], CPU_V4, "fp32", "b"),
    ("GPU-only artifacts are not for a CPU", [entry("a", "tensorrt:sm_89", benches=[("nvidia-sm_89", 0.1)]), entry("b", "onnxruntime:cpu")], CPU_V4, None, "b"),
    ("runtime range filters", [entry("a", "onnxruntime:cpu", runtime={"onnxruntime": ">=999.0"}, benches=[("cpu-x86_64-v4", 0.1)]), entry("b", "onnxruntime:cpu", benches=[("cpu-x86_64-v4", 9.0)])], CPU_V4, None, "b"),
    ("other components are ignored", [entry("a", "onnxruntime:cpu", component="unet")], CPU_V4, None, None),
]


@pytest.mark.parametrize("name,entries,device,precision,expected", CASES, ids=[c[0] for c in CASES])
def test_resolution_table(name, entries, device, precision, expected):
    chosen, _ = pick(entries, device, precision)
    assert chosen == expected


def test_explain_names_the_reason_for_each_rejection():
    _, resolution = pick([entry("a", "onnxruntime:cpu", runtime={"onnxruntime": ">=999.0"}), entry("b", "tensorrt:sm_89"), entry("c", "openvino:cpu", "fp16")], precision="fp32")
    text = resolution.explain()
    assert "needs onnxruntime >=999.0" in text
    assert "no device here runs tensorrt:sm_89" in text
    assert "precision fp16, asked for fp32" in text


def test_an_artifact_that_fails_to_load_falls_back_to_the_next(tiny_recipe, cli, tmp_path):
    """A verified-but-broken artifact (say, a bad SDK build) ranked first must not stop load()."""
    import dataclasses
    import hashlib

    import numpy as np

    import enginefarm
    from enginefarm.cache.artifacts import pack_files, publish, read_index, read_manifest
    from enginefarm.cache.stores import open_store

    cli("build", str(tiny_recipe()), check=True)
    store = open_store(tmp_path / "store")
    (good_key,) = read_index(store, "tiny-sd").entries
    good = read_manifest(store, good_key)
    broken_dir = tmp_path / "broken"
    broken_dir.mkdir()
    (broken_dir / "model.onnx").write_bytes(b"this is not an onnx model")
    files, blobs = pack_files(broken_dir, [("model.onnx", "model")], tmp_path / "blobs")
    fast = {**good.benchmarks[0], "p50_ms": good.benchmarks[0]["p50_ms"] / 100}
    broken = dataclasses.replace(good, build_key=hashlib.sha256(b"broken").hexdigest(), files=tuple(files), benchmarks=(fast,))
    publish(store, broken, blobs)
    session = enginefarm.load("tiny-sd/decoder", device="cpu")
    assert session.artifact.build_key == good_key
    assert f"[{broken.build_key[:12]}]" in session.explain() and "failed:" in session.explain()
    assert session.run({"latent": np.zeros((1, 4, 8, 8), np.float32)})["sample"].shape == (1, 3, 16, 16)


def test_sub_millisecond_latencies_stay_readable_in_explain():
    """Tiny models run in microseconds; '0.0 ms vs 0.0 ms' would explain nothing."""
    entries = [entry("a", "openvino:cpu", benches=[("cpu-x86_64-v4", 0.0486)]), entry("b", "onnxruntime:cpu", benches=[("cpu-x86_64-v4", 0.0336)])]
    chosen, resolution = pick(entries)
    assert chosen == "b"
    text = resolution.explain(resolution.ranked[0])
    assert "fastest measured: 0.034 ms vs 0.049 ms" in text and "p50 0.049 ms measured" in text
