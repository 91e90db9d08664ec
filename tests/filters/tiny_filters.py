"""Seeded tiny preview decoders and safety checkers in the layouts users download, and their diffusers references.

TAESD: diffusers' AutoencoderTiny at a narrow width (8 channels, one block a level) saved with save_pretrained, and
madebyollin's single decoder file (the published width, `nn.Sequential` numbering: diffusers' decoder index + 1).
Safety checker: StableDiffusionSafetyChecker over a narrow CLIP vision tower (224 px, patches of 32, width 32),
saved with CLIPImageProcessor's preprocessor_config.json, its thresholds placed between the test images' cosines so
that some images are flagged, some are not, and one only through the special-care adjustment."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .scenes import scene

NARROW_TAESD = dict(
    encoder_block_out_channels=(8, 8, 8, 8),
    decoder_block_out_channels=(8, 8, 8, 8),
    num_encoder_blocks=(1, 1, 1, 1),
    num_decoder_blocks=(1, 1, 1, 1),
)


def taesd(latent_channels: int = 4, seed: int = 0, narrow: bool = True):
    """A seeded AutoencoderTiny (narrow, or at TAESD's published width)."""
    from diffusers import AutoencoderTiny

    torch.manual_seed(seed)
    model = AutoencoderTiny(latent_channels=latent_channels, **(NARROW_TAESD if narrow else {}))
    with torch.no_grad():  # diffusers' init leaves the convolutions' scale small: widen it so images vary
        for parameter in model.parameters():
            parameter.mul_(1.5)
    return model.eval()


def write_taesd_folder(folder: Path, latent_channels: int = 4) -> Path:
    taesd(latent_channels).save_pretrained(folder)
    return folder


def write_taesd_decoder_file(path: Path, model) -> Path:
    """The decoder of `model` as madebyollin's taesd*_decoder.safetensors keys it."""
    from safetensors.torch import save_file

    state = {}
    for key, value in model.decoder.state_dict().items():
        _, index, rest = key.split(".", 2)  # layers.N.rest
        state[f"{int(index) + 1}.{rest}"] = value.contiguous()
    save_file(state, str(path))
    return path


def taesd_reference(model, latent: np.ndarray) -> np.ndarray:
    """A diffusers pipeline's image for this model-space latent with `model` as its VAE: decode(latent / scaling +
    shift), then (x / 2 + 0.5).clamp(0, 1), as [N, H, W, 3]."""
    config = model.config
    with torch.no_grad():
        x = torch.from_numpy(latent) / config.scaling_factor + config.shift_factor
        image = (model.decode(x).sample / 2 + 0.5).clamp(0, 1)
    return image.permute(0, 2, 3, 1).numpy()


def taesd_encode_reference(model, images: np.ndarray) -> np.ndarray:
    """The model-space latents a diffusers img2img pipeline with `model` as its VAE makes of images [N, H, W, 3] in
    [0, 1]: the image processor's 2x - 1, `encode(...).latents`, then (latents - shift) * scaling."""
    config = model.config
    with torch.no_grad():
        x = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2))) * 2 - 1
        latents = model.encode(x).latents
        return ((latents - config.shift_factor) * config.scaling_factor).numpy()


# images of several sizes: square, wide, tall, smaller than CLIP's 224 (upsampled) and larger (downsampled)
SAFETY_SIZES = ((256, 256), (192, 320), (320, 200), (96, 96), (512, 384), (150, 151), (64, 200), (300, 300))


def safety_images() -> list[np.ndarray]:
    return [scene(40 + i, height, width) for i, (height, width) in enumerate(SAFETY_SIZES)]


def safety_checker(seed: int = 0):
    from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
    from transformers import CLIPConfig

    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=224, patch_size=32
    )
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=100)
    config = CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    torch.manual_seed(seed)
    checker = StableDiffusionSafetyChecker(config).eval()
    with torch.no_grad():
        checker.concept_embeds.copy_(torch.randn(17, 16))
        checker.special_care_embeds.copy_(torch.randn(3, 16))
    return checker


def reference_pixels(images: list[np.ndarray]) -> torch.Tensor:
    """What a diffusers pipeline's feature extractor gives the checker: numpy_to_pil, then CLIPImageProcessor."""
    from diffusers.image_processor import VaeImageProcessor
    from transformers import CLIPImageProcessor

    pil = [VaeImageProcessor.numpy_to_pil(image[None])[0] for image in images]
    return CLIPImageProcessor()(pil, return_tensors="pt").pixel_values


def cosines(checker, pixels: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    from diffusers.pipelines.stable_diffusion.safety_checker import cosine_distance

    with torch.no_grad():
        embeds = checker.visual_projection(checker.vision_model(pixels)[1])
        special = cosine_distance(embeds, checker.special_care_embeds).numpy()
        concept = cosine_distance(embeds, checker.concept_embeds).numpy()
    return special, concept


def _between(values: np.ndarray, fraction: float) -> float:
    """A threshold in the widest gap between sorted values near `fraction` of the way up: far from every value."""
    ordered = np.sort(values)
    middle = int(round(fraction * (len(ordered) - 1)))
    candidates = range(max(middle - 2, 0), min(middle + 2, len(ordered) - 1))
    widest = max(candidates, key=lambda k: ordered[k + 1] - ordered[k])
    return float((ordered[widest] + ordered[widest + 1]) / 2)


def place_thresholds(checker, images: list[np.ndarray]) -> None:
    """Thresholds that flag some images and not others: special-care concept 0 matches about half of them; concept
    0 flags about a quarter outright; one more concept sits 0.005 above the cosine of a special-care image that has
    the highest cosine with it by over 0.01, so that image alone is flagged by it, and only through the 0.01
    adjustment; every other threshold is above any cosine."""
    special, concept = cosines(checker, reference_pixels(images))
    special_weights = torch.full((3,), 2.0)
    concept_weights = torch.full((17,), 2.0)
    special_weights[0] = _between(special[:, 0], 0.5)
    concept_weights[0] = _between(concept[:, 0], 0.75)
    hits = special[:, 0] > special_weights[0].item()
    choices = []
    for c in range(1, 17):
        order = np.argsort(concept[:, c])[::-1]
        top, gap = order[0], concept[order[0], c] - concept[order[1], c]
        if hits[top] and concept[top, 0] < concept_weights[0].item() and gap > 0.012:
            choices.append((gap, c, top))
    assert choices, "no concept singles out a special-care image: choose other seeds"
    _, c, top = max(choices)
    concept_weights[c] = float(concept[top, c]) + 0.005
    with torch.no_grad():
        checker.special_care_embeds_weights.copy_(special_weights)
        checker.concept_embeds_weights.copy_(concept_weights)


def write_safety_folder(folder: Path, images: list[np.ndarray]):
    """The checker saved as CompVis' folder is laid out, with its thresholds placed for `images`."""
    from transformers import CLIPImageProcessor

    checker = safety_checker()
    place_thresholds(checker, images)
    checker.save_pretrained(folder)
    CLIPImageProcessor().save_pretrained(folder)
    return checker


def diffusers_flags(checker, images: list[np.ndarray]) -> list[bool]:
    """diffusers' decision for each image, through its own forward on its own preprocessing."""
    pixels = reference_pixels(images)
    flags = []
    for index, image in enumerate(images):
        _, flagged = checker(images=[image.copy()], clip_input=pixels[index : index + 1])
        flags.extend(flagged)
    return flags
