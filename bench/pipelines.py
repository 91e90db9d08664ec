"""enginefarm (OpenVINO fp32) vs OpenVINO GenAI's Text2ImagePipeline vs diffusers on torch (CPU), the same weights,
per stage: text encode, denoising step, VAE decode, warm load, process start to first image, peak RSS.

The model: SD 1.5's pipeline (builder/catalog_configs.py's published configs: CLIP ViT-L, the real VAE) with its
UNet narrowed to block widths 128/256/512/512, Euler, seeded random weights; 512 px, 4 steps, guidance 7.5, fp32.
--quick: a smoke run of the machinery (UNet 32/64/64/64, VAE 32/64/64/64, a 2-layer CLIP, 128 px, 2 steps, 1 round).

Every run is a fresh process (its own venv's Python: GenAI and optimum-intel in --genai-python's, the others in
this one), which loads the pipeline (timed from before its runtime's imports: the warm load; the round-0 runs warm
the OS file cache and enginefarm's local cache and are printed, not counted), makes --images images and reports
each stage's seconds, its peak RSS and when its first image came back (from the parent's Popen: process start to
first image). The runtimes take turns, --rounds times, so a busy moment of the machine hits all. Printed: every
run's numbers as it ends, then medians per runtime and the ratios enginefarm / other as min / median / max over the
rounds' adjacent pairs.
A benchmark, not a test: it never fails on numbers. It does fail when the runtimes would not compute the same
thing: the text encoder as each venv's transformers reads it from the folder and as optimum-intel exported it must
agree (a folder saved by transformers >= 5.6 loads in optimum-intel's pinned older one with a freshly initialised
CLIP text encoder, silently), and enginefarm's image must match diffusers' from the same starting noise.

    python3 -m venv /work/venvs/genai && /work/venvs/genai/bin/pip install openvino-genai "optimum-intel[openvino]"
    .venv/bin/python bench/pipelines.py [--quick] [--rounds 3] [--images 2] [--work DIR] [--genai-python PY]
                                        [--fresh-store] [--runtimes enginefarm,genai,genai-static,diffusers]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CHILD = Path(__file__).with_name("pipelines_child.py")
RUNTIMES = ("enginefarm", "genai", "genai-static", "diffusers")
STAGES = ("text", "step", "first step", "decode", "load", "start to image", "peak RSS")
# CPU seconds of this process (all threads), which a busy machine changes less than wall time: a later step, text
# and the first step (one span: the call's start to its first step's end), the last step's end to the image
CPU_STAGES = ("step CPU", "text+step 1 CPU", "decode CPU")
NAME = "sd15narrow"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a smoke run: a small model, 128 px, 2 steps, 1 round")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds after the warm-up round (default 3)")
    p.add_argument("--images", type=int, default=2, help="images per run (default 2)")
    p.add_argument("--steps", type=int, default=None, help="default 4 (--quick 2)")
    p.add_argument("--size", type=int, default=None, help="image side in pixels (default 512, --quick 128)")
    p.add_argument("--work", type=Path, default=None, help="folder for the model, exports and store (kept, reused)")
    p.add_argument(
        "--genai-python",
        default=os.environ.get("GENAI_PYTHON", "/work/venvs/genai/bin/python"),
        help="the Python of a venv with openvino-genai and optimum-intel[openvino] (env GENAI_PYTHON)",
    )
    p.add_argument("--runtimes", default="enginefarm,genai,diffusers", help=f"comma-separated, of {RUNTIMES}")
    p.add_argument(
        "--fresh-store",
        action="store_true",
        help="empty --work's enginefarm store and home before building (after a change to what builds write)",
    )
    args = p.parse_args(argv)
    args.runtimes = [r for r in args.runtimes.split(",") if r]
    unknown = [r for r in args.runtimes if r not in RUNTIMES]
    if unknown or "enginefarm" not in args.runtimes:
        p.error(f"--runtimes: {unknown or 'enginefarm is the one compared'}; of {', '.join(RUNTIMES)}")
    args.rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    args.steps = args.steps or (2 if args.quick else 4)
    args.size = args.size or (128 if args.quick else 512)
    if args.size % 64:
        p.error(f"--size {args.size}: use a multiple of 64")
    if args.rounds < 1 or args.images < 1:
        p.error("--rounds and --images: 1 or more")
    args.work = (
        args.work or ROOT / ".enginefarm" / ("bench-pipelines-quick" if args.quick else "bench-pipelines")
    ).resolve()
    return args


def child(python: str, role: str, **arguments) -> dict:
    proc = subprocess.run([python, str(CHILD), role, json.dumps(arguments)], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"error: {role} ({python}) exited {proc.returncode}:\n{proc.stderr.strip()[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(*cmd: str, env: dict | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if proc.returncode != 0:
        sys.exit(f"error: `{' '.join(cmd)}` exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")


def write_configs(folder: Path, quick: bool) -> None:
    """SD 1.5's published configs, its UNet narrowed, Euler (SDXL's published Euler config) for PNDM."""
    from enginefarm.builder.catalog_configs import CONFIGS, write_configs

    write_configs("sd-1.5", folder)
    edit = {
        "unet/config.json": {"block_out_channels": [32, 64, 64, 64] if quick else [128, 256, 512, 512]},
        # the hand-written tokenizer's <|startoftext|>, <|endoftext|> (tests/tiny_pipelines.py), not CLIP's
        "text_encoder/config.json": {"bos_token_id": 512, "eos_token_id": 513, "pad_token_id": 513},
        "scheduler/scheduler_config.json": CONFIGS["sdxl-base-1.0"]["scheduler/scheduler_config.json"],
        "model_index.json": {"scheduler": ["diffusers", "EulerDiscreteScheduler"]},
    }
    if quick:
        edit["vae/config.json"] = {"block_out_channels": [32, 64, 64, 64]}
        edit["text_encoder/config.json"].update(num_hidden_layers=2)
    for relative, changes in edit.items():
        path = folder / relative
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}, indent=2, sort_keys=True) + "\n")


def prepare(args: argparse.Namespace) -> dict[str, Path]:
    """The model folder (made by the GenAI venv's older transformers, which the newer read back), enginefarm's
    export and store, and optimum-intel's export for GenAI; each made once per --work folder."""
    work = args.work
    paths = {
        "source": work / "source",
        "export": work / "enginefarm-export",
        "store": work / "enginefarm-store",
        "genai": work / "genai",
        "home": work / "enginefarm-home",
    }
    source = paths["source"]
    if not (source / "unet" / "diffusion_pytorch_model.safetensors").is_file():
        print(f"making the model in {source} (configs: builder/catalog_configs.py's sd-1.5)", flush=True)
        write_configs(source, args.quick)
        made = child(args.genai_python, "make", folder=str(source), seed=0)
        print(f"  weights written by transformers {made['transformers']}", flush=True)
    exported = [paths["genai"] / part / "openvino_model.xml" for part in ("text_encoder", "unet", "vae_decoder")]
    if not all(path.is_file() for path in exported):  # optimum writes model_index.json first
        print("exporting for GenAI (optimum-cli export openvino, fp32)", flush=True)
        optimum = str(Path(args.genai_python).with_name("optimum-cli"))
        run(
            optimum,
            "export",
            "openvino",
            "--model",
            str(source),
            "--task",
            "text-to-image",
            "--weight-format",
            "fp32",
            str(paths["genai"]),
        )
    check_text_encoders(args, paths)
    if not (paths["export"] / "recipe.toml").is_file():
        print("exporting for enginefarm (enginefarm export, openvino:cpu fp32)", flush=True)
        latent = args.size // 8
        run(
            sys.executable,
            "-m",
            "enginefarm.cli",
            "export",
            str(source),
            "--out",
            str(paths["export"]),
            "--name",
            NAME,
            "--targets",
            "openvino:cpu",
            "--precisions",
            "fp32",
            "--batch",
            "1,2,2",
            "--latent",
            f"{min(latent, 32)},{latent},{max(latent, 64)}",
        )
    if args.fresh_store:  # builds of an older enginefarm: unmeasured, they tie with the new ones (a cached one wins)
        for stale in (paths["store"], paths["home"]):
            shutil.rmtree(stale, ignore_errors=True)
    started = time.perf_counter()
    run(
        sys.executable,
        "-m",
        "enginefarm.cli",
        "build",
        str(paths["export"] / "recipe.toml"),
        "--store",
        str(paths["store"]),
        "--no-bench",
        *("--component", "text_encoder", "--component", "unet", "--component", "vae_decoder"),  # what txt2img loads
    )
    print(f"enginefarm build (what the store lacked): {time.perf_counter() - started:.0f} s", flush=True)
    index = json.loads((paths["store"] / "index" / f"{NAME}.json").read_text())["entries"].values()
    builds = collections.Counter(entry["component"] for entry in index)
    stale = sorted(component for component, count in builds.items() if count > 1)
    if stale:
        print(
            f"warning: the store holds builds of an older enginefarm for {', '.join(stale)}; the run may load those "
            "(--fresh-store builds into an empty store)",
            flush=True,
        )
    return paths


def check_text_encoders(args: argparse.Namespace, paths: dict[str, Path]) -> None:
    """Fails unless this venv's transformers, the GenAI venv's, and optimum-intel's IR give the same hidden states."""
    ids = [512, *range(70, 90), 513, 513, 513]
    out = str(paths["source"].parent / "text-check")
    ours = child(sys.executable, "text", folder=str(paths["source"]), ids=ids, out=out + "-main")
    ir = str(paths["genai"] / "text_encoder" / "openvino_model.xml")
    theirs = child(args.genai_python, "text", folder=str(paths["source"]), ids=ids, out=out + "-genai", ir=ir)
    reference = np.load(ours["torch"])
    scale = float(np.ptp(reference))
    for label, file in (
        (f"transformers {theirs['transformers']} (GenAI venv)", theirs["torch"]),
        ("optimum-intel's text_encoder IR", theirs["ir_file"]),
    ):
        diff = float(np.max(np.abs(np.load(file) - reference))) / scale
        if not diff < 1e-4:
            sys.exit(
                f"error: the text encoder of {label} differs from transformers {ours['transformers']}'s by "
                f"{diff:.2e} of the output range: not the same weights (a folder saved by a newer transformers "
                "loads in an older one with a freshly initialised CLIP; re-make --work's source with the older one)"
            )
    print(f"text encoders agree (transformers {ours['transformers']}, {theirs['transformers']}, optimum's IR)")


def one_run(runtime: str, args: argparse.Namespace, paths: dict[str, Path], latents: Path) -> dict:
    genai = runtime.startswith("genai")
    arguments = {
        "folder": str(paths["genai"] if genai else paths["source"]),
        "name": NAME,
        "store": str(paths["store"]),
        "assets": str(paths["export"] / "assets"),
        "latents": str(latents),
        "images": args.images,
        "steps": args.steps,
        "size": args.size,
        "image_out": str(args.work / f"image-{runtime}.npy"),
    }
    python = args.genai_python if genai else sys.executable
    env = dict(os.environ, ENGINEFARM_HOME=str(paths["home"]), ENGINEFARM_STORE=str(paths["store"]))
    started = time.time()
    proc = subprocess.run(
        [python, str(CHILD), runtime, json.dumps(arguments)], capture_output=True, text=True, cwd=ROOT, env=env
    )
    if proc.returncode != 0:
        sys.exit(f"error: {runtime} exited {proc.returncode}:\n{proc.stderr.strip()[-3000:]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    steps = [s for image in got["images"] for s in image["steps"][1:]]
    return {
        "text": statistics.median(i["text"] for i in got["images"]),
        "step": statistics.median(steps or [i["steps"][0] for i in got["images"]]),
        "first step": got["images"][0]["steps"][0],
        "decode": statistics.median(i["decode"] for i in got["images"]),
        "load": got["load_s"],
        "start to image": got["first_image_at"] - started,
        "peak RSS": got["peak_rss_mb"],
        "raw": got["images"],
        **cpu_seconds(got["images"]),
    }


def cpu_seconds(images: list[dict]) -> dict[str, float]:
    spans = [image["spans"] for image in images]
    later = [span["cpu"] for one in spans for span in one[1:-1]]
    return {
        "step CPU": statistics.median(later) if later else float("nan"),
        "text+step 1 CPU": spans[0][0]["cpu"],
        "decode CPU": statistics.median(one[-1]["cpu"] for one in spans),
    }


def span_line(got: dict) -> str:
    """Where each image's time went: text + first step, the slowest later step, decode; each with the cores it
    used on average (CPU s / wall s), its major page faults and involuntary context switches."""

    def one(span: dict) -> str:
        return (
            f"{span['wall']:.2f} s ({span['cpu']:.2f} CPU s, {span['cpu'] / max(span['wall'], 1e-9):.2f} cores, "
            f"{span['majflt']} majflt, {span['nivcsw']} preempted)"
        )

    parts = []
    for i, image in enumerate(got["raw"]):
        spans = image.get("spans") or []
        if len(spans) >= 2:
            later = max(spans[1:-1], key=lambda s: s["wall"], default=None)
            worst = f"; slowest later step {one(later)}" if later else ""
            parts.append(f"image {i}: text+step 1 {one(spans[0])}{worst}; decode {one(spans[-1])}")
    return "\n".join("        " + p for p in parts)


def fmt(stage: str, value: float) -> str:
    return f"{value:.0f} MB" if stage == "peak RSS" else f"{value:.2f} s"


ALL = STAGES + CPU_STAGES


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.pop("ENGINEFARM_OFFLINE", None)
    print(f"{time.strftime('%H:%M:%S')} load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    paths = prepare(args)
    latents = args.work / f"latents-{args.size}.npy"
    np.save(latents, np.random.default_rng(0).standard_normal((1, 4, args.size // 8, args.size // 8), np.float32))
    results: dict[str, list[dict]] = {r: [] for r in args.runtimes}
    print(f"\n{args.size} px, {args.steps} steps, {args.images} images per run; round 0 warms up (not counted)")
    print("round runtime       " + "".join(f"{s:>16}" for s in STAGES) + "   load avg")
    for r in range(args.rounds + 1):
        order = args.runtimes[r % len(args.runtimes) :] + args.runtimes[: r % len(args.runtimes)]
        for runtime in order:
            got = one_run(runtime, args, paths, latents)
            print(
                f"{r:<6}{runtime:<14}"
                + "".join(f"{fmt(s, got[s]):>16}" for s in STAGES)
                + f"   {os.getloadavg()[0]:.2f}",
                flush=True,
            )
            print(span_line(got), flush=True)
            if r:
                results[runtime].append(got)
    if "diffusers" in args.runtimes:  # an image an earlier run left may be of other steps or sizes
        check_image(args)
    report(results)
    return 0


def check_image(args: argparse.Namespace) -> None:
    """enginefarm's last image against diffusers' (the same starting noise): the project's 1e-3 of fp32."""
    files = [args.work / f"image-{r}.npy" for r in ("enginefarm", "diffusers")]
    if all(f.is_file() for f in files):
        diff = float(np.max(np.abs(np.load(files[0]) - np.load(files[1]))))
        print(f"\nenginefarm's image vs diffusers': max |difference| {diff:.2e} (pixels in [0, 1])")
        if not diff < 1e-3:
            sys.exit("error: enginefarm's image does not match diffusers' within 1e-3")


def report(results: dict[str, list[dict]]) -> None:
    print("\nmedians over the rounds")
    print(f"{'':<14}" + "".join(f"{s:>16}" for s in ALL))
    for runtime, rows in results.items():
        print(f"{runtime:<14}" + "".join(f"{fmt(s, statistics.median(x[s] for x in rows)):>16}" for s in ALL))
    ours = results["enginefarm"]
    for other, rows in results.items():
        if other == "enginefarm":
            continue
        print(f"\nenginefarm / {other}: ratio of medians, then min / median / max of the rounds' pairs")
        for stage in ALL:
            pairs = [a[stage] / b[stage] for a, b in zip(ours, rows, strict=True)]
            whole = statistics.median(a[stage] for a in ours) / statistics.median(b[stage] for b in rows)
            print(f"  {stage:<16}{whole:6.2f}   {min(pairs):.2f} / {statistics.median(pairs):.2f} / {max(pairs):.2f}")


if __name__ == "__main__":
    sys.exit(main())
