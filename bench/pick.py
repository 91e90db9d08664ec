"""Does `enginefarm.load` pick the fastest artifact? Every artifact of a component, measured side by side.

For the SD 1.5 VAE decoder and the tiny decoder (default: both; `--model vae|tiny`), every artifact in the store
that runs on this CPU (OpenVINO fp32/fp16/bf16, ONNX Runtime fp32/fp16) is loaded with
`enginefarm.load(ref, precision=p, device="cpu", target=t)`, warmed up, and timed --runs rounds interleaved
round-robin (machine noise hits all alike) on one seeded input at the profile's opt shape; each gets its median.
Then an app's `enginefarm.load(ref, device="cpu")` picks, each time from a fresh cache:
- farm numbers only (ENGINEFARM_MEASURE=off): the build-time benchmarks (and their tie rule) decide;
- with on-device timing (ENGINEFARM_MEASURE=on): the close candidates are timed on this CPU at the first load;
and both again as a device of another class than the farm's runners (a copy of the store whose benchmark records
name another CPU class, as if the farm built elsewhere): then the farm's numbers are only a similar device's, and
on-device timing times the top candidates.
For each pick: its median here / the fastest median here (target <= 1.05), and how long the load took.
bf16 is compared with fp32 (latency and validation scores) where both exist.

Missing artifacts are built first through `enginefarm build` (minutes for the VAE on a 2-core CPU).
A benchmark, not a test: it prints numbers and never fails on them.

    .venv/bin/python bench/pick.py [--runs 7] [--model both|vae|tiny] [--store DIR] [--home DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import _common

TARGET_RATIO = 1.05
MODELS = {
    "vae": (_common.ROOT / "recipes" / "sd_vae_decoder.toml", "sd15/vae_decoder"),
    "tiny": (_common.ROOT / "recipes" / "tiny_sd.toml", "tiny-sd/decoder"),
}


def main() -> None:
    p = _common.parser(__doc__)
    p.add_argument("--runs", type=int, default=7, help="interleaved timed rounds per artifact (default 7)")
    p.add_argument("--model", choices=("both", *MODELS), default="both")
    args = p.parse_args()
    _common.setup(args)
    for name in MODELS if args.model == "both" else (args.model,):
        recipe, ref = MODELS[name]
        one = argparse.Namespace(**{**vars(args), "recipe": recipe, "ref": ref})
        _common.ensure_built(one)
        measure(one)


def measure(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    import enginefarm

    model, _, component = args.ref.partition("/")
    listed = json.loads(_common.cli("ls", "--store", str(args.store), "--model", model, "--json", capture=True))
    pairs = sorted({(e["target"], e["precision"]) for e in listed if e["component"] == component})
    if not pairs:
        sys.exit(f"error: no artifact of {args.ref} in {args.store}")
    _phase(args, "side-by-side", "off")
    sessions = {}  # build_key -> session
    for target, precision in pairs:
        try:
            s = enginefarm.load(args.ref, precision=precision, device="cpu", target=target, store=str(args.store))
        except enginefarm.EnginefarmError as exc:
            print(f"skipped {target} {precision}: {exc}")
            continue
        sessions[s.artifact.build_key] = s
    if not sessions:
        sys.exit(f"error: no artifact of {args.ref} loads here")
    feeds = _common.opt_feeds(next(iter(sessions.values())).artifact)
    shape = {k: list(v.shape) for k, v in feeds.items()}
    print(
        f"\n{args.ref}: {len(sessions)} artifacts, input {shape}, 1 warm-up + {args.runs} interleaved runs each",
        flush=True,
    )
    for s in sessions.values():
        s.run(feeds)
    times: dict[str, list[float]] = {key: [] for key in sessions}
    for _ in range(args.runs):
        for key, s in sessions.items():
            t0 = time.perf_counter()
            s.run(feeds)
            times[key].append((time.perf_counter() - t0) * 1000)
    median = {key: statistics.median(ts) for key, ts in times.items()}
    spread = {key: _iqr(ts) / median[key] for key, ts in times.items()}
    fastest = min(median.values())

    print(
        f"\n{'':2}{'artifact':<14}{'target':<17}{'prec':<6}{'computes':<10}{'farm p50 (spread, runs)':>26}"
        f"{'here ms':>10}{'spread':>8}{'x fastest':>11}{'min cos':>11}{'max|d|/range':>14}"
    )
    for key in sorted(median, key=median.get):
        a = sessions[key].artifact
        bench = a.benchmarks[0] if a.benchmarks else {}
        farm = f"{bench['p50_ms']:.1f} (±{50 * bench.get('spread', 0):.1f}%, {bench.get('runs')})" if bench else "-"
        v = a.validation
        print(
            f"  {key[:12]:<14}{a.target:<17}{a.precision:<6}{sessions[key].compute_precision:<10}{farm:>26}"
            f"{median[key]:>10.1f}{100 * spread[key]:>7.1f}%{median[key] / fastest:>11.2f}"
            f"{v.get('min_cosine', float('nan')):>11.6f}{v.get('max_abs_rel_seen') or 0:>14.2e}"
        )
    _bf16_vs_fp32(sessions, median)
    del sessions

    elsewhere = _farm_elsewhere(args.store, args.home / "store-farm-elsewhere")
    for store, where in ((args.store, "farm of this CPU class"), (elsewhere, "farm of another CPU class")):
        for mode, label in (
            ("off", "farm numbers only (ENGINEFARM_MEASURE=off)"),
            ("on", "with on-device timing (ENGINEFARM_MEASURE=on)"),
        ):
            _pick(args, store, where, mode, label, median, fastest)
    print(f"\n{args.ref} measured in {time.perf_counter() - started:.0f} s")


def _pick(
    args: argparse.Namespace, store: Path, where: str, mode: str, label: str, median: dict[str, float], fastest: float
) -> None:
    import enginefarm

    _phase(args, f"pick-{mode}", mode)
    t0 = time.perf_counter()
    picked = enginefarm.load(args.ref, device="cpu", store=str(store), progress=lambda m: print(f"    {m}", flush=True))
    took = time.perf_counter() - t0
    key = picked.artifact.build_key
    ratio = f"{median[key] / fastest:.2f}" if key in median else "n/a (not measured side by side)"
    print(
        f"\npick ({where}), {label}: {picked.artifact.target} {picked.artifact.precision} [{key[:12]}]; load took "
        f"{took:.1f} s"
    )
    print("  " + "\n  ".join(picked.explain().splitlines()[1:3]))
    print(f"  pick ratio (picked / fastest here): {ratio} (target <= {TARGET_RATIO:.2f})")


def _farm_elsewhere(store: Path, copy: Path) -> Path:
    """The store as a farm of another CPU class would have built it: same blobs (linked), benchmark records
    relabelled."""
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir(parents=True)
    (copy / "blobs").symlink_to(store / "blobs")
    for folder in ("manifests", "index"):
        (copy / folder).mkdir()
        for path in (store / folder).glob("*.json"):
            (copy / folder / path.name).write_text(path.read_text().replace('"class": "cpu-', '"class": "cpu-farm-'))
    return copy


def _phase(args: argparse.Namespace, name: str, measure_mode: str) -> None:
    """Each phase loads from its own fresh cache, as a new app install would."""
    home = args.home / name
    shutil.rmtree(home, ignore_errors=True)
    os.environ["ENGINEFARM_HOME"] = str(home)
    os.environ["ENGINEFARM_MEASURE"] = measure_mode


def _iqr(values: list[float]) -> float:
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


def _bf16_vs_fp32(sessions: dict, median: dict[str, float]) -> None:
    by = {(s.artifact.target, s.artifact.precision): key for key, s in sessions.items()}
    for target in sorted({t for t, _ in by}):
        if (target, "bf16") in by and (target, "fp32") in by:
            b, f = by[(target, "bf16")], by[(target, "fp32")]
            vb, vf = sessions[b].artifact.validation, sessions[f].artifact.validation
            print(
                f"\n{target}: bf16 / fp32 latency here {median[b] / median[f]:.2f} ({median[b]:.1f} vs "
                f"{median[f]:.1f} ms); validation min cosine {vb.get('min_cosine')} vs {vf.get('min_cosine')}, max "
                f"|diff| / range {vb.get('max_abs_rel_seen'):.2e} vs {vf.get('max_abs_rel_seen'):.2e}, min PSNR "
                f"{vb.get('min_psnr')} vs {vf.get('min_psnr')} dB"
            )


if __name__ == "__main__":
    main()
