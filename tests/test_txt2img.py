"""A real app's path: the tiny SD 1.5 (text encoder, UNet, VAE decoder) built by the farm, then examples/txt2img.py
running its diffusion loop on enginefarm.load sessions only, checked against the same loop on plain ONNX Runtime."""

from __future__ import annotations

import importlib.util
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_png(path: Path) -> np.ndarray:
    """uint8 [H, W, 3] from an 8-bit RGB PNG without filters (what txt2img writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        chunks[kind] = chunks.get(kind, b"") + data[pos + 8:pos + 8 + length]
        pos += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, color) == (8, 2)
    rows = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), np.uint8).reshape(height, 1 + 3 * width)
    assert not rows[:, 0].any()  # filter type 0 on every row
    return rows[:, 1:].reshape(height, width, 3)


@pytest.fixture(scope="module")
def tiny_sd15_store(tmp_path_factory):
    """recipes/tiny_sd15.toml built for ONNX Runtime fp32 and OpenVINO fp16 (9 jobs would do too; 6 are enough)."""
    from tests.conftest import run_cli

    root = tmp_path_factory.mktemp("sd15")
    _module(ROOT / "recipes" / "make_tiny_sd15.py", "make_tiny_sd15").make_models(root / "models" / "tiny_sd15")
    recipe = root / "tiny_sd15.toml"
    shutil.copyfile(ROOT / "recipes" / "tiny_sd15.toml", recipe)
    env = {"ENGINEFARM_STORE": str(root / "store"), "ENGINEFARM_HOME": str(root / "buildhome")}
    for target, precision in (("onnxruntime:cpu", "fp32"), ("openvino:cpu", "fp16")):
        proc = run_cli("build", str(recipe), "--target", target, "--precision", precision, "--no-bench", "-j", "2", env=env, check=True)
        assert "3 built, 0 failed" in proc.stdout
    return root


class _Plain:
    """ONNX Runtime on the source model, with the session's run(dict) -> dict."""

    def __init__(self, path: Path) -> None:
        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def run(self, feeds):
        names = [o.name for o in self.session.get_outputs()]
        return dict(zip(names, self.session.run(names, feeds)))


def _txt2img(root: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ENGINEFARM_STORE": str(root / "store"), "ENGINEFARM_HOME": str(tmp_path / "apphome")}
    return subprocess.run([sys.executable, str(ROOT / "examples" / "txt2img.py"), "a red fox in the snow", "--model", "tiny-sd15",
                           "--latent", "8", "--steps", "4", "--seed", "3", *args], capture_output=True, text=True, env=env, timeout=600)


def test_txt2img_runs_the_diffusion_loop_on_loaded_artifacts(tiny_sd15_store, tmp_path):
    out = tmp_path / "fox.png"
    proc = _txt2img(tiny_sd15_store, tmp_path, "--precision", "fp32", "--target", "onnxruntime:cpu", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    for label in ("load text_encoder", "load unet", "load vae_decoder", "encode text", "unet step 1/4", "unet step 4/4", "decode latent"):
        assert label in proc.stdout, proc.stdout
    assert f"wrote {out} (16x16)" in proc.stdout and "total" in proc.stdout
    image = read_png(out)
    assert image.shape == (16, 16, 3) and image.std() > 1  # an image, not a constant

    # The same loop on plain ONNX Runtime over the source models gives the same picture.
    app = _module(ROOT / "examples" / "txt2img.py", "txt2img")
    models = tiny_sd15_store / "models" / "tiny_sd15"
    plain = {name: _Plain(models / f"{name}.onnx") for name in ("text_encoder", "unet", "vae_decoder")}
    expected = app.to_image(app.generate(plain, app.tokenize("a red fox in the snow"), steps=4, guidance=7.5, latent=8, seed=3, batch2=True))
    assert np.abs(image.astype(int) - expected.astype(int)).max() <= 1


def test_txt2img_on_openvino_fp16_stays_close(tiny_sd15_store, tmp_path):
    fp32, fp16 = tmp_path / "fp32.png", tmp_path / "fp16.png"
    assert _txt2img(tiny_sd15_store, tmp_path, "--precision", "fp32", "--out", str(fp32)).returncode == 0
    proc = _txt2img(tiny_sd15_store, tmp_path, "--precision", "fp16", "--target", "openvino:cpu", "--out", str(fp16))
    assert proc.returncode == 0, proc.stderr
    assert "openvino:cpu fp16" in proc.stdout
    diff = np.abs(read_png(fp32).astype(int) - read_png(fp16).astype(int))
    assert diff.mean() < 8  # fp16 through 4 steps drifts a little, never into another picture


def test_txt2img_outside_the_profile_says_why(tiny_sd15_store, tmp_path):
    proc = _txt2img(tiny_sd15_store, tmp_path, "--latent", "64", "--out", str(tmp_path / "big.png"))
    assert proc.returncode == 1
    assert "outside the artifact's profile" in proc.stderr and "Traceback" not in proc.stderr
