"""The safety checker at run time: CLIP's preprocessing in numpy against transformers' processors, the decision
against diffusers' StableDiffusionSafetyChecker.forward, and the tiny checker exported and built for ONNX Runtime and
OpenVINO (fp32, fp16) deciding as diffusers does on every test image."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.filters.safety import CLIP_STD, clip_pixels, decide

from .scenes import scene
from .tiny_filters import (
    cosines,
    diffusers_flags,
    place_thresholds,
    reference_pixels,
    safety_checker,
    safety_images,
    write_safety_folder,
)

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

TARGETS = ("onnxruntime:cpu", "openvino:cpu")


@pytest.mark.parametrize("height, width", [(512, 512), (64, 64), (512, 768), (150, 151), (224, 400), (1024, 600)])
def test_clip_pixels_are_transformers_clip_image_processors(height, width):
    """Pillow's 8-bit resampling exactly (the PIL processor); torchvision's uint8 resize (the default processor,
    which diffusers' pipelines load) differs from Pillow by an 8-bit level or two at a few pixels."""
    from PIL import Image
    from transformers import CLIPImageProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    image = scene(height * 7 + width, height, width)
    pil = Image.fromarray((image * 255).round().astype(np.uint8))
    ours = clip_pixels(image)
    assert ours.shape == (3, 224, 224) and ours.dtype == np.float32
    assert np.abs(ours - CLIPImageProcessorPil()(pil, return_tensors="np").pixel_values[0]).max() < 1e-5
    default = CLIPImageProcessor()(pil, return_tensors="pt").pixel_values[0].numpy()
    one_level = 1 / 255 / min(CLIP_STD)
    assert np.abs(ours - default).max() < 2 * one_level + 1e-5
    assert np.mean(np.abs(ours - default) > 1e-5) < 0.03


def test_the_decision_is_diffusers_forward_with_its_special_care_adjustment():
    images = safety_images()
    checker = safety_checker()
    place_thresholds(checker, images)
    special, concept = cosines(checker, reference_pixels(images))
    thresholds = checker.special_care_embeds_weights.tolist(), checker.concept_embeds_weights.tolist()
    verdicts = [decide(s, c, *thresholds) for s, c in zip(special, concept, strict=True)]
    assert [flagged for flagged, _ in verdicts] == diffusers_flags(checker, images)
    assert 0 < sum(flagged for flagged, _ in verdicts) < len(images)
    # one image is flagged only because a special-care concept matched first: its score is cosine - threshold + 0.01
    adjusted = [
        (i, c)
        for i, (flagged, scores) in enumerate(verdicts)
        for c in scores["bad_concepts"]
        if scores["special_care"] and concept[i, c] - thresholds[1][c] < 0
    ]
    assert adjusted
    i, c = adjusted[0]
    expected = round(float(concept[i, c] - thresholds[1][c]) + 0.01, 3)
    assert verdicts[i][1]["concept_scores"][c] == pytest.approx(expected)


@pytest.fixture(scope="module")
def built_checker(tmp_path_factory):
    from enginefarm.export.filters.run import export_filter

    from ..conftest import run_cli

    root = tmp_path_factory.mktemp("safety")
    images = safety_images()
    checker = write_safety_folder(root / "safety_checker", images)
    export = export_filter(root / "safety_checker", root / "out", name="tiny-safety", targets=TARGETS)
    run_cli("build", str(export.recipe), "--store", str(root / "store"), "--no-bench", "-j", "2", check=True)
    pixels = np.stack([clip_pixels(image) for image in images])
    return checker, images, pixels, cosines(checker, torch.from_numpy(pixels)), diffusers_flags(checker, images), root


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("precision, tolerance", [("fp32", 1e-3), ("fp16", 2e-2)])
def test_the_built_checker_decides_as_diffusers(built_checker, target, precision, tolerance):
    import enginefarm.filters

    _, images, pixels, (want_special, want_concept), want_flags, root = built_checker
    store = str(root / "store")
    with enginefarm.filters.load("tiny-safety", store=store, precision=precision, target=target) as ours:
        assert ours.kind == "safety_checker"
        special, concept = ours.similarities(pixels)
        assert np.abs(special - want_special).max() < tolerance
        assert np.abs(concept - want_concept).max() < tolerance
        verdicts = ours.check(images)
        assert [flagged for flagged, _ in verdicts] == want_flags
        assert 0 < sum(want_flags) < len(images)
        assert ours(images[3]) == verdicts[3]
