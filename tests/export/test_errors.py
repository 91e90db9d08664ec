"""User errors of `enginefarm export`: one line and a hint, no traceback, nothing written at --out."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import run_cli


def _one_line_error(proc) -> str:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[0].startswith("error: ") and all(line.startswith(("error: ", "hint: ")) for line in lines), proc.stderr
    return proc.stderr


def test_a_folder_that_is_not_a_pipeline_names_the_file_looked_for(tmp_path):
    (tmp_path / "photos").mkdir()
    out = tmp_path / "out"
    err = _one_line_error(run_cli("export", str(tmp_path / "photos"), "--out", str(out)))
    assert str(tmp_path / "photos" / "model_index.json") in err
    assert not out.exists()


def test_an_unknown_pipeline_class_is_an_unknown_family(tmp_path):
    source = tmp_path / "kandinsky"
    source.mkdir()
    (source / "model_index.json").write_text(json.dumps({"_class_name": "KandinskyV22Pipeline"}))
    out = tmp_path / "out"
    err = _one_line_error(run_cli("export", str(source), "--out", str(out)))
    assert "unknown model family" in err and "KandinskyV22Pipeline" in err and "hint: supported pipelines:" in err
    assert not out.exists() and not any(p.name.startswith(".out") for p in tmp_path.iterdir())  # no staging left either


def test_an_sd_unet_of_an_unknown_width_is_an_unknown_family(tmp_path):
    source = tmp_path / "odd"
    (source / "unet").mkdir(parents=True)
    (source / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    (source / "unet" / "config.json").write_text(json.dumps({"cross_attention_dim": 512, "in_channels": 4}))
    err = _one_line_error(run_cli("export", str(source), "--out", str(tmp_path / "out")))
    assert "cross_attention_dim 512" in err
    assert not (tmp_path / "out").exists()


def test_a_controlnet_for_another_base_is_refused(tmp_path):
    source, cn = tmp_path / "sd1", tmp_path / "cn"
    for folder in ("unet", "text_encoder", "vae"):
        (source / folder).mkdir(parents=True)
    cn.mkdir()
    (source / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    (source / "unet" / "config.json").write_text(json.dumps({"cross_attention_dim": 768, "in_channels": 4}))
    (cn / "config.json").write_text(
        json.dumps({"_class_name": "ControlNetModel", "cross_attention_dim": 2048, "addition_embed_type": "text_time"})
    )
    err = _one_line_error(run_cli("export", str(source), "--controlnet", str(cn), "--out", str(tmp_path / "out")))
    assert "Stable Diffusion XL" in err and "Stable Diffusion 1.x" in err
    assert not (tmp_path / "out").exists()


def test_a_missing_torch_names_the_export_extra(tmp_path):
    source = tmp_path / "sd1"
    (source / "unet").mkdir(parents=True)
    for folder in ("text_encoder", "vae"):
        (source / folder).mkdir()
    (source / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    (source / "unet" / "config.json").write_text(json.dumps({"cross_attention_dim": 768, "in_channels": 4}))
    (source / "text_encoder" / "config.json").write_text(json.dumps({"hidden_size": 768, "vocab_size": 49408}))
    code = (
        "import sys; sys.modules['torch'] = None; sys.argv = ['enginefarm'] + sys.argv[1:]; "
        "from enginefarm.cli import main; main()"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "export", str(source), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
    )
    err = _one_line_error(proc)
    assert "needs torch" in err and "hint: pip install 'enginefarm[export]'" in err
    assert not (tmp_path / "out").exists()


def test_a_non_empty_out_is_not_overwritten_without_asking(tmp_path):
    source = tmp_path / "x"
    source.mkdir()
    (source / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    (source / "unet").mkdir()
    (source / "unet" / "config.json").write_text(json.dumps({"cross_attention_dim": 768}))
    (source / "text_encoder").mkdir()
    (source / "vae").mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    err = _one_line_error(run_cli("export", str(source), "--out", str(out)))
    assert "--overwrite" in err and (out / "keep.txt").read_text() == "mine"


def test_a_bad_latent_range_is_a_one_line_error(tmp_path):
    err = _one_line_error(run_cli("export", str(tmp_path), "--out", str(tmp_path / "o"), "--latent", "16,8,32"))
    assert "--latent" in err


def test_an_export_that_fails_its_check_writes_nothing(tmp_path, monkeypatch):
    import pytest

    from enginefarm.errors import ExportError
    from enginefarm.export import check, export_model
    from tests.tiny_pipelines import make_tiny_pipeline

    source = make_tiny_pipeline("sdxl-refiner", tmp_path / "refiner")
    monkeypatch.setattr(check, "MAX_DEVIATION", 0.0)  # no fp32 kernel is that exact: the first component must fail
    with pytest.raises(ExportError, match="ONNX Runtime differs from torch"):
        export_model(source, tmp_path / "out", latent=(8, 8, 16))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["refiner", "store"]  # no --out, no staging folder


def test_bad_targets_precisions_and_latent_multiples_fail_before_exporting(tmp_path):
    source = tmp_path / "x"
    for folder in ("unet", "text_encoder", "vae"):
        (source / folder).mkdir(parents=True)
    (source / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    (source / "unet" / "config.json").write_text(
        json.dumps({"cross_attention_dim": 768, "block_out_channels": [320, 640, 1280, 1280]})
    )
    cases = (
        (("--targets", "openvino:tpu"), "openvino has no device class 'tpu'"),
        (("--precisions", "int3"), "int3"),
        (("--latent", "12,64,128"), "multiples of 8"),
    )
    for args, says in cases:
        err = _one_line_error(run_cli("export", str(source), "--out", str(tmp_path / "out"), *args))
        assert says in err
    assert not (tmp_path / "out").exists()


def test_a_text_length_for_a_family_without_t5_or_past_512_is_a_one_line_error(tmp_path):
    """--text-length ranges the T5 token count: refused for a UNet family (CLIP reads a fixed 77), past T5's 512, or
    not MIN,OPT,MAX, before anything is exported."""
    import pytest

    from enginefarm.errors import ConfigError
    from enginefarm.export.transformer_sizes import with_text_length
    from enginefarm.families import FAMILIES

    flux = FAMILIES["flux"]
    assert with_text_length(flux, flux.sizes, (16, 128, 512)).text_lengths == (77, 128)
    assert with_text_length(flux, flux.sizes, (16, 128, 512)).context_tokens == 128
    source = tmp_path / "x"
    for folder in ("unet", "text_encoder", "vae"):
        (source / folder).mkdir(parents=True)
    (source / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    (source / "unet" / "config.json").write_text(
        json.dumps({"cross_attention_dim": 768, "block_out_channels": [320, 640, 1280, 1280]})
    )
    for value, says in (("16,77,512", "has no T5 encoder"), ("16,64", "is not MIN,OPT,MAX")):
        assert says in _one_line_error(
            run_cli("export", str(source), "--out", str(tmp_path / "out"), "--text-length", value)
        )
    with pytest.raises(ConfigError, match="past 512 tokens") as caught:
        with_text_length(flux, flux.sizes, (16, 256, 1024))
    assert caught.value.hint
    assert not (tmp_path / "out").exists()


def test_a_model_too_big_for_the_memory_is_refused_before_anything_loads(tiny, tmp_path):
    """The export holds about twice its largest component at fp32 (export/memory.py): over --memory (default the
    machine's total) it is refused at once, saying what it needs, instead of swapping or being killed minutes in. The
    weights are counted from the safetensors headers, whatever dtype they are stored in, as torch loads them."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel

    from enginefarm.export.memory import FACTOR, export_need
    from enginefarm.export.source import read_source

    source = tiny("sd1")
    need, largest, weights = export_need(read_source(source))
    loaded = {
        folder: 4 * sum(p.numel() for p in cls.from_pretrained(source / folder).parameters())
        for folder, cls in (("unet", UNet2DConditionModel), ("text_encoder", CLIPTextModel), ("vae", AutoencoderKL))
    }
    assert weights == max(loaded.values()) == loaded[largest]
    assert need >= FACTOR * weights
    out = tmp_path / "out"
    err = _one_line_error(run_cli("export", str(source), "--out", str(out), "--memory", "1M"))
    assert f"error: exporting {largest} needs about " in err
    assert "hint: export on a machine with that much memory" in err and not out.exists()


def test_an_out_that_is_holds_or_is_inside_the_source_is_refused(tmp_path):
    """--overwrite replaces --out whole: an --out that is the source, holds it or lies inside it would delete it."""
    source = tmp_path / "models" / "sd"
    for folder in ("unet", "text_encoder", "vae"):
        (source / folder).mkdir(parents=True)
    (source / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    (source / "unet" / "config.json").write_text(json.dumps({"cross_attention_dim": 768}))
    (tmp_path / "models" / "other.txt").write_text("mine")
    for out in (source, tmp_path / "models", source / "export"):
        err = _one_line_error(run_cli("export", str(source), "--out", str(out), "--overwrite"))
        assert "error: --out" in err and "the source" in err and "hint: " in err
    assert sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "models").rglob("*")) == [
        "models/other.txt",
        "models/sd",
        "models/sd/model_index.json",
        "models/sd/text_encoder",
        "models/sd/unet",
        "models/sd/unet/config.json",
        "models/sd/vae",
    ]


def test_pickle_only_weights_are_refused_before_torch_reads_them(tiny, tmp_path):
    import shutil

    source = tmp_path / "source"
    shutil.copytree(tiny("sd1"), source)
    for path in (source / "unet").glob("*.safetensors"):
        path.rename(path.with_suffix(".bin"))  # as older pipelines shipped: pickles only
    err = _one_line_error(run_cli("export", str(source), "--out", str(tmp_path / "out")))
    assert "unet holds only pickle weights" in err and "safetensors" in err and not (tmp_path / "out").exists()


def test_nan_weights_are_said_to_be_the_weights_not_an_exporter_bug(tmp_path):
    """torch's own output holding NaN (weights with NaN in them) was reported as "a bug in the exporter"."""
    import numpy as np
    import onnx
    import onnx.helper as h
    import pytest
    import torch

    from enginefarm.errors import ConfigError
    from enginefarm.export.check import Shape, compare_with_torch
    from enginefarm.families import Tensor

    graph = h.make_graph(
        [h.make_node("Identity", ["x"], ["y"])],
        "g",
        [h.make_tensor_value_info("x", 1, ["batch", 4])],
        [h.make_tensor_value_info("y", 1, ["batch", 4])],
    )
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10), str(tmp_path / "m.onnx"))
    cases = [(Shape(batch=2, height=8, width=8), (torch.ones(2, 4),))]
    nan = [[np.full((2, 4), np.nan, np.float32)]]
    outputs = (Tensor("y", "float32", ("batch", 4)),)
    with pytest.raises(ConfigError, match="torch's own output y holds NaN or inf") as refused:
        compare_with_torch(tmp_path / "m.onnx", "text_encoder", nan, cases, outputs, 8)
    assert "bug in the exporter" not in str(refused.value) and "checkpoint" in refused.value.hint
    assert compare_with_torch(tmp_path / "m.onnx", "text_encoder", [[np.ones((2, 4), np.float32)]], cases, outputs, 8)
