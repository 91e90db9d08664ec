"""Benchmarks, verdicts and constraints inside an index entry are typed records, and the index JSON does not change
for it: an entry written before (or by a newer version, with fields this one does not read) is written back by a
read-merge-write exactly as it was."""

from __future__ import annotations

import json

import pytest

from enginefarm.cache.fields import FieldError
from enginefarm.cache.index import read_index
from enginefarm.cache.records import Benchmark, Constraints, Verdict
from enginefarm.cache.stores import open_store
from tests.releases import artifact

# As builds wrote them before the records were typed: timing fields, a described device, fields nobody reads here.
OLD_BENCH = {
    "device": {"class": "cpu-x86_64-v4", "cpu": "Xeon", "flags": ["avx2"]},
    "p50_ms": 3.25,
    "p90_ms": 3.5,
    "runs": 40,
    "spread": 0.03,
    "iqr_ms": 0.1,
    "stopped": "spread",
    "load_ms": 51.0,
    "first_inference_ms": 4.0,
    "peak_rss_mb": 180.5,
    "resident_mb": None,
}
OLD_VERDICT = {"passed": None, "executed": False, "settings": "ab" * 32, "why": "built without the device to run it"}
OLD_CONSTRAINTS = {
    "runtime": {"onnxruntime": ">=1.17"},
    "min_driver": None,
    "os": ["linux"],
    "vram_mb": 512,
    "cpu_flags_any": ["avx512_bf16", "amx_bf16"],
    "engine": {"openvino": "2025.1"},
    "newer_field": [1, 2],
}


def test_an_index_written_before_survives_a_merge_unchanged(tmp_path):
    store = open_store(str(tmp_path / "store"))
    first = artifact(store, tmp_path, "a", p50=1.5)
    path = tmp_path / "store" / "index" / "m.json"
    data = json.loads(path.read_bytes())
    old = {
        **data["entries"][first.build_key],
        "benchmarks": [OLD_BENCH],
        "validation": OLD_VERDICT,
        "constraints": OLD_CONSTRAINTS,
    }
    data["entries"][first.build_key] = old
    path.write_text(json.dumps(data))
    artifact(store, tmp_path, "b", p50=2.0)  # another build merges its entry: the index is parsed and written again
    after = json.loads(path.read_bytes())["entries"]
    assert len(after) == 2 and after[first.build_key] == old

    entry = read_index(store, "m").entries[first.build_key]
    (bench,) = entry.benchmarks
    assert (bench.device_class, bench.p50_ms, bench.p90_ms, bench.runs) == ("cpu-x86_64-v4", 3.25, 3.5, 40)
    assert bench.load_ms == 51.0 and bench.first_inference_ms == 4.0
    assert bench.noise_ms == 0.05 and bench.rest == {"stopped": "spread", "peak_rss_mb": 180.5, "resident_mb": None}
    assert entry.validation.passed is None and entry.validation.stored("passed") and not entry.validation.failed
    assert entry.validation.executed is False and not entry.validation.stored("failure")
    c = entry.constraints
    assert (c.runtime, c.min_driver, c.os, c.vram_mb) == ({"onnxruntime": ">=1.17"}, None, ("linux",), 512)
    assert c.cpu_flags_any == ("avx512_bf16", "amx_bf16") and c.rest == {"min_driver": None, "newer_field": [1, 2]}


def test_records_tie_and_refuse_like_the_dicts_did():
    a = Benchmark.from_dict({"device": {"class": "c"}, "p50_ms": 100.0, "iqr_ms": 8.0})
    assert a.tied(Benchmark.from_dict({"device": {"class": "c"}, "p50_ms": 106.0, "iqr_ms": 4.0}))
    assert not a.tied(Benchmark.from_dict({"device": {"class": "c"}, "p50_ms": 106.1, "iqr_ms": 4.0}))
    assert Benchmark.from_dict({"p50_ms": 2.0, "spread": 0.1}, on_device=True).noise_ms == 0.1
    odd = {"device": {"class": "c"}, "p50_ms": 1.0, "iqr_ms": "n/a"}  # a damaged noise is no noise, kept as stored
    assert Benchmark.from_dict(odd).noise_ms == 0.0 and Benchmark.from_dict(odd).to_dict() == odd
    with pytest.raises(FieldError, match=r"benchmark\.device: must be an object"):
        Benchmark.from_dict({"p50_ms": 1.0})
    with pytest.raises(FieldError, match=r"validation\.passed"):
        Verdict.from_dict({"passed": "yes"})
    with pytest.raises(FieldError, match=r"constraints\.vram_mb"):
        Constraints.from_dict({"vram_mb": "lots"})
    assert not Verdict.from_dict({}) and Verdict.from_dict({"passed": False}).failed
    # The index keeps the summary of a report.
    assert Verdict.from_dict({"passed": True, "checks": [1]}).to_dict() == {"passed": True}
