"""A user's filter file read without running its code, unwrapped, and recognised as spandrel recognises it: each
upscaler layout's torch module equals spandrel's on the same file; a pickle that needs code, an unknown file and a
Stable Diffusion checkpoint are each one line."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from enginefarm.errors import ConfigError
from enginefarm.export.filters.esrgan import ARCHITECTURES
from enginefarm.export.filters.reading import NEEDS_CODE, read_filter_source, recognise
from tests.conftest import run_cli

from .upscaler_files import old_esrgan_state, rrdb_state, save, spandrel_model, srvgg_state

RRDB, SRVGG = (a.name for a in ARCHITECTURES)

# file name → (how it is made, its nesting, the architecture, scale, what each side must be a multiple of)
LAYOUTS = {
    "RealESRGAN_x4plus.pth": (lambda: rrdb_state(), "params_ema", RRDB, 4, 1),
    "RealESRGAN_x2plus.pth": (lambda: rrdb_state(unshuffle=2, seed=1), "params_ema", RRDB, 2, 2),
    "x1-unshuffle4.pth": (lambda: rrdb_state(unshuffle=4, seed=2), "params", RRDB, 1, 4),
    "RealESRGAN_x4plus_anime_6B.safetensors": (lambda: rrdb_state(blocks=6, seed=3), None, RRDB, 4, 1),
    # community files are often saved in half precision
    "4x-UltraSharp.pth": (
        lambda: {k: v.half() for k, v in old_esrgan_state(blocks=3, seed=4).items()},
        None,
        RRDB,
        4,
        1,
    ),
    "realesr-animevideov3.pth": (lambda: srvgg_state(convs=4, scale=4, seed=5), "params", SRVGG, 4, 1),
    "realesr-general-x2.pth": (lambda: srvgg_state(convs=6, scale=2, seed=6), "params", SRVGG, 2, 1),
}


@pytest.mark.parametrize("file_name", LAYOUTS)
def test_each_upscaler_layout_is_recognised_and_built_as_spandrel_builds_it(tmp_path, file_name):
    import torch

    make, nesting, architecture, scale, multiple = LAYOUTS[file_name]
    path = save(make(), tmp_path / file_name, nesting)
    source = read_filter_source(path)
    found = recognise(source)
    assert found.name == architecture
    parts = found.build(source)
    assert (parts.kind, parts.details["scale"], parts.details["multiple"]) == ("upscaler", scale, multiple)
    part = parts.parts["upscaler"]
    assert all(n % multiple == 0 for side in ("height", "width") for n in part.profile[side])
    image = torch.rand(1, 3, 24, 28, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = spandrel_model(path)(image).numpy()
        have = part.module(image).numpy()
    assert have.shape == (1, 3, 24 * scale, 28 * scale) == want.shape
    assert np.ptp(want) > 0.1  # the weights do something the comparison can see
    assert np.abs(have - want).max() <= 1e-5


def test_wrapper_prefixes_and_state_dict_nesting_are_unwrapped(tmp_path):
    import torch

    state = rrdb_state()
    path = tmp_path / "wrapped.pth"
    torch.save({"state_dict": {f"module.{k}": v for k, v in state.items()}, "epoch": 7}, path)
    source = read_filter_source(path)
    assert set(source.state) == set(state)
    assert recognise(source).name == RRDB


def test_params_ema_is_preferred_over_params(tmp_path):
    import torch

    path = tmp_path / "both.pth"
    torch.save({"params": srvgg_state(seed=1), "params_ema": srvgg_state(seed=2)}, path)
    read = read_filter_source(path).state
    assert torch.equal(read["body.0.weight"], srvgg_state(seed=2)["body.0.weight"])


def test_a_model_folder_gives_its_weights_and_config(tmp_path):
    save(srvgg_state(), tmp_path / "folder" / "model.safetensors")
    (tmp_path / "folder" / "config.json").write_text(json.dumps({"architectures": ["Something"]}))
    source = read_filter_source(tmp_path / "folder")
    assert source.config == {"architectures": ["Something"]} and "body.0.weight" in source.state


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("zipped", [True, False], ids=["torch.save", "plain pickle"])
def test_a_pickle_that_needs_code_is_refused_without_running_it(tmp_path, zipped):
    import torch

    marker = tmp_path / "ran"
    path = tmp_path / "evil.pth"
    payload = {"params_ema": srvgg_state(), "extra": _RunsCode(marker)}
    if zipped:
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps(payload))
    with pytest.raises(ConfigError) as caught:
        read_filter_source(path)
    assert NEEDS_CODE in caught.value.message and "\n" not in caught.value.message
    assert not marker.exists()


@pytest.mark.slow  # the CLI in a subprocess
def test_the_command_refuses_such_a_file_in_one_line(tmp_path):
    import torch

    marker = tmp_path / "ran"
    torch.save({"params": srvgg_state(), "x": _RunsCode(marker)}, tmp_path / "evil.pth")
    proc = run_cli("export", str(tmp_path / "evil.pth"), "--out", str(tmp_path / "out"))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert NEEDS_CODE in proc.stderr and "posix.system" in proc.stderr
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_files_that_are_not_filters_say_what_they_look_like(tmp_path):
    import torch

    torch.save({"foo.weight": torch.zeros(2), "bar.bias": torch.zeros(2)}, tmp_path / "unknown.pth")
    torch.save({"state_dict": {"model.diffusion_model.out.0.weight": torch.zeros(2)}}, tmp_path / "sd.ckpt")
    save({"lora_unet_down_blocks_0.lora_up.weight": torch.zeros(2, 2)}, tmp_path / "lora.safetensors", None)
    expected = {
        "unknown.pth": "not a filter enginefarm knows (keys like bar.bias, foo.weight)",
        "sd.ckpt": "a Stable Diffusion checkpoint",
        "lora.safetensors": "a LoRA",
    }
    for name, words in expected.items():
        with pytest.raises(ConfigError) as caught:
            recognise(read_filter_source(tmp_path / name))
        assert words in caught.value.message and RRDB in caught.value.hint


def test_a_file_that_is_not_weights_is_one_line(tmp_path):
    (tmp_path / "broken.pth").write_bytes(b"PK\x03\x04 not really a zip")
    (tmp_path / "notes.txt").write_text("hello")
    for name in ("broken.pth", "notes.txt"):
        with pytest.raises(ConfigError):
            read_filter_source(tmp_path / name)
