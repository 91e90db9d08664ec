"""How resolution scales with the number of index entries: `load` and `ls` over N near-identical entries.

For each N (default 10^3, 10^4, 10^5) a local store gets one real, loadable ONNX Runtime artifact of `scale/lin`
and N-1 index entries that copy its entry under other build keys (same target, precision and benchmark: every
one tied with every other, the worst case for tie-breaking). The real one is the fastest, so it wins and loads.
Then, each in a fresh child process (so its peak RSS is its own: VmHWM, see hardware/rss.py):
- `load`: `enginefarm.load("scale/lin", device="cpu", store=STORE)`: read the index, resolve, fetch, load;
- `ls`: `enginefarm ls --store STORE` (the rich table, output to /dev/null).
A child runs under an address-space limit (--limit-mb, default 1500), so a blow-up ends in MemoryError here
instead of taking the machine; that row reads "MemoryError".

`--save FILE` writes the numbers as JSON; `--compare FILE` prints them beside an earlier run's with ratios
(earlier / now). A benchmark, not a test: it prints numbers and never fails on them.

    .venv/bin/python bench/resolve_scale.py [--sizes 1000,10000,100000] [--save now.json] [--compare before.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REF = "scale/lin"

CHILD = r"""
import json, os, resource, sys, time
kind, store = sys.argv[1], sys.argv[2]
if os.environ.get("BENCH_TREE"):  # run another checkout's code (an editable install maps enginefarm.* to folders)
    import __editable___enginefarm_0_1_0_finder as finder
    root, tree = os.environ["BENCH_ROOT"], os.environ["BENCH_TREE"]
    finder.MAPPING.update({k: v.replace(root, tree) for k, v in finder.MAPPING.items()})
start = time.perf_counter()
start_cpu = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
try:
    if kind == "load":
        import enginefarm
        session = enginefarm.load("scale/lin", device="cpu", store=store)
        assert session.artifact.build_key == sys.argv[3], session.artifact.build_key
        explained = len(session.explain())
    else:
        import os
        from click.testing import CliRunner
        from enginefarm.cli import main
        with open(os.devnull, "w") as sink:
            sys.stdout = sink
            result = CliRunner().invoke(main, ["ls", "--store", store])
            sys.stdout = sys.__stdout__
        assert result.exit_code == 0, result.output[-2000:]
        explained = 0
    outcome = "ok"
except MemoryError:
    outcome, explained = "MemoryError", 0
seconds = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_SELF)
from enginefarm.hardware import rss  # VmHWM: ru_maxrss would carry the parent's RSS across fork + exec
cpu_s = usage.ru_utime + usage.ru_stime - start_cpu
print(json.dumps({"outcome": outcome, "s": seconds, "cpu_s": cpu_s, "peak_mb": rss.peak_bytes() / 2**20,
                  "explained_chars": explained}))
"""


def make_store(folder: Path, count: int) -> tuple[Path, str]:
    """A local store with one real artifact and `count - 1` copies of its index entry under other keys."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper, save

    from enginefarm.cache.artifacts import pack_files, publish
    from enginefarm.cache.index import Index, parse_index
    from enginefarm.cache.manifest import Manifest
    from enginefarm.cache.stores import open_store

    src = folder / "src"
    src.mkdir(parents=True)
    weight = np.random.default_rng(1).normal(0, 0.3, (8, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "lin",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [numpy_helper.from_array(weight, "w")],
    )
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), src / "model.onnx")
    store = open_store(str(folder / "store"))
    files, blobs = pack_files(src, [("model.onnx", "model")], folder / "blobs")
    bench = {"device": {"class": "cpu-any"}, "p50_ms": 1.0, "iqr_ms": 0.4, "runs": 20, "spread": 0.4}
    real = Manifest(
        build_key=hashlib.sha256(b"real").hexdigest(),
        model="scale",
        model_version="1",
        component="lin",
        precision="fp32",
        profile_name="default",
        profile={"x": {"min": [1, 8], "opt": [1, 8], "max": [4, 8]}},
        target="onnxruntime:cpu",
        toolchain={"onnxruntime": "1", "prep": "1"},
        files=tuple(files),
        benchmarks=(bench,),
    )
    publish(store, real, blobs)
    raw, _ = store.get_index_bytes("scale")
    index = parse_index(raw, "scale")
    entry = index.entries[real.build_key].to_dict()
    data = json.loads(Index("scale").to_json())
    data["entries"][real.build_key] = entry
    for i in range(1, count):
        key = hashlib.sha256(f"copy {i}".encode()).hexdigest()
        data["entries"][key] = {
            **entry,
            "build_key": key,
            "benchmarks": [{**bench, "p50_ms": 1.0 + 0.1 * (i % 3 + 1) / 3}],
        }
    # compact, so 10^5 entries stay under the 64 MiB cap on index reads
    (folder / "store" / "index" / "scale.json").write_text(json.dumps(data, sort_keys=True, separators=(",", ":")))
    return folder / "store", real.build_key


def run_child(kind: str, store: Path, key: str, home: Path, limit_mb: int, tree: Path | None) -> dict:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_mb * 2**20, limit_mb * 2**20))

    # On-device timing off: it times at most 3 candidates whatever N is; this measures what grows with N.
    env = {
        **os.environ,
        "ENGINEFARM_HOME": str(home),
        "ENGINEFARM_OFFLINE": "",
        "PYTHONWARNINGS": "ignore",
        "ENGINEFARM_MEASURE": "off",
    }
    env.pop("ENGINEFARM_OFFLINE")
    if tree is not None:
        env.update(BENCH_TREE=str(tree.resolve()), BENCH_ROOT=str(ROOT))
    started = time.perf_counter()
    # The working directory is on the child's sys.path, so the top-level package `enginefarm` comes from it.
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, kind, str(store), key],
        cwd=tree or ROOT,
        env=env,
        text=True,
        capture_output=True,
        preexec_fn=limit,
    )
    wall = time.perf_counter() - started
    last = proc.stdout.strip().splitlines()[-1:] or [""]
    try:
        result = json.loads(last[0])
    except ValueError:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        result = {
            "outcome": "MemoryError" if "MemoryError" in proc.stderr else f"failed: {tail[0][:120]}",
            "s": None,
            "cpu_s": None,
            "peak_mb": None,
        }
    result["wall_s"] = round(wall, 2)
    return result


def show(now: dict, before: dict | None) -> None:
    """Wall time, CPU time (the machine may be shared: CPU time is the steadier number) and peak RSS, with ratios."""
    head = f"{'N':>8} {'what':5} {'outcome':12} {'wall s':>8} {'cpu s':>8} {'peak MB':>8}"
    print(head + ("  | before: outcome     wall s    cpu s  peak MB | cpu ratio  peak ratio" if before else ""))
    for n, row in now.items():
        for kind, r in row.items():
            line = (
                f"{n:>8} {kind:5} {r['outcome']:12} {_num(r['s']):>8} {_num(r.get('cpu_s')):>8} {_num(r['peak_mb']):>8}"
            )
            if before and n in before and kind in before[n]:
                b = before[n][kind]
                line += (
                    f"  |         {b['outcome']:12}{_num(b['s']):>8} {_num(b.get('cpu_s')):>8} "
                    f"{_num(b['peak_mb']):>8} | {_ratio(b.get('cpu_s'), r.get('cpu_s')):>9} "
                    f"{_ratio(b['peak_mb'], r['peak_mb']):>11}"
                )
            print(line)


def _num(value) -> str:
    return "-" if value is None else f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _ratio(before, now) -> str:
    return "-" if not before or not now else f"{before / now:.1f}x"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1000,10000,100000", help="entry counts, comma-separated")
    p.add_argument("--kinds", default="load,ls", help="what to time: load, ls")
    p.add_argument("--limit-mb", type=int, default=1500, help="address-space limit of each child")
    p.add_argument(
        "--tree",
        type=Path,
        help="run the children on this checkout's code (e.g. `git archive` of the "
        "commit before a change, with cache/_interleave*.so copied in), through the editable install's mapping",
    )
    p.add_argument("--save", type=Path, help="write the numbers here (JSON)")
    p.add_argument("--compare", type=Path, help="an earlier --save file to compare with")
    args = p.parse_args()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            store, key = make_store(Path(tmp) / str(n), n)
            size_mb = (store / "index" / "scale.json").stat().st_size / 2**20
            print(f"N={n}: index {size_mb:.1f} MiB", flush=True)
            results[str(n)] = {
                kind: run_child(kind, store, key, Path(tmp) / f"home-{n}-{kind}", args.limit_mb, args.tree)
                for kind in args.kinds.split(",")
            }
    before = json.loads(args.compare.read_text()) if args.compare else None
    show(results, before)
    if args.save:
        args.save.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
