"""A model's assets are read from a store or a folder a user may not control: every size read from their configs is
bounded against the family before anything is allocated from it (diffusion/assets.py), one line and a hint."""

from __future__ import annotations

import json

import pytest

from enginefarm.diffusion.assets import ModelAssets
from enginefarm.diffusion.schedulers.config import SchedulerConfig
from enginefarm.errors import ConfigError


def _assets(folder, **configs):
    """An SD 1.x assets folder whose configs are the real model's, with `configs` (folder → fields) over them."""
    real = {
        "unet": {"cross_attention_dim": 768, "in_channels": 4, "sample_size": 64, "block_out_channels": [320, 640]},
        "vae": {"sample_size": 512, "latent_channels": 4, "block_out_channels": [128, 256, 512, 512]},
        "text_encoder": {"hidden_size": 768, "vocab_size": 49408},
        "scheduler": {"num_train_timesteps": 1000},
    }
    folder.mkdir()
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    for name, fields in real.items():
        (folder / name).mkdir()
        file = "scheduler_config.json" if name == "scheduler" else "config.json"
        (folder / name / file).write_text(json.dumps({**fields, **configs.get(name, {})}))
    return folder


@pytest.mark.parametrize(
    ("configs", "says"),
    [
        ({"unet": {"sample_size": 10000}}, "unet/config.json: sample_size 10000"),
        ({"unet": {"sample_size": "64"}}, "unet/config.json: sample_size '64'"),
        ({"text_encoder": {"hidden_size": 1e9}}, "text_encoder/config.json: hidden_size 1000000000.0"),
        ({"scheduler": {"num_train_timesteps": 3e9}}, "scheduler/scheduler_config.json: num_train_timesteps"),
        ({"vae": {"block_out_channels": [128] * 40}}, "vae/config.json: block_out_channels"),
        ({"vae": {"block_out_channels": [128, -4]}}, "vae/config.json: block_out_channels"),
        ({"vae": {"latent_channels": 1 << 30}}, "vae/config.json: latent_channels"),
        ({"vae": {"sample_size": 1 << 20}}, "vae/config.json: sample_size"),
    ],
    ids=["sample size", "a string", "hidden size", "timesteps", "40 levels", "negative", "latent channels", "tile"],
)
def test_a_size_past_what_the_family_holds_is_refused_when_the_assets_are_read(tmp_path, configs, says):
    with pytest.raises(ConfigError) as refused:
        ModelAssets.from_folder(_assets(tmp_path / "assets", **configs))
    assert says in str(refused.value) and "\n" not in str(refused.value) and refused.value.hint


def test_the_real_sizes_and_a_family_json_are_read(tmp_path):
    assets = ModelAssets.from_folder(_assets(tmp_path / "assets"))
    assert assets.native_pixels == 512 and assets.text_widths == {"text_encoder": 768}
    (tmp_path / "assets" / "family.json").write_text(
        json.dumps({"family": "sd1", "sizes": {"text_widths": [10**12], "cross_attention_dim": 768}})
    )
    with pytest.raises(ConfigError, match="family.json: sizes.text_widths"):
        ModelAssets.from_folder(tmp_path / "assets")


def test_a_scheduler_config_given_directly_is_bounded_too():
    with pytest.raises(ConfigError, match="num_train_timesteps 3000000000 is not in 1-100000"):
        SchedulerConfig.parse({"num_train_timesteps": 3e9})
    assert SchedulerConfig.parse({"num_train_timesteps": 1000}).num_train_timesteps == 1000


def test_a_gc_while_a_pipeline_loads_leaves_its_assets_and_says_so_if_they_went(tmp_path, monkeypatch):
    """`enginefarm cache gc --quota 1` (another process) between the assets' fetch and the tokenizers' read evicted
    them: the load then said "the tokenizer folder is missing… re-export". The fetched assets are held as in use
    until this process ends; assets gone all the same are said to be evicted, with a hint to retry."""
    from enginefarm.cache.device_cache import DeviceCache
    from enginefarm.diffusion.loading import fetch_assets
    from enginefarm.runner.request import Request
    from tests.conftest import run_cli
    from tests.runner.test_lifecycle import _chain

    (tmp_path / "src").mkdir()
    assets = _assets(tmp_path / "src" / "assets")
    (assets / "tokenizer").mkdir()
    (assets / "tokenizer" / "vocab.json").write_text("{}")
    _chain(tmp_path / "src" / "net.onnx", 8, 1)
    (tmp_path / "src" / "recipe.toml").write_text(
        '[model]\nname = "held"\nversion = "1"\nassets = "assets"\n\n[defaults]\nprecisions = ["fp32"]\n'
        'targets = ["onnxruntime:cpu"]\n\n[components.net]\nsource = "net.onnx"\n\n'
        "[components.net.profiles.default]\nbatch = [1, 1, 2]\n"
    )
    store, home = tmp_path / "store", tmp_path / "home"
    run_cli("build", str(tmp_path / "src" / "recipe.toml"), "--store", str(store), "--component", "assets", check=True)
    monkeypatch.setenv("ENGINEFARM_HOME", str(home))
    folder = fetch_assets(Request("held", device="cpu", store=str(store)), None)
    run_cli("cache", "gc", "--quota", "1", env={"ENGINEFARM_HOME": str(home)}, check=True)  # another process
    found = ModelAssets.from_folder(folder)
    assert found.tokenizer_folder("text_encoder").is_dir()  # held: still there

    for lease in folder.glob(".in-use.*"):  # as if the load had not held them (or a gc raced the hold)
        lease.unlink()
    DeviceCache(home).gc(1)
    with pytest.raises(ConfigError, match="evicted .* while in use") as gone:
        found.tokenizer_folder("text_encoder")
    assert "run it again" in gone.value.hint


def test_a_whole_model_file_without_a_unet_part_says_the_stored_unet_runs(tmp_path):
    """weights= a whole-model checkpoint whose UNet part is missing: its text encoder and VAE load over the stored
    ones, and the stored UNet runs; `pipe.notes` (from the loader) says so, instead of nothing."""
    import numpy as np
    from safetensors.numpy import save_file

    from enginefarm.diffusion.loading import ComponentLoader

    path = tmp_path / "no-unet.safetensors"
    save_file(
        {
            "cond_stage_model.transformer.text_model.embeddings.token_embedding.weight": np.zeros((9, 768), "f4"),
            "first_stage_model.decoder.conv_in.weight": np.zeros((4, 4, 3, 3), np.float32),
            "first_stage_model.encoder.conv_in.weight": np.zeros((4, 3, 3, 3), np.float32),
        },
        str(path),
    )
    found = ModelAssets.from_folder(_assets(tmp_path / "assets"))
    from enginefarm.runner.request import Request

    loader = ComponentLoader(Request("m", device="cpu"), found, False)
    loader.route_weights(path, None)
    assert sorted(loader.files) == ["text_encoder", "vae_decoder", "vae_encoder"]
    assert loader.notes == [f"weights={path}: it holds no unet part; the model's own unet runs"]
    whole = ComponentLoader(Request("m", device="cpu"), found, False)
    whole.route_weights(None, None)
    assert whole.notes == []
