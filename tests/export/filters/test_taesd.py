"""TAESD-class decoders recognised and built from the files users download: diffusers' AutoencoderTiny folders and
madebyollin's single decoder file. The torch module the export traces equals a diffusers pipeline's decode with
that AutoencoderTiny as its VAE (scaling, shift, decode, postprocess); names tell the latent space."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.errors import ConfigError

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from enginefarm.export.filters import taesd as taesd_export  # noqa: E402
from enginefarm.export.filters.reading import read_filter_source, recognise  # noqa: E402

from ...filters.scenes import scene  # noqa: E402
from ...filters.tiny_filters import (  # noqa: E402
    taesd,
    taesd_encode_reference,
    taesd_reference,
    write_taesd_decoder_file,
)


def _decode(parts, latent: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return parts.parts["decoder"].module(torch.from_numpy(latent)).permute(0, 2, 3, 1).numpy()


def test_madebyollins_decoder_file_is_recognised_and_decodes_as_diffusers(tmp_path):
    model = taesd(narrow=False)  # the published width: 64 channels, blocks (3, 3, 3, 1)
    path = write_taesd_decoder_file(tmp_path / "taesdxl_decoder.safetensors", model)
    source = read_filter_source(path)
    assert recognise(source).kind == "preview_decoder"
    parts = taesd_export.build(source)
    latent = np.random.default_rng(0).standard_normal((1, 4, 5, 7)).astype(np.float32) * 2
    got = _decode(parts, latent)
    assert got.shape == (1, 40, 56, 3)
    assert np.abs(got - taesd_reference(model, latent)).max() < 1e-5
    assert parts.details["latent_channels"] == 4 and parts.details["upscale"] == 8
    assert parts.details["latent_scaling_factor"] == 0.13025  # "taesdxl": SDXL's latent space
    assert parts.parts["decoder"].inputs["latent"] == (1, 4, "latent_height", "latent_width")
    assert list(parts.parts) == ["decoder"]  # a decoder file: no encoder part


@pytest.mark.parametrize(
    "name, space", [("taesd_decoder.pth", 0.18215), ("taef1_decoder.safetensors", 0.3611), ("mine.safetensors", None)]
)
def test_the_latent_space_comes_from_madebyollins_names(tmp_path, name, space):
    model = taesd(latent_channels=16 if "taef1" in name else 4, narrow=False)
    path = tmp_path / name
    if name.endswith(".pth"):
        state = {f"{int(k.split('.')[1]) + 1}.{k.split('.', 2)[2]}": v for k, v in model.decoder.state_dict().items()}
        torch.save(state, path)
    else:
        write_taesd_decoder_file(path, model)
    parts = taesd_export.build(read_filter_source(path))
    assert parts.details["latent_scaling_factor"] == space
    assert parts.details["latent_channels"] == model.config.latent_channels


def test_a_folder_follows_its_configs_scaling_and_shift(tmp_path):
    """A config with SD3's scaling and shift: the graph takes the model-space latent and undoes them as diffusers'
    SD3 pipeline does before AutoencoderTiny.decode."""
    model = taesd(latent_channels=16)
    model.register_to_config(scaling_factor=1.5305, shift_factor=0.0609)
    model.save_pretrained(tmp_path / "taesd3")
    source = read_filter_source(tmp_path / "taesd3")
    assert recognise(source).kind == "preview_decoder"
    parts = taesd_export.build(source)
    latent = np.random.default_rng(1).standard_normal((2, 16, 4, 6)).astype(np.float32)
    assert np.abs(_decode(parts, latent) - taesd_reference(model, latent)).max() < 1e-5
    assert (parts.details["scaling_factor"], parts.details["shift_factor"]) == (1.5305, 0.0609)
    assert parts.details["latent_scaling_factor"] == 1.5305
    # the folder's encoder: image in [0, 1] → the latent SD3's img2img makes, (latents - shift) * scaling
    assert parts.parts["encoder"].inputs["image"] == (1, 3, "image_height", "image_width")
    images = np.stack([scene(5, 48, 40), scene(6, 48, 40)])
    with torch.no_grad():
        got = parts.parts["encoder"].module(torch.from_numpy(images.transpose(0, 3, 1, 2).copy())).numpy()
    want = taesd_encode_reference(model, images)
    assert got.shape == (2, 16, 6, 5) and np.ptp(want) > 0.1
    assert np.abs(got - want).max() < 1e-5 * np.ptp(want)


def test_a_decoder_file_of_another_layout_or_an_encoder_is_one_line(tmp_path):
    from safetensors.torch import save_file

    model = taesd(narrow=False)
    path = write_taesd_decoder_file(tmp_path / "taesd_decoder.safetensors", model)
    source = read_filter_source(path)
    cut = dict(source.state)
    del cut["3.conv.0.weight"]  # a block's convolution gone
    save_file(cut, str(tmp_path / "cut.safetensors"))
    with pytest.raises(ConfigError, match="not a TAESD decoder of the published layout"):
        taesd_export.build(read_filter_source(tmp_path / "cut.safetensors"))
    encoder = {f"{k.split('.', 1)[1]}": v.contiguous() for k, v in model.encoder.state_dict().items()}
    save_file({k.removeprefix("layers."): v for k, v in encoder.items()}, str(tmp_path / "taesd_encoder.safetensors"))
    with pytest.raises(ConfigError, match="is a TAESD encoder"):
        taesd_export.build(read_filter_source(tmp_path / "taesd_encoder.safetensors"))
    grouped = {**source.state, "3.pool.0.weight": torch.zeros(256, 64, 1, 1)}  # TAEF2's mid-block group norms
    save_file(grouped, str(tmp_path / "taef2_decoder.safetensors"))
    with pytest.raises(ConfigError, match="mid-block group norms"):
        taesd_export.build(read_filter_source(tmp_path / "taef2_decoder.safetensors"))
