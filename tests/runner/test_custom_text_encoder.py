"""Custom weights for an exported text encoder (the tiny SD 1.x of the session, built by the real CLI): a fine-tune
whose position embedding the simplifier had folded into a constant, in either spelling of transformers' names, matches
transformers; a bad file is one line and leaves the device cache byte for byte as it was."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

import enginefarm
from enginefarm.errors import ConfigError, WeightsError
from tests import models

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TARGET = "onnxruntime:cpu"


def _load(built_family, **kwargs):
    _, out, store = built_family
    return enginefarm.load(
        "sd1/text_encoder", precision="fp32", device="cpu", store=str(store), target=TARGET, **kwargs
    )


def _fine_tune(out: Path, prefix: str) -> dict[str, np.ndarray]:
    """Every tensor of the exported checkpoint moved a little, the position embedding included (constant tensors, the
    random init's zero biases and unit norms, stay: the graph shares one initializer among equal ones)."""
    from safetensors.numpy import load_file

    base = load_file(str(out / "text_encoder.safetensors"))
    rng = np.random.default_rng(5)
    tuned = {
        k: (v + rng.normal(0, 0.02, v.shape).astype(v.dtype) if np.unique(v).size > 1 else v) for k, v in base.items()
    }
    assert any("position_embedding" in k for k in tuned)
    return {prefix + k.removeprefix("text_model."): v for k, v in tuned.items()}


def _transformers(source: Path, tuned: dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
    model = transformers.CLIPTextModel.from_pretrained(source / "text_encoder").eval()
    state = {k.removeprefix("text_model."): torch.from_numpy(v) for k, v in tuned.items()}
    own = {k.removeprefix("text_model."): k for k in model.state_dict()}
    model.load_state_dict({own[k]: v for k, v in state.items()})
    with torch.no_grad():
        return model(torch.from_numpy(ids)).last_hidden_state.numpy()


@pytest.mark.parametrize("prefix", ["text_model.", ""])
def test_a_fine_tuned_text_encoder_matches_transformers_in_either_naming(built, tmp_path, prefix):
    source, out, _ = built("sd1")
    tuned = _fine_tune(out, prefix)
    path = models.write_safetensors(tmp_path / "tuned.safetensors", tuned)
    ids = np.random.default_rng(0).integers(0, 1000, (2, 77)).astype(np.int64)
    feeds = {
        "input_ids": ids,
        "added_embeds": np.zeros((2, 77, 768), np.float32),
        "attention_mask": np.ones((2, 77), np.int64),
    }
    ours = _load(built("sd1"), weights=path).run(feeds)["last_hidden_state"]
    theirs = _transformers(source, tuned, ids)
    base = _load(built("sd1")).run(feeds)["last_hidden_state"]
    assert np.abs(ours - theirs).max() < 2e-5
    assert np.abs(base - theirs).max() > 1e-2  # the fine-tune changed the output


def _cache_bytes() -> dict[str, str]:
    home = Path(os.environ["ENGINEFARM_HOME"]) / "artifacts"
    return {
        str(p.relative_to(home)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(home.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("case", ["nan", "absurd", "another family", "holes"])
def test_a_bad_checkpoint_is_one_line_and_the_cache_is_untouched(built, tmp_path, case):
    _, out, _ = built("sd1")
    _load(built("sd1"))  # the base, cached
    before = _cache_bytes()
    tuned = _fine_tune(out, "text_model.")
    name = "text_model.encoder.layers.0.mlp.fc1.weight"
    if case == "nan":
        tuned[name] = tuned[name].copy()
        tuned[name][0, :3] = [np.nan, np.inf, -np.inf]
        expected = "1 NaN and 2 infinite value(s)"
    elif case == "absurd":
        tuned[name] = np.full(tuned[name].shape, 1e20, np.float32)
        expected = "values up to 1e+20, past any trained weight"
    elif case == "another family":  # SDXL's second text encoder: 1280 wide, its own names
        tuned = {f"text_model.encoder.layers.{i}.mlp.fc1.weight": np.zeros((64, 1280), np.float32) for i in range(2)}
        tuned["text_projection.weight"] = np.zeros((1280, 1280), np.float32)
        expected = "not weights for this model: 3 of its 3 tensor(s)"
    path = models.write_safetensors(tmp_path / "bad.safetensors", tuned)
    if case == "holes":
        raw = path.read_bytes()
        path.write_bytes(raw + b"\0" * 64)  # bytes no tensor claims: the reference reader refuses them too
        expected = "cover"
    with pytest.raises(WeightsError) as caught:
        _load(built("sd1"), weights=path)
    message = str(caught.value)
    assert expected in message and str(path) in message and "\n" not in message, message
    assert _cache_bytes() == before


def test_absurd_lora_strengths_are_refused_before_any_work(built, tmp_path):
    with pytest.raises(ConfigError, match="strength 1e\\+308 is beyond ±100"):
        _load(built("sd1"), loras=[(tmp_path / "any.safetensors", 1e308)])
