"""OpenVINO's warm start and static shapes (sessions/openvino_compiled.py, sessions/openvino_static.py): the time
`Pipeline.load` takes in a fresh process when every component is compiled from its IR (KEEP_COMPILED off: what loads
did before) against loading the compiled models kept in the device cache, and one UNet call on the dynamic compile
against the static one at the request's shape, alternating in one process (medians and their ratio).

The model is the tiny SD 1.x (tests/tiny_pipelines.py), or with `--narrow` the issue's narrow SD 1.5 (UNet
128/256/512/512 with SD 1.5's CLIP-L and VAE, random weights; the same maker as bench/close_memory.py's), built for
openvino:cpu fp32 with latents 32..64 (256..512 px) and batch 1..2. A benchmark, not a test.

    .venv/bin/python bench/openvino_warm.py [--narrow] [--starts 3] [--calls 7] [--size 512] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from families import _cli, _tiny_pipelines  # bench/families.py: the tiny pipelines and the CLI

_LOAD = """
import json, sys, time
keep = sys.argv[4] == "keep"
import enginefarm.sessions.openvino_static as st
st.KEEP_COMPILED = keep
st.STATIC = "auto" if keep else "never"
from enginefarm.diffusion import Pipeline
name, store, assets = sys.argv[1:4]
start = time.perf_counter()
pipe = Pipeline.load(name, store=store, assets=assets, target="openvino:cpu", precision="fp32", device="cpu")
print(json.dumps({"load_s": time.perf_counter() - start}))
"""

_AB = """
import json, statistics, sys, time
import numpy as np
import enginefarm
from enginefarm.sessions.openvino import _Variant
from enginefarm.hardware.rss import current_bytes
name, store, size, calls = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with enginefarm.load(name + "/unet", store=store, precision="fp32", target="openvino:cpu", device="cpu") as unet:
    width = unet.artifact.profile["encoder_hidden_states"]["min"][2]
    rng = np.random.default_rng(0)
    feeds = {
        "sample": rng.standard_normal((2, 4, size // 8, size // 8)).astype(np.float32),
        "timestep": np.array([500.0, 500.0], np.float32),
        "encoder_hidden_states": rng.standard_normal((2, 77, width)).astype(np.float32),
    }
    inner = unet._session
    inner._dynamic.request.infer(feeds)
    rss_dynamic = current_bytes() / 2**20  # the dynamic compile loaded and run once
    shapes = {k: v.shape for k, v in feeds.items()}
    from enginefarm.sessions.openvino_compiled import shape_key
    static = _Variant(inner._static.compile(shapes, shape_key(shapes)))
    dynamic = inner._dynamic
    times = {"dynamic": [], "static": []}
    outs = {}
    pair = (("dynamic", dynamic), ("static", static))
    for i in range(calls + 1):
        for label, variant in pair if i % 2 else pair[::-1]:  # each goes first in every other round
            start = time.perf_counter()
            result = variant.request.infer(feeds)
            if i:  # the first of each: allocation, not the steady call
                times[label].append(time.perf_counter() - start)
            outs[label] = np.array(result[variant.compiled.outputs[0]])
    rss_both = current_bytes() / 2**20  # and the static one beside it
    span = float(np.ptp(outs["dynamic"]))
    print(json.dumps({
        "dynamic_ms": [t * 1000 for t in times["dynamic"]],
        "static_ms": [t * 1000 for t in times["static"]],
        "rss_mb_dynamic": rss_dynamic,
        "rss_mb_with_static": rss_both,
        "max_abs_over_range": float(np.abs(outs["static"] - outs["dynamic"]).max() / span),
    }))
"""


def build(work: Path, narrow: bool) -> tuple[Path, Path]:
    out, store = work / "export", work / "store"
    if (out / "recipe.toml").is_file() and store.is_dir():
        return out, store
    source = _tiny_pipelines().make_tiny_pipeline("sd1", work / "source")
    latent, batch = ("32,64,64", "1,2,2") if narrow else ("8,16,16", "1,2,2")
    if narrow:
        import close_memory  # bench/close_memory.py: SD 1.5's CLIP-L and VAE
        from batch import sd15_layout_unet  # bench/batch.py

        sd15_layout_unet(128).save_pretrained(source / "unet")
        close_memory._full_size_text_and_vae(source)
    _cli("export", str(source), "--out", str(out), "--latent", latent, "--batch", batch)
    recipe = out / "recipe.toml"
    table = "[components.unet.validate]\n"
    recipe.write_text(recipe.read_text().replace(table, table + "max_abs_rel = 0.02\n"))
    _cli("build", str(recipe), "--store", str(store), "--no-bench", "--precision", "fp32", "--target", "openvino:cpu")
    return out, store


def child(code: str, *args: str, home: Path) -> dict:
    env = dict(os.environ, ENGINEFARM_HOME=str(home))
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--narrow", action="store_true", help="the issue's narrow SD 1.5 instead of the tiny SD 1.x")
    p.add_argument("--starts", type=int, default=3, help="process starts per mode (the first of 'keep' compiles)")
    p.add_argument("--calls", type=int, default=7, help="UNet calls of each compile in the A/B (0: no A/B)")
    p.add_argument("--size", type=int, default=0, help="image side in px (default: the profile's largest)")
    p.add_argument("--work", type=Path, default=None)
    args = p.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-ov-warm-"))
    out, store = build(work, args.narrow)
    name = tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]
    size = args.size or (512 if args.narrow else 128)
    loads: dict[str, list[float]] = {"compile": [], "keep": []}
    for mode in ("compile", "keep"):
        home = work / f"home-{mode}"
        shutil.rmtree(home, ignore_errors=True)
        for _ in range(args.starts):
            loads[mode].append(child(_LOAD, name, str(store), str(out / "assets"), mode, home=home)["load_s"])
    print(f"Pipeline.load, s per process start (the first fetches the artifacts into an empty cache): {loads}")
    warm_before, warm_after = statistics.median(loads["compile"][1:]), statistics.median(loads["keep"][1:])
    print(
        f"warm load: compiled each start {warm_before:.2f} s, kept compiled {warm_after:.2f} s "
        f"({warm_after / warm_before:.2f}x)"
    )
    if args.calls == 0:
        return 0
    ab = child(_AB, name, str(store), str(size), str(args.calls), home=work / "home-keep")
    dyn, sta = statistics.median(ab["dynamic_ms"]), statistics.median(ab["static_ms"])
    print(
        f"UNet call at {size} px, batch 2: dynamic {dyn:.1f} ms, static {sta:.1f} ms (static/dynamic "
        f"{sta / dyn:.3f}; {args.calls} alternating calls each, medians); static vs dynamic max abs / range "
        f"{ab['max_abs_over_range']:.1e}"
    )
    print(f"RSS: {ab['rss_mb_dynamic']:.0f} MB with the dynamic compile, {ab['rss_mb_with_static']:.0f} MB with both")
    print(json.dumps({"loads": loads, **ab}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
