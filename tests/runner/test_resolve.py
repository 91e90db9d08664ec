"""Resolution, table-driven: fastest measured on this device class wins; constraints filter; explain says why."""

from __future__ import annotations

from dataclasses import replace

import pytest

from enginefarm.cache.index import IndexEntry
from enginefarm.hardware.devices import Device
from enginefarm.runner.resolve import resolve

CPU_V4 = Device("cpu", "Xeon", "cpu-x86_64-v4", ("openvino:cpu", "onnxruntime:cpu"))
CPU_V3 = Device("cpu", "Ryzen", "cpu-x86_64-v3", ("openvino:cpu", "onnxruntime:cpu"))


def entry(key: str, target: str, precision: str = "fp32", benches=(), runtime=None, component="vae"):
    return IndexEntry.from_dict(
        {
            "build_key": key * 64 if len(key) == 1 else key,
            "component": component,
            "precision": precision,
            "target": target,
            "profile_name": "default",
            "profile": {},
            "constraints": {"runtime": runtime or {}},
            "benchmarks": [{"device": {"class": cls}, "p50_ms": ms} for cls, ms in benches],
        },
        "m",
    )


def pick(entries, device=CPU_V4, precision=None):
    resolution = resolve("m/vae", [(e, "store") for e in entries], precision, [device])
    ranked = resolution.ranked
    return (ranked[0].entry.build_key[0] if ranked else None), resolution


CASES = [
    (
        "fastest on this class wins",
        [
            entry("a", "openvino:cpu", benches=[("cpu-x86_64-v4", 9.0)]),
            entry("b", "onnxruntime:cpu", benches=[("cpu-x86_64-v4", 5.0)]),
        ],
        CPU_V4,
        None,
        "b",
    ),
    (
        "this class beats a faster other class",
        [
            entry("a", "openvino:cpu", benches=[("cpu-x86_64-v3", 1.0)]),
            entry("b", "onnxruntime:cpu", benches=[("cpu-x86_64-v4", 5.0)]),
        ],
        CPU_V4,
        None,
        "b",
    ),
    (
        "similar class is a proxy",
        [
            entry("a", "openvino:cpu", benches=[("cpu-x86_64-v4", 4.0)]),
            entry("b", "onnxruntime:cpu", benches=[("cpu-x86_64-v4", 5.0)]),
        ],
        CPU_V3,
        None,
        "a",
    ),
    (
        "measured beats unmeasured",
        [entry("a", "openvino:cpu"), entry("b", "onnxruntime:cpu", benches=[("cpu-x86_64-v4", 50.0)])],
        CPU_V4,
        None,
        "b",
    ),
    ("no benchmarks: IR beats ONNX", [entry("a", "onnxruntime:cpu"), entry("b", "openvino:cpu")], CPU_V4, None, "b"),
    (
        "precision filter",
        [
            entry("a", "onnxruntime:cpu", "fp16", [("cpu-x86_64-v4", 1.0)]),
            entry("b", "onnxruntime:cpu", "fp32", [("cpu-x86_64-v4", 5.0)]),
        ],
        CPU_V4,
        "fp32",
        "b",
    ),
    (
        "GPU-only artifacts are not for a CPU",
        [entry("a", "tensorrt:sm_89", benches=[("nvidia-sm_89", 0.1)]), entry("b", "onnxruntime:cpu")],
        CPU_V4,
        None,
        "b",
    ),
    (
        "runtime range filters",
        [
            entry("a", "onnxruntime:cpu", runtime={"onnxruntime": ">=999.0"}, benches=[("cpu-x86_64-v4", 0.1)]),
            entry("b", "onnxruntime:cpu", benches=[("cpu-x86_64-v4", 9.0)]),
        ],
        CPU_V4,
        None,
        "b",
    ),
    ("other components are ignored", [entry("a", "onnxruntime:cpu", component="unet")], CPU_V4, None, None),
]


@pytest.mark.parametrize("name,entries,device,precision,expected", CASES, ids=[c[0] for c in CASES])
def test_resolution_table(name, entries, device, precision, expected):
    chosen, _ = pick(entries, device, precision)
    assert chosen == expected


def test_explain_names_the_reason_for_each_rejection():
    _, resolution = pick(
        [
            entry("a", "onnxruntime:cpu", runtime={"onnxruntime": ">=999.0"}),
            entry("b", "tensorrt:sm_89"),
            entry("c", "openvino:cpu", "fp16"),
        ],
        precision="fp32",
    )
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
    broken = dataclasses.replace(
        good, build_key=hashlib.sha256(b"broken").hexdigest(), files=tuple(files), benchmarks=(fast,)
    )
    publish(store, broken, blobs)
    session = enginefarm.load("tiny-sd/decoder", device="cpu")
    assert session.artifact.build_key == good_key
    assert f"[{broken.build_key[:12]}]" in session.explain() and "failed:" in session.explain()
    assert session.run({"latent": np.zeros((1, 4, 8, 8), np.float32)})["sample"].shape == (1, 3, 16, 16)


def test_sub_millisecond_latencies_stay_readable_in_explain():
    """Tiny models run in microseconds; '0.0 ms vs 0.0 ms' would explain nothing."""
    entries = [
        entry("a", "openvino:cpu", benches=[("cpu-x86_64-v4", 0.0486)]),
        entry("b", "onnxruntime:cpu", benches=[("cpu-x86_64-v4", 0.0336)]),
    ]
    chosen, resolution = pick(entries)
    assert chosen == "b"
    text = resolution.explain(resolution.ranked[0])
    assert "fastest measured: 0.034 ms vs 0.049 ms" in text and "p50 0.049 ms measured" in text


# Model versions -----------------------------------------------------------------------------------------------
def versioned(key: str, version, target="onnxruntime:cpu", precision="fp32", ms=None):
    e = entry(key, target, precision, [("cpu-x86_64-v4", ms)] if ms is not None else ())
    return replace(e, model_version=str(version)) if version is not None else e


def test_the_newest_usable_version_wins_even_when_slower():
    chosen, resolution = pick([versioned("a", "1", ms=1.0), versioned("b", "10", ms=50.0), versioned("c", "9", ms=2.0)])
    assert chosen == "b" and resolution.version == "10"
    reasons = {c.entry.build_key[0]: c.reason for c in resolution.candidates}
    assert reasons["a"].startswith("older model version 1") and reasons["c"].startswith("older model version 9")


def test_a_pinned_version_is_served_and_others_say_why_not():
    resolution = resolve(
        "m/vae",
        [(versioned("a", "1", ms=1.0), "store"), (versioned("b", "2", ms=5.0), "store")],
        None,
        [CPU_V4],
        version="1.0",
    )
    assert [c.entry.build_key[0] for c in resolution.ranked] == ["a"]
    assert "model version 2, pinned to 1.0" in resolution.explain()


def test_a_newer_version_that_nothing_here_runs_is_named_and_the_older_one_served():
    chosen, resolution = pick([versioned("a", "1", ms=5.0), versioned("b", "2", target="tensorrt:sm_89")])
    assert chosen == "a" and resolution.version == "1"
    assert (
        "model version 2 exists but none of its artifacts is usable here (no device here runs tensorrt:sm_89); "
        "serving version 1" in resolution.explain()
    )


def test_entries_without_a_version_rank_below_versioned_ones():
    chosen, _ = pick([versioned("a", None, ms=1.0), versioned("b", "1", ms=9.0)])
    assert chosen == "b"


# Ties within noise ----------------------------------------------------------------------------------------------
def timed(key: str, target: str, precision: str, p50: float, iqr: float):
    return replace(
        entry(key, target, precision),
        benchmarks=({"device": {"class": "cpu-x86_64-v4"}, "p50_ms": p50, "iqr_ms": iqr, "runs": 9},),
    )


def test_numbers_within_each_others_noise_are_tied_and_the_more_accurate_precision_wins():
    chosen, resolution = pick(
        [timed("a", "openvino:cpu", "bf16", 100.0, 8.0), timed("b", "onnxruntime:cpu", "fp32", 106.0, 6.0)]
    )
    assert chosen == "b"  # 6 ms apart, middle halves ±4 and ±3 ms overlap
    text = resolution.explain(resolution.ranked[0])
    assert (
        "tied with openvino:cpu bf16 at 100.0 ms" in text
        and "the more accurate precision" in text
        and "(±2.8%, 9 runs)" in text
    )


def test_a_difference_beyond_the_noise_is_not_a_tie():
    chosen, resolution = pick(
        [timed("a", "openvino:cpu", "bf16", 100.0, 2.0), timed("b", "onnxruntime:cpu", "fp32", 106.0, 2.0)]
    )
    assert chosen == "a" and "fastest measured: 100.0 ms vs 106.0 ms" in resolution.explain(resolution.ranked[0])


def test_records_without_a_spread_are_never_tied():
    chosen, _ = pick(
        [
            entry("a", "openvino:cpu", "bf16", [("cpu-x86_64-v4", 100.0)]),
            entry("b", "onnxruntime:cpu", "fp32", [("cpu-x86_64-v4", 100.5)]),
        ]
    )
    assert chosen == "a"


def test_tie_clusters_start_from_the_fastest():
    """a~b and b~c, but not a~c: a's cluster is {a, b}; c comes after it however accurate its precision."""
    entries = [
        timed("a", "openvino:cpu", "fp16", 100.0, 4.0),
        timed("b", "onnxruntime:cpu", "fp16", 103.0, 4.0),
        timed("c", "onnxruntime:cpu", "fp32", 106.5, 4.0),
    ]
    _, resolution = pick(entries)
    assert [c.entry.build_key[0] for c in resolution.ranked] == ["a", "b", "c"]


def test_bf16_artifacts_need_a_cpu_that_computes_bf16():
    e = replace(
        entry("a", "openvino:cpu", "bf16", [("cpu-x86_64-v4", 1.0)]),
        constraints={"cpu_flags_any": ["avx512_bf16", "amx_bf16"]},
    )
    plain = Device("cpu", "Xeon", "cpu-x86_64-v4", CPU_V4.targets, {"flags": ["avx2", "avx512f"]})
    with_bf16 = Device("cpu", "Xeon", "cpu-x86_64-v4", CPU_V4.targets, {"flags": ["avx2", "avx512f", "avx512_bf16"]})
    assert pick([e], plain)[0] is None
    assert "only on a CPU with avx512_bf16 or amx_bf16; this one has neither" in pick([e], plain)[1].explain()
    assert pick([e], with_bf16)[0] == "a"


# Runtime version ranges (issue 25, finding 6): every component counts, and every PEP 440 operator is understood.
# Before, three components were kept and `<=`, `!=`, `~=` ignored: a plan built by TensorRT 10.12.0.36 was ranked
# usable on 10.12.0.99 and failed only after the download.
@pytest.mark.parametrize(
    "have,spec,usable",
    [
        ("10.12.0.99", "==10.12.0.36", False),
        ("10.12.0.36", "==10.12.0.36", True),
        ("10.13.1", "<=10.13.0", False),
        ("10.13.0", "<=10.13.0", True),
        ("10.12.0", "!=10.12.0", False),
        ("10.13.0", "~=10.12.0", False),
        ("10.12.5", "~=10.12.0", True),
        ("10.13.0.35", ">=10.13.0.35,<11", True),
        ("11.0.0.1", ">=10.13.0.35,<11", False),
        ("10.13.0.34", ">=10.13.0.35,<11", False),
        ("2026.4.1-22982-e213a147257-releases/2026/4", ">=2026.4.1", True),  # OpenVINO's __version__
        ("2026.4.0-1-abc", ">=2026.4.1", False),
        ("1.17.0+cu121", ">=1.17", True),
        ("550.54.15", "<535", False),  # a driver minimum, as resolve asks it
        ("1.2.3", "not a range", False),
        # plain floors take a path without packaging: the same answers
        ("1.32.0", ">=1.32", True),
        ("1.32", ">=1.32.0", True),
        ("1.31.9", ">=1.32.0", False),
        ("1.32.10", ">= 1.32.9", True),
        ("2.0", ">=10.0", False),
        ("1.33.0rc1", ">=1.32.0", True),
        ("1.32.0rc1", ">=1.32.0", False),
    ],
)
def test_runtime_version_ranges(have, spec, usable):
    from enginefarm.backends.base import version_in_range

    assert version_in_range(have, spec) is usable


def test_an_artifact_for_another_build_of_the_runtime_is_not_ranked_usable():
    """Resolution with the runtime installed here: an artifact pinned to a fourth component this runtime lacks."""
    from enginefarm.backends import Availability
    from enginefarm.runner.resolve import _runtime_version

    have = _runtime_version("onnxruntime")
    pinned = entry("a", "onnxruntime:cpu", runtime={"onnxruntime": f"=={have}.99"}, benches=[("cpu-x86_64-v4", 0.1)])
    resolution = resolve("m/vae", [(pinned, "store")], None, [CPU_V4], can_load=lambda t: Availability(True, True, ""))
    assert (
        resolution.ranked == [] and f"needs onnxruntime =={have}.99, this has {have}" in resolution.candidates[0].reason
    )
