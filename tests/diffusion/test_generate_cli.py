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
    from enginefarm.diffusion.metadata import read_parameters

    stored = read_parameters(out)  # the defaults as they resolved, so other apps read the real values
    assert stored["guidance_scale"] == 7.5 and (stored["width"], stored["height"]) == image.shape[1::-1]
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
    assert record["loras"] == [[str(lora), 0.7]]
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


def test_a_batch_writes_one_png_per_image_each_made_again_alone_with_its_seed(sd1, tmp_path):
    from enginefarm.diffusion import read_png
    from enginefarm.diffusion.metadata import read_parameters

    name, store = sd1
    common = ("--store", str(store), "--steps", "2", "--scheduler", "euler_a")
    previews = tmp_path / "previews"
    run_cli("generate", name, "a red fox", *common, "--seed", "5", "--num-images", "2", "--preview-dir",
            str(previews), "--out", str(tmp_path / "fox.png"), check=True)  # fmt: skip
    first, second = read_png(tmp_path / "fox-0.png"), read_png(tmp_path / "fox-1.png")
    assert read_parameters(tmp_path / "fox-1.png")["seed"] == 6 and not np.array_equal(first, second)
    run_cli("generate", "--again", str(tmp_path / "fox-1.png"), "--store", str(store), "--out", str(tmp_path / "1.png"),
            check=True)  # fmt: skip
    assert np.array_equal(read_png(tmp_path / "1.png"), second)
    written = sorted(p.name for p in previews.iterdir())
    assert written == ["step-001-0.png", "step-001-1.png", "step-002-0.png", "step-002-1.png"]
    assert read_png(previews / "step-002-1.png").shape == second.shape


def test_mask_repaints_the_white_half_and_keeps_the_black_half(sd1, tmp_path):
    """Two prompts over the same image and mask: the kept half's latents are the image's in both (the tiny VAE is no
    autoencoder, so pixels are compared between the two, not with the source), the repainted half follows the
    prompt."""
    from enginefarm.diffusion import read_png, write_png

    name, store = sd1
    source = tmp_path / "source.png"
    run_cli("generate", name, "a red fox", "--store", str(store), "--steps", "2", "--out", str(source), check=True)
    image = read_png(source)
    mask = np.zeros_like(image)
    mask[:, : image.shape[1] // 2] = 1.0  # repaint the left half
    write_png(tmp_path / "mask.png", mask)
    painted = []
    for prompt in ("a blue bird", "a stone castle"):
        out = tmp_path / f"{len(painted)}.png"
        run_cli("generate", name, prompt, "--store", str(store), "--steps", "3", "--image", str(source), "--mask",
                str(tmp_path / "mask.png"), "--out", str(out), check=True)  # fmt: skip
        painted.append(read_png(out))
    half = image.shape[1] // 2
    differs_left = np.abs(painted[0][:, :half] - painted[1][:, :half]).mean()
    differs_right = np.abs(painted[0][:, half:] - painted[1][:, half:]).mean()
    assert differs_left > 2 * differs_right, (differs_left, differs_right)
    proc = run_cli("generate", name, "a fox", "--store", str(store), "--mask", str(tmp_path / "mask.png"))
    assert proc.returncode == 1 and "error: --mask needs the image it masks" in proc.stderr, proc.stderr


def test_ls_shows_the_sizes_each_engine_takes_in_pixels(sd1):
    import json

    from enginefarm.diffusion.sizes import pixel_range

    name, store = sd1
    rows = json.loads(run_cli("ls", "--store", str(store), "--model", name, "--json", check=True).stdout)
    unet = next(r for r in rows if r["component"] == "unet")
    from enginefarm.cache.index import read_index
    from enginefarm.cache.stores import open_store

    entry = next(e for e in read_index(open_store(str(store)), name).entries.values() if e.component == "unet")
    lo, hi = entry.profile["sample"]["min"], entry.profile["sample"]["max"]
    assert unet["sizes"] == f"{lo[3] * 8}-{hi[3] * 8} x {lo[2] * 8}-{hi[2] * 8} px, batch {lo[0]}-{hi[0]}"
    assert unet["sizes"] == str(pixel_range(entry.profile, "sample", 8))
    assert next(r for r in rows if r["component"] == "text_encoder")["sizes"] is None
    # the VAE encoder takes the image itself: its sizes are the unet's, not 8 times them
    encoder = next(r for r in rows if r["component"] == "vae_encoder")
    assert encoder["sizes"].split(" px")[0] == unet["sizes"].split(" px")[0], (encoder, unet)
    table = run_cli("ls", "--store", str(store), "--model", name, env={"COLUMNS": "400"}, check=True).stdout
    assert "sizes" in table and unet["sizes"] in table


def test_the_png_record_drops_only_the_default_prompt_syntax_not_a_prompt_that_reads_a1111():
    from enginefarm.cli_generate import _recorded

    assert _recorded("prompt", "a1111") and _recorded("negative_prompt", "a1111")
    assert not _recorded("prompt_syntax", "a1111") and _recorded("prompt_syntax", "compel")
    assert not _recorded("vae", None) and not _recorded("loras", []) and _recorded("seed", 0)
