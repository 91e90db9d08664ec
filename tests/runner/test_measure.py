"""On-device timing: which candidates a first load times, when it may, what it remembers, and explain's account."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from enginefarm.cache.index import IndexEntry
from enginefarm.cache.progress import as_progress
from enginefarm.hardware.devices import Device
from enginefarm.runner import measure
from enginefarm.runner.resolve import resolve
from enginefarm.settings import load_settings

CPU = Device(
    "cpu", "Xeon", "cpu-x86_64-v4", ("openvino:cpu", "onnxruntime:cpu"), {"flags": ["avx2"], "logical_cores": 2}
)


def entry(
    key: str,
    target: str,
    precision: str = "fp32",
    ms: float | None = None,
    cls: str = "cpu-x86_64-v4",
    iqr: float = 0.0,
    size: int = 1000,
):
    benches = (
        [{"device": {"class": cls}, "p50_ms": ms, "iqr_ms": iqr, "runs": 9, "load_ms": 50.0, "first_inference_ms": ms}]
        if ms is not None
        else []
    )
    return IndexEntry.from_dict(
        {
            "build_key": key * 64,
            "model_version": "1",
            "component": "vae",
            "precision": precision,
            "target": target,
            "profile_name": "p",
            "profile": {},
            "constraints": {},
            "benchmarks": benches,
            "stored_size": size,
        },
        "m",
    )


def resolution(*entries):
    return resolve("m/vae", [(e, "store") for e in entries], None, [CPU])


def keys(found):
    return None if found is None else [c.entry.build_key[0] for c in found.candidates]


CASES = [
    (
        "clear farm winner: nothing to time",
        [entry("a", "openvino:cpu", ms=10), entry("b", "onnxruntime:cpu", ms=20)],
        None,
    ),
    ("within 10%: both", [entry("a", "openvino:cpu", ms=10), entry("b", "onnxruntime:cpu", ms=10.8)], ["a", "b"]),
    (
        "within noise though 20% apart",
        [entry("a", "openvino:cpu", ms=10, iqr=1.5), entry("b", "onnxruntime:cpu", ms=12, iqr=2.5)],
        ["a", "b"],
    ),
    ("a rival without a number here", [entry("a", "openvino:cpu", ms=10), entry("b", "onnxruntime:cpu")], ["a", "b"]),
    (
        "measured on another class: the top three",
        [
            entry(k, "openvino:cpu", p, ms, cls="cpu-x86_64-v3")
            for k, p, ms in (("a", "fp32", 10), ("b", "fp16", 30), ("c", "bf16", 40), ("d", "fp32", 50))
        ][:3]
        + [entry("d", "onnxruntime:cpu", ms=90, cls="cpu-x86_64-v3")],
        ["a", "b", "c"],
    ),
    ("one candidate", [entry("a", "openvino:cpu", ms=10)], None),
]


@pytest.mark.parametrize("name,entries,expected", CASES, ids=[c[0] for c in CASES])
def test_which_candidates_are_timed(name, entries, expected):
    assert keys(measure.contenders(resolution(*entries))) == expected


class SimulatedRuns:
    """Backend sessions whose runs advance a simulated clock by a fixed cost: timing without real time."""

    def __init__(self, costs_ms: dict[str, float]) -> None:
        self.now, self.costs, self.opened = 0.0, costs_ms, []

    def clock(self) -> float:
        return self.now

    def opener(self, candidate):
        from enginefarm.cache.manifest import Manifest

        key = candidate.entry.build_key
        self.opened.append(key[0])
        sim = self

        class Session:
            def run(self, feeds):
                assert feeds["x"].shape == (1, 4)
                sim.now += sim.costs[key[0]] / 1000

        manifest = Manifest(
            build_key=key,
            model="m",
            model_version="1",
            component="vae",
            precision=candidate.entry.precision,
            profile_name="p",
            profile={"x": {"min": [1, 4], "opt": [1, 4], "max": [2, 4]}},
            target=candidate.entry.target,
            toolchain={},
            files=(),
            io={"inputs": [{"name": "x", "dtype": "float32", "shape": [None, 4]}]},
        )
        return manifest, Session()


@pytest.fixture
def sim(monkeypatch):
    def make(costs):
        runs = SimulatedRuns(costs)
        monkeypatch.setattr(measure, "CLOCK", runs.clock)
        return runs

    return make


def settings(mode: str):
    return replace(load_settings(), measure=mode)


CLOSE = [
    entry("a", "openvino:cpu", "fp32", ms=10),
    entry("b", "openvino:cpu", "bf16", ms=10.5),
    entry("c", "onnxruntime:cpu", ms=30),
]


def test_the_device_times_close_candidates_and_its_winner_goes_first(sim):
    runs = sim({"a": 12.0, "b": 6.0})  # the farm said a, this device says b
    found = resolution(*CLOSE)
    messages = []
    opened = measure.decide(found, settings("on"), as_progress(messages.append), runs.opener)
    assert set(opened) == {"a" * 64, "b" * 64} and runs.opened == ["a", "b"]
    assert found.ranked[0].entry.build_key[0] == "b" and found.preferred == "b" * 64
    text = found.explain(found.ranked[0])
    assert "timed fastest on this device at a first load: 6.0 ms vs 12.0 ms for openvino:cpu fp32" in text
    assert "timed on this device (just now" in text and "measured on this device class by the farm" in text
    assert messages[0].startswith("timing 2 candidates on this device") and any(
        m.startswith("  round 3:") for m in messages
    )
    assert "fastest here: openvino:cpu bf16" in messages[-1]


def test_the_winner_is_remembered_per_device_and_used_without_timing(sim):
    sim({"a": 12.0, "b": 6.0})
    measure.decide(resolution(*CLOSE), settings("on"), as_progress(None), sim({"a": 12.0, "b": 6.0}).opener)
    again = resolution(*CLOSE)
    later = sim({"a": 1.0, "b": 1.0})
    assert measure.decide(again, settings("on"), as_progress(None), later.opener) == {} and later.opened == []
    assert again.ranked[0].entry.build_key[0] == "b" and "remembered from" in again.explain()
    files = list((load_settings().home / "device-timings").glob("*.json"))
    (data,) = [json.loads(f.read_text()) for f in files]
    assert data["fingerprint"]["name"] == "Xeon" and data["fingerprint"]["runtimes"]["openvino"]
    (result,) = data["results"].values()
    assert (
        result["winner"] == "b" * 64
        and set(result["timings"]) == {"a" * 64, "b" * 64}
        and result["timings"]["b" * 64]["runs"] >= 3
    )


def test_another_driver_or_runtime_is_timed_again(tmp_path):
    print_a = measure.fingerprint(CPU, resolution(*CLOSE).candidates)
    memory = measure.Memory(tmp_path, print_a)
    memory.put(["a" * 64, "b" * 64], {"winner": "b" * 64, "timings": {}})
    assert measure.Memory(tmp_path, print_a).get(["b" * 64, "a" * 64])["winner"] == "b" * 64
    newer = {**print_a, "runtimes": {**print_a["runtimes"], "openvino": "2099.1"}}
    assert measure.Memory(tmp_path, newer).get(["a" * 64, "b" * 64]) is None
    assert measure.Memory(tmp_path, {**print_a, "driver": "999.1"}).get(["a" * 64, "b" * 64]) is None
    assert measure.Memory(tmp_path, print_a).get(["a" * 64, "c" * 64]) is None  # another set of candidates
    memory.path.write_text("{ not json")
    assert measure.Memory(tmp_path, print_a).get(["a" * 64, "b" * 64]) is None  # unreadable: timed again, no crash


def test_auto_times_only_what_costs_a_few_seconds(sim):
    big = [replace(e, stored_size=2 << 30) for e in CLOSE]  # 2 GiB each to download first
    found = resolution(*big)
    costly = sim({"a": 12.0, "b": 6.0})
    assert measure.decide(found, settings("auto"), as_progress(None), costly.opener) == {} and costly.opened == []
    assert "not timed on this device" in found.explain() and "set ENGINEFARM_MEASURE=on" in found.explain()
    assert found.ranked[0].entry.build_key[0] == "a"  # the farm's numbers decide
    cheap = sim({"a": 12.0, "b": 6.0})
    found = resolution(*CLOSE)
    measure.decide(found, settings("auto"), as_progress(None), cheap.opener)
    assert cheap.opened == ["a", "b"] and found.ranked[0].entry.build_key[0] == "b"


def test_off_neither_times_nor_uses_what_was_remembered(sim):
    measure.decide(resolution(*CLOSE), settings("on"), as_progress(None), sim({"a": 12.0, "b": 6.0}).opener)
    found = resolution(*CLOSE)
    never = sim({"a": 1.0, "b": 1.0})
    assert measure.decide(found, settings("off"), as_progress(None), never.opener) == {} and never.opened == []
    assert found.ranked[0].entry.build_key[0] == "a" and "timed on this device" not in found.explain()


def test_a_tie_on_the_device_goes_to_the_more_accurate_precision():
    records = {
        "a": {"p50_ms": 10.2, "iqr_ms": 1.0},
        "b": {"p50_ms": 10.0, "iqr_ms": 1.0},
        "c": {"p50_ms": 5.0, "iqr_ms": 0.1},
    }
    assert measure.pick({k: records[k] for k in "ab"}, {"a": "fp32", "b": "bf16"}) == "a"
    assert measure.pick(records, {"a": "fp32", "b": "bf16", "c": "bf16"}) == "c"


# End to end on real artifacts ---------------------------------------------------------------------------------
@pytest.fixture
def farm_elsewhere(tiny_recipe, cli, tmp_path):
    """The tiny decoder for ONNX Runtime and OpenVINO, benchmarked by a farm runner of another CPU class (the store's
    records are relabelled, as if built there): this device should time the candidates itself."""
    cli("build", str(tiny_recipe(precisions=("fp32", "fp16"), targets=("onnxruntime:cpu", "openvino:cpu"))), check=True)
    store = tmp_path / "store"
    for path in [*(store / "manifests").glob("*.json"), store / "index" / "tiny-sd.json"]:
        path.write_text(path.read_text().replace('"class": "cpu-', '"class": "cpu-farm-'))
    return store


def test_first_load_times_the_candidates_on_this_device_and_remembers(farm_elsewhere, cli, monkeypatch):
    import enginefarm

    monkeypatch.setenv("ENGINEFARM_MEASURE", "on")
    messages = []
    session = enginefarm.load("tiny-sd/decoder", device="cpu", progress=messages.append)
    assert any(
        m.startswith("timing 3 candidates on this device (the leader's number comes from a similar device")
        for m in messages
    )
    text = session.explain()
    assert (
        "timed fastest on this device at a first load" in text
        and text.count("timed on this device at a first load:") == 3
    )
    assert session.run({"latent": np.zeros((1, 4, 8, 8), np.float32)})["sample"].shape == (1, 3, 16, 16)
    (memory,) = (load_settings().home / "device-timings").glob("*.json")
    (result,) = json.loads(memory.read_text())["results"].values()
    assert result["winner"] == session.artifact.build_key and len(result["timings"]) == 3

    np.save(farm_elsewhere.parent / "x.npy", np.zeros((1, 4, 8, 8), np.float32))
    proc = cli(
        "run",
        "tiny-sd/decoder",
        "--input",
        f"latent={farm_elsewhere.parent / 'x.npy'}",
        "--explain",
        "--device",
        "cpu",
        check=True,
    )
    assert "remembered from" in proc.stdout and "timing 3 candidates" not in proc.stderr
    assert f"[{session.artifact.build_key[:12]}]" in proc.stdout.splitlines()[1]
    off = cli(
        "run",
        "tiny-sd/decoder",
        "--input",
        f"latent={farm_elsewhere.parent / 'x.npy'}",
        "--explain",
        "--device",
        "cpu",
        env={"ENGINEFARM_MEASURE": "off"},
        check=True,
    )
    assert "timed on this device" not in off.stdout
