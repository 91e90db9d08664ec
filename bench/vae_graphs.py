"""Two VAE decoder graphs on the same OpenVINO, in one process, alternating: enginefarm's (ONNX → IR) against the
one optimum-intel exports for OpenVINO GenAI, from the same weights (bench/pipelines.py's --work folder).

Each graph is compiled with enginefarm's CPU config (f32, LATENCY), dynamic as read and reshaped static to the
latent's shape, and their outputs compared. Then --repeats rounds, each one inference of every variant in turn (the
order rotating), after one untimed inference each; medians, and ratios against GenAI's dynamic graph. Also printed:
each graph's op counts as read and as the CPU plugin runs it (the compiled runtime model's layer types), the two
side by side where they differ. A benchmark, not a test.

    .venv/bin/python bench/vae_graphs.py [--work .enginefarm/bench-pipelines] [--latent 64] [--repeats 15]
        [--ir OTHER.xml]   # a third graph, e.g. a re-exported decoder
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONFIG = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}


def enginefarm_ir(work: Path) -> Path:
    """The vae_decoder artifact's IR in the bench's local cache (bench/pipelines.py fetched it there)."""
    for manifest in sorted((work / "enginefarm-home" / "artifacts").glob("*/manifest.json")):
        if json.loads(manifest.read_text()).get("component") == "vae_decoder":
            return manifest.with_name("model.xml")
    sys.exit(f"error: no vae_decoder artifact under {work}/enginefarm-home: run bench/pipelines.py first")


def op_counts(model) -> collections.Counter:
    return collections.Counter(op.get_type_name() for op in model.get_ordered_ops())


def runtime_counts(compiled) -> collections.Counter:
    """The layer types the CPU plugin runs (after its fusions), from the compiled model's runtime graph."""
    return collections.Counter(
        op.get_rt_info()["layerType"].astype(str) for op in compiled.get_runtime_model().get_ordered_ops()
    )


def side_by_side(title: str, a: collections.Counter, b: collections.Counter, names: tuple[str, str]) -> None:
    print(f"\n{title} (where they differ)\n{'op':<28}{names[0]:>12}{names[1]:>12}")
    for op in sorted(set(a) | set(b)):
        if a[op] != b[op]:
            print(f"{op:<28}{a[op]:>12}{b[op]:>12}")
    print(f"{'total':<28}{sum(a.values()):>12}{sum(b.values()):>12}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=ROOT / ".enginefarm" / "bench-pipelines")
    p.add_argument("--latent", type=int, default=64, help="latent side (image side / 8; default 64: 512 px)")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--ir", type=Path, action="append", default=[], help="another decoder IR or ONNX to compare")
    p.add_argument("--enginefarm-ir", type=Path, default=None, help="enginefarm's IR (default: the bench's cache)")
    p.add_argument("--no-static", action="store_true", help="only the graphs as read (dynamic)")
    args = p.parse_args()
    import openvino as ov

    core = ov.Core()
    graphs = {
        "enginefarm": args.enginefarm_ir or enginefarm_ir(args.work),
        "genai": args.work / "genai" / "vae_decoder" / "openvino_model.xml",
    }
    graphs.update({path.stem if path.stem not in graphs else str(path): path for path in args.ir})
    latent = np.random.default_rng(0).standard_normal((1, 4, args.latent, args.latent), np.float32)
    load = os.getloadavg()[0]
    print(f"{time.strftime('%H:%M:%S')} load average {load:.2f} on {os.cpu_count()} CPUs; latent {latent.shape}")
    models, compiled, counts, outputs = {}, {}, {}, {}
    for name, path in graphs.items():
        models[name] = core.read_model(str(path))
        counts[name] = op_counts(models[name])
        shapes = {"dynamic": None} if args.no_static else {"dynamic": None, "static": latent.shape}
        for kind, shape in shapes.items():
            model = core.read_model(str(path))
            if shape is not None:
                model.reshape({model.inputs[0].get_any_name(): ov.PartialShape(list(shape))})
            started = time.perf_counter()
            one = core.compile_model(model, "CPU", CONFIG)
            label = f"{name} {kind}"
            compiled[label] = one.create_infer_request()
            first, first_cpu = time.perf_counter(), time.process_time()
            outputs[label] = np.array(compiled[label].infer({0: latent})[0])
            print(
                f"{label:<24} compile {first - started:6.2f} s, first inference {time.perf_counter() - first:6.2f} s "
                f"({time.process_time() - first_cpu:.2f} CPU s)",
                flush=True,
            )
            if kind == "dynamic":
                counts[name + " runtime"] = runtime_counts(one)
    reference = outputs["genai dynamic"]
    for label, out in outputs.items():
        print(f"max |{label} - genai dynamic| = {float(np.max(np.abs(out - reference))):.2e}")
    side_by_side("ops as read", counts["enginefarm"], counts["genai"], ("enginefarm", "genai"))
    side_by_side(
        "ops the CPU plugin runs", counts["enginefarm runtime"], counts["genai runtime"], ("enginefarm", "genai")
    )

    # wall seconds, and this process's CPU seconds (all threads): on a shared machine the second moves less
    clocks = {"wall": time.perf_counter, "CPU": time.process_time}
    times: dict[str, dict[str, list[float]]] = {label: {c: [] for c in clocks} for label in compiled}
    labels = list(compiled)
    for r in range(args.repeats):
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            started = {c: clock() for c, clock in clocks.items()}
            compiled[label].infer({0: latent})
            for c, clock in clocks.items():
                times[label][c].append(clock() - started[c])
    print(f"\n{args.repeats} rounds, alternating; load average now {os.getloadavg()[0]:.2f}")
    for c in clocks:
        base = times["genai dynamic"][c]
        print(f"{c + ' s':<24}{'median':>10}{'min':>8}{'/ genai dynamic':>17}{'pairs min/med/max':>22}")
        for label, got in times.items():
            pairs = [a / b for a, b in zip(got[c], base, strict=True)]
            print(
                f"{label:<24}{statistics.median(got[c]):>10.3f}{min(got[c]):>8.3f}"
                f"{statistics.median(got[c]) / statistics.median(base):>17.3f}"
                f"{min(pairs):>8.3f} /{statistics.median(pairs):.3f} /{max(pairs):.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
