"""Tiled VAE (`Pipeline.enable_vae_tiling`, enginefarm.diffusion.tiles) against diffusers' `enable_tiling()`: the same
grid, overlap and blend, on the tiny SD 1.x VAE built by the real CLI and run through `enginefarm.load`."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import run_cli

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

TILE_PIXELS, LATENT_TILE = 64, 8


@pytest.fixture(scope="module")
def small_tile_vae(tiny, exported, tmp_path_factory):
    """The tiny SD 1.x VAE built with a profile down to 4 latent pixels (its UNet's multiple), so every tile of
    diffusers' grid (the last ones are 4) runs as diffusers runs it. Built from the session's sd1 export (linked, not
    exported again) with the recipe `export --name tiles --latent 4,8,16 --batch 1,1,1` writes: the ONNX files take
    any size, only the recipe's profiles differ."""
    import os
    import shutil
    import tomllib

    from enginefarm.export import recipe as recipes
    from enginefarm.export.source import read_source

    root = tmp_path_factory.mktemp("vae-tiling")
    source = tiny("sd1")
    folder = shutil.copytree(exported(source).out, root / "export", copy_function=os.link)
    components = tomllib.loads((folder / "recipe.toml").read_text())["components"]
    checkpoints = {name: table.get("checkpoint") for name, table in components.items()}
    text = recipes.recipe_text(read_source(source), "tiles", checkpoints, batch=(1, 1, 1), latent=(4, 8, 16))
    (folder / "recipe.toml").unlink()  # a link to the shared export's: replaced, never written through
    (folder / "recipe.toml").write_text(text)
    run_cli(
        "build",
        str(folder / "recipe.toml"),
        "--store",
        str(root / "store"),
        "--no-bench",
        "--target",
        "onnxruntime:cpu",
        "--precision",
        "fp32",
        "--component",
        "vae_decoder",
        "--component",
        "vae_encoder",
        check=True,
    )
    return source, root / "store"


def _their_vae(source):
    vae = diffusers.AutoencoderKL.from_pretrained(source / "vae")
    vae.enable_tiling()
    vae.tile_sample_min_size, vae.tile_latent_min_size = TILE_PIXELS, LATENT_TILE
    return vae


def test_tiled_decode_and_encode_match_diffusers(small_tile_vae):
    import enginefarm
    from enginefarm.diffusion import tiles

    source, store = small_tile_vae
    vae = _their_vae(source)
    tiling = tiles.Tiling(TILE_PIXELS, LATENT_TILE)
    latent = np.random.default_rng(0).standard_normal((1, 4, 16, 16)).astype(np.float32)
    image = np.random.default_rng(1).uniform(-1, 1, (1, 3, 128, 128)).astype(np.float32)
    with (
        enginefarm.load("tiles/vae_decoder", store=str(store), device="cpu") as decoder,
        enginefarm.load("tiles/vae_encoder", store=str(store), device="cpu") as encoder,
    ):
        decoded = tiles.decode(lambda x: decoder.run({"latent_sample": x})["sample"], latent, tiling)
        whole = decoder.run({"latent_sample": latent})["sample"]
        moments = tiles.encode(lambda x: encoder.run({"sample": x})["latent_parameters"], image, tiling)
    with torch.no_grad():
        their_image = vae.decode(torch.from_numpy(latent)).sample.numpy()
        their_moments = vae.encode(torch.from_numpy(image)).latent_dist.parameters.numpy()
    assert decoded.shape == their_image.shape == (1, 3, 128, 128)
    assert np.abs(decoded - their_image).max() < 1e-3
    assert np.abs(decoded - whole).max() > 1e-2  # tiling changed the image: the comparison above saw the tiled path
    assert moments.shape == their_moments.shape and np.abs(moments - their_moments).max() < 1e-3


def test_the_pipeline_decodes_in_tiles_even_where_the_last_tile_is_below_the_profile(built):
    """The standard tiny build's decoder takes 8 latent pixels at least; the grid's last tile is 4: it is decoded
    from a tile of 8 reaching back and cropped. The image equals the same grid run through diffusers' own decoder."""
    from enginefarm.diffusion import Pipeline, tiles

    source, out, store = built("sd1")
    import tomllib

    name = tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]
    vae = diffusers.AutoencoderKL.from_pretrained(source / "vae")
    with Pipeline.load(
        name, store=str(store), precision="fp32", target="onnxruntime:cpu", device="cpu", assets=out / "assets"
    ) as pipe:
        pipe.enable_vae_tiling(tile_pixels=TILE_PIXELS)
        latent = np.random.default_rng(2).standard_normal((1, 4, 16, 16)).astype(np.float32)
        ours = pipe._vae("vae_decoder", "latent_sample", "sample", latent)

    def torch_decoder(x):
        with torch.no_grad():
            return vae.decode(torch.from_numpy(x)).sample.numpy()

    theirs = tiles.decode(torch_decoder, latent, tiles.Tiling(TILE_PIXELS, LATENT_TILE), min_tile=8)
    assert ours.shape == (1, 3, 128, 128) and np.abs(ours - theirs).max() < 1e-3


def test_tile_settings_are_checked():
    from enginefarm.diffusion.tiles import Tiling
    from enginefarm.errors import ConfigError

    with pytest.raises(ConfigError, match="multiple of 8"):
        Tiling.from_vae({}, 8, 100, 0.25)
    with pytest.raises(ConfigError, match="overlap"):
        Tiling.from_vae({}, 8, 64, 1.0)
    assert Tiling.from_vae({"sample_size": [512, 512]}, 8, None, 0.25) == Tiling(512, 64)
