"""`make demo` prints what a local user needs, in a terminal's width: its artifact table fits 120 columns without
wrapping a cell, and the plan it shows has no CI runner column (that column is for a farm's `--runners`)."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _demo():
    spec = importlib.util.spec_from_file_location("demo", ROOT / "ci" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_demos_table_fits_120_columns_one_line_per_artifact():
    from rich.console import Console

    demo = _demo()
    widest = {  # the widest values each column takes: a long target, an 8-decimal cosine, a slow first run
        "artifact": "0b2a07d94988",
        "target": "onnxruntime:cpu",
        "precision": "bf16",
        "computes in": "bf16",
        "min cosine": "0.99999994",
        "PSNR dB": "141.2",
        "p50 ms": "1234.567",
        "TTFI ms": "123456",
        "output std": "0.123",
    }
    console = Console(width=demo.WIDTH, record=True, file=io.StringIO())
    console.print(demo.artifact_table([widest] * 5, "each output [1, 3, 32, 32]; p50 measured at build"))
    lines = console.export_text().splitlines()
    assert demo.WIDTH == 120 and max(map(len, lines)) <= 120
    rows = [line for line in lines if "0b2a07d94988" in line]
    assert len(rows) == 5 and all(value in row for row in rows for value in widest.values())  # none wrapped or cut
    assert not any("runs on" in line or "ubuntu" in line for line in lines)


def test_plan_shows_the_runner_column_only_for_a_farms_runners(cli, tiny_recipe):
    recipe = tiny_recipe()
    local = cli("plan", str(recipe), check=True).stdout
    assert "runs on" not in local and "ubuntu-latest" not in local and "to build" in local
    assert max(map(len, local.splitlines())) <= 120
    farm = cli("plan", str(recipe), "--runners", str(ROOT / "ci" / "runners.toml"), check=True).stdout
    assert "runs on" in farm


def test_the_demos_install_shows_pips_progress():
    """A fresh `make demo` spends most of its first minutes in pip: its install is not run quiet (`make -n -B` prints
    the commands a fresh checkout would run, running none)."""
    import subprocess

    proc = subprocess.run(
        ["make", "-n", "-B", ".venv/.demo-deps"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    (install,) = [line for line in proc.stdout.splitlines() if " pip " in line and " install " in line]
    assert " -q" not in install and "--progress-bar on" in install and "-c enginefarm/constraints.txt" in install
    assert "installing enginefarm into .venv" in proc.stdout  # a line says what the wait is for
    # pip parses the line as written (an install option before `install` is "no such option"); --help runs nothing
    import shlex
    import sys

    words = shlex.split(install)
    parsed = subprocess.run(
        [sys.executable, *words[1:], "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert parsed.returncode == 0, parsed.stderr
