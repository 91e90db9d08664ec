"""Tiny diffusers pipelines and their exports, made once per test session (each export runs the real CLI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.tiny_pipelines import make_tiny_controlnet, make_tiny_pipeline

# Profiles small enough for the tiny models: latent 8 (64 image pixels) up to 16, batch up to 2.
TINY_PROFILE = ("--latent", "8,8,16", "--batch", "1,2,2")


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """family → the folder of its tiny pipeline (written on first use)."""
    root = tmp_path_factory.mktemp("tiny-pipelines")
    made: dict[str, Path] = {}

    def make(family: str) -> Path:
        if family not in made:
            made[family] = make_tiny_pipeline(family, root / family)
        return made[family]

    return make


@pytest.fixture(scope="session")
def tiny_controlnet(tiny, tmp_path_factory):
    """base family ("sd1", "sdxl") → a standalone ControlNet folder made from that tiny pipeline's UNet."""
    root = tmp_path_factory.mktemp("tiny-controlnets")
    made: dict[str, Path] = {}

    def make(base: str) -> Path:
        if base not in made:
            made[base] = make_tiny_controlnet(tiny(base), root / base)
        return made[base]

    return make


class Export:
    def __init__(self, out: Path, proc) -> None:
        self.out, self.proc = out, proc
        self.family_json = json.loads((out / "assets" / "family.json").read_text())


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """(source folder, extra CLI args) → the Export of `enginefarm export SOURCE --out … <tiny profile> <extra>`,
    run once per session; a failed export fails the test that asked for it, with the CLI's output."""
    root = tmp_path_factory.mktemp("exports")
    done: dict[tuple, Export] = {}

    def export(source: Path, *extra: str, name: str | None = None) -> Export:
        key = (str(source), extra)
        if key not in done:
            out = root / f"{name or source.name}-{len(done)}"
            proc = run_cli("export", str(source), "--out", str(out), *TINY_PROFILE, *extra, check=True)
            done[key] = Export(out, proc)
        return done[key]

    return export
