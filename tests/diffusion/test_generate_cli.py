"""`enginefarm generate`: an image from the store alone, the time of each stage, and one-line errors for a user's
mistakes (before any work is done)."""

from __future__ import annotations

import tomllib

import numpy as np
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


def _a_unet_lora(source, path):
    """A kohya-named LoRA on the tiny UNet's first self-attention query (whatever the tiny layout names it)."""
    import json

    import numpy as np

    from tests.models import write_safetensors
    from tests.weights.lora_reference import lora_pair

    config = json.loads((source / "unet" / "config.json").read_text())
    width = config["block_out_channels"][0]
    down_types = config["down_block_types"]
    block = next(i for i, kind in enumerate(down_types) if "CrossAttn" in kind)
    width = config["block_out_channels"][block]
    module = f"down_blocks.{block}.attentions.0.transformer_blocks.0.attn1.to_q"
    prefix = "lora_unet_" + module.replace(".", "_")
    rng = np.random.default_rng(5)
    return write_safetensors(path, lora_pair(rng, prefix, width, width, 4, scale=0.5, alpha=4.0))


def test_the_png_holds_its_parameters_and_again_makes_the_same_image(built, sd1, tmp_path):
    from PIL import Image

    from enginefarm.diffusion import read_png
    from enginefarm.diffusion.metadata import read_parameters

    name, store = sd1
    lora = _a_unet_lora(built("sd1")[0], tmp_path / "detail.safetensors")
    common = ("--store", str(store), "--steps", "2", "--scheduler", "euler")
    first = tmp_path / "first.png"
    run_cli("generate", name, "a red fox", *common, "--seed", "3", "--negative", "blurry", "--lora", f"{lora}:0.7",
            "--out", str(first), check=True)  # fmt: skip
    record = read_parameters(first)
    assert record["prompt"] == "a red fox" and record["negative_prompt"] == "blurry" and record["model"] == name
    assert record["seed"] == 3 and record["steps"] == 2 and record["scheduler"] == "euler"
    assert record["loras"] == [[str(lora), 0.7]] and set(record["engines"]) >= {"unet", "text_encoder"}
    shown = Image.open(first).text["parameters"]  # what other SD apps and model sites read
    assert shown.startswith("a red fox\nNegative prompt: blurry\nSteps: 2, Sampler: euler") and "Seed: 3" in shown
    assert "LoRAs: detail:0.7" in shown

    again = tmp_path / "again.png"
    run_cli("generate", "--again", str(first), "--store", str(store), "--out", str(again), check=True)
    assert np.array_equal(read_png(again), read_png(first))
    assert read_parameters(again) == record

    other_seed = tmp_path / "seed4.png"
    run_cli("generate", "--again", str(first), "--store", str(store), "--seed", "4", "--out", str(other_seed),
            check=True)  # fmt: skip
    assert read_parameters(other_seed)["seed"] == 4 and not np.array_equal(read_png(other_seed), read_png(first))

    no_lora = tmp_path / "plain.png"
    run_cli("generate", name, "a red fox", *common, "--seed", "3", "--negative", "blurry", "--out", str(no_lora),
            check=True)  # fmt: skip
    assert np.abs(read_png(no_lora) - read_png(first)).max() > 1 / 255  # the LoRA was applied


@pytest.mark.parametrize(
    "spec, message",
    [
        ("missing.safetensors:0.5", "error: --lora missing.safetensors:0.5: no such file"),
        ("{file}:strong", "is not a strength"),
    ],
)
def test_a_bad_lora_option_is_one_line(sd1, tmp_path, spec, message):
    name, store = sd1
    existing = tmp_path / "x.safetensors"
    existing.write_bytes(b"")
    proc = run_cli("generate", name, "a fox", "--store", str(store), "--lora", spec.format(file=existing),
                   "--out", str(tmp_path / "x.png"))  # fmt: skip
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert message in proc.stderr, proc.stderr
    assert not (tmp_path / "x.png").exists()


def test_again_needs_a_png_that_holds_parameters(sd1, tmp_path):
    import numpy as np

    from enginefarm.diffusion import write_png

    name, store = sd1
    write_png(tmp_path / "plain.png", np.zeros((8, 8, 3), np.float32))
    proc = run_cli("generate", "--again", str(tmp_path / "plain.png"), "--store", str(store))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "holds no enginefarm generation parameters" in proc.stderr, proc.stderr
