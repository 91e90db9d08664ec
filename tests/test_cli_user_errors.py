"""Mistakes a new user makes on the command line: each gets its own one-line error and hint, never another's."""

from __future__ import annotations

import numpy as np


def test_a_bare_npy_input_asks_for_its_name(cli, tmp_path):
    np.save(tmp_path / "x.npy", np.ones((1, 8), np.float32))
    proc = cli("run", "m/c", "--input", str(tmp_path / "x.npy"))
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"error: --input {tmp_path / 'x.npy'}: give NAME=FILE.npy"), proc.stderr
    assert "hint: only .npz files carry their own names" in proc.stderr and "Traceback" not in proc.stderr


def test_a_lora_strength_typo_is_named(cli, tmp_path):
    np.savez(tmp_path / "in.npz", x=np.ones((1, 8), np.float32))
    (tmp_path / "a.safetensors").write_bytes(b"")
    proc = cli("run", "m/c", "--input", str(tmp_path / "in.npz"), "--lora", f"{tmp_path / 'a.safetensors'}:O.8")
    assert proc.returncode == 1
    assert "strength 'O.8' is not a number" in proc.stderr.splitlines()[-2], proc.stderr
    assert proc.stderr.splitlines()[-1] == "hint: --lora PATH[:STRENGTH], e.g. --lora style.safetensors:0.8"


def test_doctor_gives_each_install_hint_once(cli, tmp_path):
    shim = tmp_path / "shim" / "coremltools"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('hidden for this test', name='coremltools')\n")
    proc = cli("doctor", env={"PYTHONPATH": str(shim.parent), "COLUMNS": "400"}, check=True)
    row = next(line for line in proc.stdout.splitlines() if line.startswith("│ coreml"))
    assert "coremltools is not installed" in row and row.count("pip install 'enginefarm[coreml]'") == 1, row


def test_run_with_nothing_stored_prints_just_the_error(cli, tmp_path):
    np.savez(tmp_path / "in.npz", x=np.ones((1, 8), np.float32))
    proc = cli("run", "nope/decoder", "--input", str(tmp_path / "in.npz"))
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: no artifact of nope/decoder fits this device: no stored artifact for it\nhint: "), repr(proc.stderr)


def test_ls_of_a_mistyped_store_path_says_there_is_none(cli, tmp_path):
    proc = cli("ls", "--store", str(tmp_path / "no-such-store"))
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"error: no store at {tmp_path / 'no-such-store'}") and "Traceback" not in proc.stderr
    assert not (tmp_path / "no-such-store").exists()  # looking created nothing
