"""Resolution scales with the number of index entries: tie clusters match their definition, and a load among
10^5 tied entries stays within a memory bound (measured by the loading process itself; never a wall-clock time)."""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys

import pytest

from enginefarm.cache.index import IndexEntry
from enginefarm.cache.records import tied
from enginefarm.hardware.devices import Device
from enginefarm.runner.resolve import resolve
from tests.releases import REF, artifact

CPU = Device("cpu", "Xeon", "cpu-x86_64-v4", ("onnxruntime:cpu",))


def _entry(i: int, p50: float, iqr: float) -> IndexEntry:
    return IndexEntry.from_dict(
        {
            "build_key": f"{i:064x}",
            "component": "vae",
            "precision": ("fp32", "fp16", "bf16")[i % 3],
            "target": "onnxruntime:cpu",
            "profile_name": "default",
            "benchmarks": [{"device": {"class": "cpu-x86_64-v4"}, "p50_ms": p50, "iqr_ms": iqr}],
        },
        "m",
    )


def _naive_clusters(candidates) -> list[set[str]]:
    """The definition, quadratic: the fastest remaining and every remaining candidate tied with it."""
    remaining, clusters = sorted(candidates, key=lambda c: c.p50_ms), []
    while remaining:
        leader = remaining[0]
        group = [c for c in remaining if c is leader or tied(leader.bench, c.bench)]
        clusters.append({c.entry.build_key for c in group})
        remaining = [c for c in remaining if c not in group]
    return clusters


def test_tie_clusters_are_the_fastest_remaining_and_what_is_tied_with_it():
    rng = random.Random(7)
    for trial in range(200):
        # Unrounded numbers (an exact tie at the edge rounds differently in the two formulas), some medians repeated.
        medians = [rng.uniform(1, 3) for _ in range(rng.randint(1, 40))]
        entries = [
            _entry(i, rng.choice(medians), rng.choice([0, 0.05, 0.2, 1.5]) * rng.random()) for i in range(len(medians))
        ]
        resolution = resolve("m/vae", [(e, "store") for e in entries], None, [CPU])
        by_cluster: dict[int, set[str]] = {}
        for c in resolution.candidates:
            by_cluster.setdefault(c.rank[4], set()).add(c.entry.build_key)
        assert [by_cluster[k] for k in sorted(by_cluster)] == _naive_clusters(resolution.candidates), trial
        for c in resolution.candidates:
            assert {o.entry.build_key for o in c.tied_with} == by_cluster[c.rank[4]] - {c.entry.build_key}
            assert all(c.is_tied_with(o) == (o is not c and o.rank[4] == c.rank[4]) for o in resolution.candidates)


# The child's own peak (VmHWM): ru_maxrss would carry the pytest parent's RSS across fork + exec (hardware/rss.py).
CHILD = r"""
import json, sys
import enginefarm
from enginefarm.hardware import rss
session = enginefarm.load(sys.argv[1], device="cpu", store=sys.argv[2])
explained = len(session.explain())
print(json.dumps({"key": session.artifact.build_key, "explain": explained, "peak_mb": rss.peak_bytes() / 2**20}))
"""


@pytest.mark.slow  # 100 000 entries written, then a load in a child process
def test_a_load_among_100000_tied_entries_stays_under_500_mb(tmp_path):
    """20 000 near-identical entries took 3.4 GB (every candidate listed every other as tied); 10^5 ended in
    MemoryError. The child's address space is capped so a regression fails here instead of taking the machine."""
    store_dir = tmp_path / "store"
    from enginefarm.cache.stores import open_store

    real = artifact(open_store(str(store_dir)), tmp_path, "real", p50=1.0)
    index_path = store_dir / "index" / "m.json"
    data = json.loads(index_path.read_bytes())
    entry = data["entries"][real.build_key]
    entry["benchmarks"][0].update(iqr_ms=0.4)
    for i in range(1, 100_000):
        key = f"{i:064x}"
        data["entries"][key] = {
            **entry,
            "build_key": key,
            "benchmarks": [{**entry["benchmarks"][0], "p50_ms": 1.0 + (i % 3 + 1) / 30}],
        }
    index_path.write_text(json.dumps(data, separators=(",", ":")))

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))

    proc = subprocess.run(
        [sys.executable, "-c", CHILD, REF, str(store_dir)],
        capture_output=True,
        text=True,
        preexec_fn=cap,
        env={**os.environ, "ENGINEFARM_HOME": str(tmp_path / "home")},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["key"] == real.build_key  # the fastest, tied with all the others, wins
    assert result["peak_mb"] < 500, result
    assert result["explain"] < 20_000, result  # the explanation summarises 10^5 rivals instead of listing each
