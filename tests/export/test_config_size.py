"""A source folder's configs are checked before torch builds anything from them (export/config_size.py and
families/config_bounds.py): sizes past the family's, configs torch cannot build, classes that are not model classes,
and models whose configs build more than the memory (counted from the config, not only from the weight files)."""

from __future__ import annotations

import json
import shutil

import pytest

from enginefarm.errors import ConfigError
from tests.conftest import run_cli
from tests.export.test_errors import _one_line_error


def _source(tmp_path, tiny, folder: str, file: str = "config.json", **changes):
    """A copy of the tiny SD 1.x pipeline with `changes` over `folder/file` (None: the key removed)."""
    source = tmp_path / "source"
    shutil.copytree(tiny("sd1"), source)
    path = source / folder / file if folder else source / file
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    path.write_text(json.dumps(data))
    return source


@pytest.mark.parametrize(
    ("folder", "changes", "says"),
    [
        ("unet", {"block_out_channels": [32, -4, 64]}, "unet/config.json: block_out_channels -4"),
        ("unet", {"block_out_channels": "wide"}, "unet/config.json: block_out_channels 'wide'"),
        ("unet", {"block_out_channels": [24576, 24576, 24576]}, "block_out_channels 24576"),
        ("text_encoder", {"hidden_size": None}, "lacks 'hidden_size'"),
        ("text_encoder", {"hidden_size": 1e9}, "text_encoder/config.json: hidden_size"),
        ("text_encoder", {"num_hidden_layers": 10**9}, "text_encoder/config.json: num_hidden_layers"),
    ],
    ids=["negative width", "a string", "huge width", "no hidden_size", "huge hidden_size", "a billion layers"],
)
def test_a_config_past_the_family_or_lacking_a_size_is_one_line_before_torch(tmp_path, tiny, folder, changes, says):
    source = _source(tmp_path, tiny, folder, **changes)
    err = _one_line_error(run_cli("export", str(source), "--out", str(tmp_path / "out")))
    assert says in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("named", ["Trainer", "__class__", "pipeline", 5])
def test_a_class_that_is_not_a_model_class_is_refused_before_anything_is_built(tmp_path, tiny, named):
    from enginefarm.export import export_model

    source = _source(tmp_path, tiny, "", "model_index.json", text_encoder=["transformers", named])
    with pytest.raises(ConfigError, match=f"model_index.json: text_encoder's class {named!r} is not a transformers"):
        export_model(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_export_is_sized_from_its_config_not_only_its_files(tmp_path, tiny):
    """The UNet's files hold the tiny model's weights (a few MB); its config builds 8192-wide levels. diffusers
    builds the config's model before it loads the files, so the export is sized from the config."""
    from enginefarm.export import export_model
    from enginefarm.export.config_size import config_fp32_bytes
    from enginefarm.export.memory import export_need, folder_fp32_bytes
    from enginefarm.export.source import read_source

    source = _source(tmp_path, tiny, "unet", block_out_channels=[4096, 8192, 8192])
    found = read_source(source)
    assert export_need(found)[0] < 4e9  # the files alone (and the base) pass the 16 GB below: "3.24 GB"
    built = config_fp32_bytes(found, "unet")
    assert built > 20e9  # 3x3 convolutions 8192 channels wide
    with pytest.raises(ConfigError, match=r"exporting unet needs about .* its config.json builds at fp32") as refused:
        export_model(source, tmp_path / "out", memory=16 << 30)
    assert refused.value.hint and not (tmp_path / "out").exists()
    real = read_source(tiny("sd1"))  # a config saved with its weights builds exactly them
    for folder in ("text_encoder", "unet", "vae"):
        assert config_fp32_bytes(real, folder) == folder_fp32_bytes(real.folder(folder))
