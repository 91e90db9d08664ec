"""Shared by the bench scripts: options, store/cache setup, building missing artifacts, seeded inputs."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MAKE_VAE = "pip install torch==2.13.0 diffusers && python recipes/make_sd_vae_decoder.py"


def parser(doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument(
        "--store",
        type=Path,
        default=ROOT / ".enginefarm" / "bench-store",
        help="store dir (built into if it lacks artifacts)",
    )
    p.add_argument(
        "--home", type=Path, default=ROOT / ".enginefarm" / "bench-home", help="device cache dir (ENGINEFARM_HOME)"
    )
    p.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "sd_vae_decoder.toml")
    p.add_argument("--ref", default="sd15/vae_decoder", help="MODEL/COMPONENT")
    p.add_argument("--no-build", action="store_true", help="measure what the store has; build nothing")
    return p


def setup(args: argparse.Namespace) -> None:
    """Absolute paths, exported as ENGINEFARM_HOME / ENGINEFARM_STORE for this process and its children."""
    args.store, args.home, args.recipe = args.store.resolve(), args.home.resolve(), args.recipe.resolve()
    os.environ["ENGINEFARM_HOME"] = str(args.home)
    os.environ["ENGINEFARM_STORE"] = str(args.store)
    os.environ.pop("ENGINEFARM_OFFLINE", None)
    args.store.mkdir(parents=True, exist_ok=True)  # a named store must exist for every command but build


def source_onnx(recipe: Path, component: str) -> Path:
    """The component's ONNX file; exits 2 with how to make it if it is missing."""
    try:
        spec = tomllib.loads(recipe.read_text())["components"][component]["source"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as exc:
        sys.exit(f"error: {recipe}: no [components.{component}] source ({type(exc).__name__}: {exc})")
    path = (recipe.parent / spec.removeprefix("file://")).resolve()
    if not path.is_file():
        how = MAKE_VAE if recipe.name == "sd_vae_decoder.toml" else f"see the comments at the top of {recipe}"
        print(f"error: {path} is missing. Make it: {how}", file=sys.stderr)
        sys.exit(2)
    return path


def cli(*args: str, capture: bool = False, check: bool = True) -> str:
    cmd = [sys.executable, "-m", "enginefarm.cli", *args]
    proc = subprocess.run(cmd, cwd=ROOT, text=True, stdout=subprocess.PIPE if capture else None)
    if proc.returncode != 0 and check:
        sys.exit(f"error: `{' '.join(cmd[1:])}` exited {proc.returncode}")
    return proc.stdout or ""


def ensure_built(args: argparse.Namespace, *select: str) -> None:
    """Build (through the CLI) whatever jobs of the recipe's component the store lacks. `select`: extra CLI filters."""
    component = args.ref.partition("/")[2]
    source_onnx(args.recipe, component)
    common = [str(args.recipe), "--store", str(args.store), "--component", component, *select]
    planned = json.loads(cli("plan", *common, "--format", "json", capture=True))
    todo = [p for p in planned if p["status"] == "to build"]
    if not todo or args.no_build:
        return
    print(
        f"building {len(todo)} artifact(s) of {args.ref} into {args.store} (takes minutes on a small CPU):", flush=True
    )
    started = time.perf_counter()
    cli("build", *common, check=False)  # a failed job is reported by the CLI; measure what did build
    print(f"build step took {time.perf_counter() - started:.0f} s\n", flush=True)


def opt_feeds(manifest, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded normal inputs at the profile's opt shape, in each input's dtype."""
    rng = np.random.default_rng(seed)
    return {
        t["name"]: rng.standard_normal(manifest.profile[t["name"]]["opt"]).astype(t["dtype"])
        for t in manifest.io["inputs"]
    }
