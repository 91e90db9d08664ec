"""TAESD-class preview decoders: madebyollin's tiny autoencoders (TAESD for SD 1.x/2.x, TAESDXL, TAESD3, TAEF1), as
diffusers' `AutoencoderTiny` folders (config.json + weights) or as the single files apps download
(`taesd_decoder.safetensors` / `.pth`: madebyollin's `nn.Sequential` numbering, which sdkit and ComfyUI load).

The exported component `decoder` takes the latent as a pipeline holds it while denoising (its model space: scaled,
and shifted for SD3/Flux) and gives the image in [0, 1]: what a diffusers pipeline whose `vae` is this
AutoencoderTiny gives, i.e. `decode(latent / scaling_factor + shift_factor)` and the image processor's
`(x / 2 + 0.5).clamp(0, 1)`. madebyollin's decoders are trained on model-space latents, so their configs (and the
single files, which have none) say scaling 1 and shift 0; a config that says otherwise is followed, as diffusers does.

A folder (which holds the encoder too) also gives the component `encoder`: an image in [0, 1] → the model-space
latent a diffusers img2img pipeline with this VAE makes from it, `(encode(2 x - 1).latents - shift) * scaling`.
"""

from __future__ import annotations

import re
from typing import Any

from enginefarm.errors import ConfigError

from .registry import Architecture, Part, Parts, Source

# A name's hint at the latent space it decodes (madebyollin's file and repository names) → the family's VAE
# scaling factor, which is how enginefarm.diffusion.preview tells latent spaces apart.
LATENT_SPACES = (("taesdxl", 0.13025), ("taesd3", 1.5305), ("taef1", 0.3611), ("taesd", 0.18215))
# madebyollin's decoder: Sequential(Clamp, conv, ReLU, 3 blocks, Upsample, conv, ... , block, conv): the convolution
# indices of the single file. diffusers' DecoderTiny has no Clamp module: its index is the file's minus one.
_DECODER_CONVS = (1, 7, 12, 17, 19)
_FILE_KEY = re.compile(r"^(\d+)\.(.+)$")
# the preview and decoding sizes an app asks for: 64 px to 1536 px images, 8 latent pixels per image pixel...
LATENT_PROFILE = (8, 64, 192)
IMAGE_PROFILE = (64, 512, 1536)  # the encoder's image sides: the same sizes in pixels


def _keys(source: Source) -> set[str]:
    return set(source.state)


def _is_folder(source: Source) -> bool:
    return isinstance(source.config, dict) and source.config.get("_class_name") == "AutoencoderTiny"


def _is_decoder_file(source: Source) -> bool:
    keys = _keys(source)
    return (
        source.config is None
        and all(f"{i}.weight" in keys for i in _DECODER_CONVS)
        and all(_FILE_KEY.match(k) for k in keys)
        and tuple(source.state["19.weight"].shape[:2]) == (3, 64)
    )


def _is_encoder_file(source: Source) -> bool:
    keys = _keys(source)
    return (
        source.config is None
        and {"0.weight", "14.weight"} <= keys
        and "19.weight" not in keys
        and all(_FILE_KEY.match(k) for k in keys)
        and tuple(source.state["0.weight"].shape[:2]) == (64, 3)
    )


def matches(source: Source) -> bool:
    """A diffusers AutoencoderTiny folder, or madebyollin's single decoder (or encoder, to say so) file."""
    try:
        return _is_folder(source) or _is_decoder_file(source) or _is_encoder_file(source)
    except Exception:  # a foreign file's odd shapes: not ours
        return False


def _latent_space(source: Source) -> float | None:
    """The family VAE scaling factor of the latent space madebyollin's name for the file or folder says (taesd,
    taesdxl, taesd3, taef1, with or without `_decoder`); None for any other name."""
    stem = source.path.name.lower().split(".")[0]
    stem = re.sub(r"[_-]decoder$", "", stem)
    return dict(LATENT_SPACES).get(stem)


def _folder_model(source: Source):
    from diffusers import AutoencoderTiny

    config = dict(source.config or {})
    config.pop("block_out_channels", None)  # save_pretrained's copy of decoder_block_out_channels
    try:
        model = AutoencoderTiny.from_config(config)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"{source.path}: config.json is not an AutoencoderTiny's ({exc})", hint="re-download the TAESD folder"
        ) from None
    decoder_state = {k: v for k, v in source.state.items() if k.startswith("decoder.")}
    _load(model.decoder, {k.removeprefix("decoder."): v for k, v in decoder_state.items()}, source)
    encoder_state = {k.removeprefix("encoder."): v for k, v in source.state.items() if k.startswith("encoder.")}
    if encoder_state:
        _load(model.encoder, encoder_state, source, "encoder")
    else:
        model.encoder = None  # a folder of the decoder alone: no encoder part
    return model, float(config.get("scaling_factor", 1.0)), float(config.get("shift_factor", 0.0))


def _file_model(source: Source):
    from diffusers import AutoencoderTiny

    if any(".pool." in k for k in source.state):
        raise ConfigError(
            f"{source.path} is a TAESD decoder with mid-block group norms (TAEF2-style), which enginefarm does not "
            "export yet",
            hint="use TAESD, TAESDXL, TAESD3 or TAEF1",
        )
    channels = int(source.state["1.weight"].shape[1])
    model = AutoencoderTiny(latent_channels=channels)
    state = {}
    for key, value in source.state.items():
        index, rest = _FILE_KEY.match(key).groups()  # type: ignore[union-attr]  # matches() checked every key
        state[f"layers.{int(index) - 1}.{rest}"] = value
    _load(model.decoder, state, source)
    model.encoder = None  # a single decoder file
    return model, 1.0, 0.0


def _load(module, state: dict[str, Any], source: Source, part: str = "decoder") -> None:
    expected = module.state_dict()
    wrong = [k for k, v in state.items() if k in expected and tuple(v.shape) != tuple(expected[k].shape)]
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected or wrong:
        what = (
            f"missing {missing[:3]}"
            if missing
            else f"unexpected {unexpected[:3]}"
            if unexpected
            else f"shapes differ at {wrong[:3]}"
        )
        raise ConfigError(
            f"{source.path}: not a TAESD {part} of the published layout ({what})",
            hint="give madebyollin's taesd*_decoder file or a diffusers AutoencoderTiny folder",
        )
    module.load_state_dict({k: v.float() for k, v in state.items()})


class PreviewDecoderModule:
    """The decoder as the ONNX graph runs it: model-space latent → image in [0, 1] (built lazily: torch)."""

    @staticmethod
    def make(model, scaling_factor: float, shift_factor: float):
        import torch

        identity = (scaling_factor, shift_factor) == (1.0, 0.0)

        class Decode(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.decoder = model.decoder

            def forward(self, latent):
                unscaled = latent if identity else latent / scaling_factor + shift_factor
                return (self.decoder(unscaled) / 2 + 0.5).clamp(0, 1)

        return Decode().eval()


class EncoderModule:
    """The encoder as the ONNX graph runs it: image in [0, 1] → model-space latent (built lazily: torch)."""

    @staticmethod
    def make(model, scaling_factor: float, shift_factor: float):
        import torch

        identity = (scaling_factor, shift_factor) == (1.0, 0.0)

        class Encode(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.encoder = model.encoder

            def forward(self, image):
                # diffusers' EncoderTiny maps the pipeline's [-1, 1] image back to [0, 1] first: taken as it is here
                latent = self.encoder.layers(image)
                return latent if identity else (latent - shift_factor) * scaling_factor

        return Encode().eval()


def build(source: Source) -> Parts:
    """The `decoder` component and the facts a pipeline checks before it uses it."""
    if not _is_folder(source) and _is_encoder_file(source):
        raise ConfigError(
            f"{source.path} is a TAESD encoder (image to latent); enginefarm exports the decoder, for previews",
            hint="give the matching taesd*_decoder file, or the diffusers AutoencoderTiny folder",
        )
    model, scaling, shift = _folder_model(source) if _is_folder(source) else _file_model(source)
    model.eval()
    channels = int(model.config.latent_channels)
    upscale = int(model.config.upsampling_scaling_factor) ** (len(model.config.decoder_block_out_channels) - 1)
    part = Part(
        module=PreviewDecoderModule.make(model, scaling, shift),
        inputs={"latent": (1, channels, "latent_height", "latent_width")},
        outputs={"image": (1, 3, "image_height", "image_width")},
        profile={"latent_height": LATENT_PROFILE, "latent_width": LATENT_PROFILE},
        ranges={"latent": (-3.0, 3.0)},
        # its widest level, held at the image's size (the builder's VAE rule would assume SD's 6 GB per megapixel)
        resources={"activation_channels": int(max(model.config.decoder_block_out_channels))},
    )
    parts = {"decoder": part}
    if model.encoder is not None:
        parts["encoder"] = Part(
            module=EncoderModule.make(model, scaling, shift),
            inputs={"image": (1, 3, "image_height", "image_width")},
            outputs={"latent": (1, channels, "latent_height", "latent_width")},
            profile={"image_height": IMAGE_PROFILE, "image_width": IMAGE_PROFILE},
            ranges={"image": (0.0, 1.0)},
            resources={"activation_channels": int(max(model.config.encoder_block_out_channels))},
        )
    details = {
        "latent_channels": channels,
        "upscale": upscale,  # image pixels per latent pixel
        "latent_scaling_factor": _latent_space(source),  # the family VAE's, when the name says it; else null
        "scaling_factor": scaling,
        "shift_factor": shift,
    }
    return Parts("AutoencoderTiny", "preview_decoder", parts, details)


ARCHITECTURES = [
    Architecture("TAESD (diffusers AutoencoderTiny, madebyollin's taesd*_decoder)", "preview_decoder", matches, build)
]
