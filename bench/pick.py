"""Does `enginefarm.load` pick the fastest artifact? Measures every artifact of one component side by side.

For each artifact of REF (default sd15/vae_decoder) in the store (every target x precision that runs on
this CPU), the script loads it with `enginefarm.load(ref, precision=p, device="cpu", target=t)`, runs it
once to warm up, then times --runs inferences interleaved round-robin across artifacts (so machine noise
hits all of them alike) on one seeded input at the profile's opt shape, and takes each one's median.
Then it calls `enginefarm.load(ref, device="cpu")` as an app would (no precision, no target: all
precisions compete) and reports which artifact that picked, and how its median compares to the fastest.

Missing artifacts are built first through `enginefarm build` (a few minutes for the VAE on a 2-core CPU).
A benchmark, not a test: it prints numbers and never fails on them.

    .venv/bin/python bench/pick.py [--runs 5] [--store DIR] [--home DIR] [--recipe R --ref MODEL/COMPONENT]
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import _common

TARGET_RATIO = 1.05


def main() -> None:
    p = _common.parser(__doc__)
    p.add_argument("--runs", type=int, default=5, help="timed runs per artifact (default 5)")
    args = p.parse_args()
    _common.setup(args)
    _common.ensure_built(args)
    started = time.perf_counter()

    import enginefarm

    model, _, component = args.ref.partition("/")
    listed = json.loads(_common.cli("ls", "--store", str(args.store), "--model", model, "--json", capture=True))
    pairs = sorted({(e["target"], e["precision"]) for e in listed if e["component"] == component})
    if not pairs:
        sys.exit(f"error: no artifact of {args.ref} in {args.store}")
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
    if len(listed) > len(pairs):
        print(f"note: the store holds {len(listed)} artifacts for {len(pairs)} target x precision pairs; measured the one load() takes for each")
    feeds = _common.opt_feeds(next(iter(sessions.values())).artifact)
    shape = {k: list(v.shape) for k, v in feeds.items()}
    print(f"{args.ref}: {len(sessions)} artifacts, input {shape}, 1 warm-up + {args.runs} interleaved runs each", flush=True)

    for s in sessions.values():
        s.run(feeds)
    times: dict[str, list[float]] = {key: [] for key in sessions}
    for r in range(args.runs):
        for key, s in sessions.items():
            t0 = time.perf_counter()
            s.run(feeds)
            times[key].append((time.perf_counter() - t0) * 1000)
        print(f"  round {r + 1}/{args.runs} done", flush=True)
    median = {key: statistics.median(ts) for key, ts in times.items()}

    picked = enginefarm.load(args.ref, device="cpu", store=str(args.store))
    pick_key = picked.artifact.build_key
    fastest = min(median.values())

    print(f"\n{'':2}{'artifact':<14}{'target':<17}{'prec':<6}{'runs in':<9}{'build p50':>11}{'median ms':>11}{'x fastest':>11}")
    for key in sorted(median, key=median.get):
        a = sessions[key].artifact
        build_p50 = min((b["p50_ms"] for b in a.benchmarks), default=None)
        build_txt = f"{build_p50:.1f}" if build_p50 is not None else "-"
        mark = "> " if key == pick_key else "  "
        print(f"{mark}{key[:12]:<14}{a.target:<17}{a.precision:<6}{sessions[key].compute_precision:<9}{build_txt:>11}{median[key]:>11.1f}{median[key] / fastest:>11.2f}")
    print("(> = picked by enginefarm.load(ref, device='cpu'); 'build p50' = the farm's benchmark that ranks artifacts)")
    print("\n" + "\n".join(picked.explain().splitlines()[:3]))
    if pick_key not in median:
        print(f"\npicked {pick_key[:12]} ({picked.artifact.target} {picked.artifact.precision}), which was not measured: no ratio")
    else:
        print(f"\npick ratio (picked / fastest): {median[pick_key] / fastest:.2f} (target <= {TARGET_RATIO:.2f})")
    print(f"measured in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
