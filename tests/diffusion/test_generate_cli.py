"""`enginefarm generate`: an image from the store alone, the time of each stage, and one-line errors for a user's
mistakes (before any work is done)."""

from __future__ import annotations

import tomllib

import pytest

from tests.conftest import run_cli

pytest.importorskip("diffusers")


@pytest.fixture(scope="module")
def sd1(built):
    _, out, store = built("sd1")
    return tomllib.loads((out / "recipe.toml").read_text())["model"]["name"], store


def test_generate_writes_the_image_and_says_what_each_stage_took(sd1, tmp_path):
    from enginefarm.diffusion import read_png

    name, store = sd1
    out = tmp_path / "fox.png"
    proc = run_cli(
        "generate",
        name,
        "a red fox",
        "--store",
        str(store),
        "--steps",
        "3",
        "--seed",
        "2",
        "--scheduler",
        "euler_a",
        "--out",
        str(out),
        check=True,
    )
    image = read_png(out)
    assert image.ndim == 3 and image.shape[2] == 3 and image.std() > 0.01
    assert (
        f"wrote {out} ({image.shape[1]}×{image.shape[0]}): load " in proc.stdout
        and "3 steps" in proc.stdout
        and "ms/step" in proc.stdout
    )
    for component in ("text_encoder", "unet", "vae_decoder"):
        assert f"  {component}: " in proc.stdout
    again = tmp_path / "again.png"
    budgeted = run_cli(
        "generate",
        name,
        "a red fox",
        "--store",
        str(store),
        "--steps",
        "3",
        "--seed",
        "2",
        "--scheduler",
        "euler_a",
        "--out",
        str(again),
        "--memory-budget",
        "1M",  # below any component: each is loaded for its stage and closed before the next
        check=True,
    )
    assert again.read_bytes() == out.read_bytes()  # the seed decides everything, ancestral noise included
    said = next(line for line in budgeted.stdout.splitlines() if line.startswith("memory budget"))
    assert said == "memory budget 0.0 GB: 3 loads", budgeted.stdout  # text encoder, UNet, VAE decoder: each once
    assert "over the budget: no budget keeps a run below its largest stage" in budgeted.stdout  # 1M is below any


@pytest.mark.parametrize(
    "args, message",
    [
        (("--scheduler", "nope"), "error: unknown scheduler 'nope'"),
        (("--width", "60"), "is not a multiple of"),
        (("--steps", "0"), "Invalid value for '--steps'"),
        (("--memory-budget", "lots"), "error: --memory-budget='lots' is not a size"),
    ],
)
def test_a_users_mistake_is_one_line(sd1, tmp_path, args, message):
    name, store = sd1
    proc = run_cli("generate", name, "a red fox", "--store", str(store), "--out", str(tmp_path / "x.png"), *args)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert message in proc.stderr, proc.stderr
    assert not (tmp_path / "x.png").exists()


def test_a_control_image_for_a_model_without_controlnet_is_refused(sd1, tmp_path):
    import numpy as np

    from enginefarm.diffusion import write_png

    name, store = sd1
    write_png(tmp_path / "edges.png", np.zeros((64, 64, 3), np.float32))
    proc = run_cli(
        "generate",
        name,
        "a red fox",
        "--store",
        str(store),
        "--control-image",
        str(tmp_path / "edges.png"),
        "--out",
        str(tmp_path / "x.png"),
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-2] == "error: Stable Diffusion 1.x has no ControlNet in this model", proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("hint: export the model with a ControlNet")
