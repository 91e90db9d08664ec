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
