"""diffusers' StableDiffusionSafetyChecker folder (CompVis' layout: config.json, model.safetensors or
pytorch_model.bin, preprocessor_config.json) recognised and built: the torch module the export traces gives diffusers'
own cosine similarities, and filter.json carries its thresholds and CLIP's preprocessing settings."""

from __future__ import annotations

import json

import numpy as np
import pytest

from enginefarm.errors import ConfigError

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from enginefarm.export.filters import safety as safety_export  # noqa: E402
from enginefarm.export.filters.reading import read_filter_source, recognise  # noqa: E402

from ...filters.tiny_filters import cosines, reference_pixels, safety_images, write_safety_folder  # noqa: E402


def test_a_safety_checker_folder_is_recognised_with_its_thresholds(tmp_path):
    images = safety_images()[:3]
    checker = write_safety_folder(tmp_path / "safety_checker", images)
    source = read_filter_source(tmp_path / "safety_checker")
    assert recognise(source).kind == "safety_checker"
    parts = safety_export.build(source)
    details = parts.details
    assert details["special_thresholds"] == checker.special_care_embeds_weights.tolist()
    assert details["concept_thresholds"] == checker.concept_embeds_weights.tolist()
    assert (details["shortest_edge"], details["crop_size"], details["image_size"]) == (224, 224, 224)
    pixels = reference_pixels(images)
    with torch.no_grad():
        special, concept = parts.parts["checker"].module(pixels)
    want_special, want_concept = cosines(checker, pixels)
    assert np.abs(special.numpy() - want_special).max() < 1e-5
    assert np.abs(concept.numpy() - want_concept).max() < 1e-5
    assert parts.parts["checker"].outputs == {"special_cos": ("batch", 3), "concept_cos": ("batch", 17)}


def test_the_pipelines_feature_extractor_folder_is_read_and_other_preprocessing_refused(tmp_path):
    """In a diffusers pipeline the processor sits in feature_extractor/ beside safety_checker/; a processor this
    runtime does not reproduce (bilinear) is one line."""
    folder = tmp_path / "pipeline" / "safety_checker"
    write_safety_folder(folder, safety_images()[:3])
    processor = json.loads((folder / "preprocessor_config.json").read_text())
    (folder / "preprocessor_config.json").unlink()
    (tmp_path / "pipeline" / "feature_extractor").mkdir()
    changed = {**processor, "image_mean": [0.5, 0.5, 0.5]}
    (tmp_path / "pipeline" / "feature_extractor" / "preprocessor_config.json").write_text(json.dumps(changed))
    assert safety_export.build(read_filter_source(folder)).details["image_mean"] == [0.5, 0.5, 0.5]
    (folder / "preprocessor_config.json").write_text(json.dumps({**processor, "resample": 2}))
    with pytest.raises(ConfigError, match="not CLIP's"):
        safety_export.build(read_filter_source(folder))


def test_weights_of_another_config_are_one_line(tmp_path):
    write_safety_folder(tmp_path / "checker", safety_images()[:3])
    config = json.loads((tmp_path / "checker" / "config.json").read_text())
    config["projection_dim"] = 8
    (tmp_path / "checker" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="not this config's safety checker"):
        safety_export.build(read_filter_source(tmp_path / "checker"))
