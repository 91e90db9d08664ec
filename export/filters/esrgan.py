"""Upscalers of the ESRGAN line: RRDBNet (ESRGAN, BSRGAN, Real-ESRGAN x4plus/x2plus/anime_6B, 4x-UltraSharp and the
other community files, ESRGAN+ with its dense blocks' extra 1x1 residual branches (its Gaussian noise is a training
step only), the old layout's ×3 files) and SRVGGNetCompact (realesr-animevideov3, realesr-general-x4v3). Recognised
from the keys as spandrel recognises them; the torch modules are built here, in basicsr's layout, and the old ESRGAN
key layout (`model.0…`) is renamed into it."""

from __future__ import annotations

import math
import re
from typing import Any

from enginefarm.errors import ConfigError

from .registry import Architecture, Part, Parts, Source

# The image sides an engine is built for: one tile of a large image (the runtime tiles what is bigger).
TILE_PROFILE = (64, 256, 512)
IMAGE_RANGE = (0.0, 1.0)

_RDB_NEW = re.compile(r"body\.(\d+)\.rdb(\d)\.conv(\d)\.(weight|bias)")
_RDB_BSRGAN = re.compile(r"RRDB_trunk\.(\d+)\.RDB(\d)\.conv(\d)\.(weight|bias)")
_RDB_OLD = re.compile(r"model\.1\.sub\.(\d+)\.RDB(\d)\.conv(\d)\.0\.(weight|bias)")
_RDB_PLUS_OLD = re.compile(r"model\.1\.sub\.(\d+)\.RDB(\d)\.conv1x1\.weight")
# A ×3 file of the old layout has the keys of a ×2 one (one upsample step: ×3 instead of ×2), so only its name tells:
# "3x_…", "…_x3", "…-3x" as the community's files are named.
_NAMED_X3 = re.compile(r"(?:^|[^a-z0-9])(?:3x|x3)(?:$|[^a-z0-9])", re.IGNORECASE)
_MODEL_OLD = re.compile(r"model\.(\d+)\.(weight|bias)")
_UPCONV_NEW = re.compile(r"(?:upconv|conv_up)(\d)\.(weight|bias)")


def _has_all(state: dict, *keys: str) -> bool:
    return all(k in state for k in keys)


def is_rrdbnet(source: Source) -> bool:
    """The RRDBNet layouts spandrel knows: old ESRGAN (and ESRGAN+ in it), BSRGAN/RealSR, Real-ESRGAN's basicsr."""
    s = source.state
    return (
        _has_all(s, "model.0.weight", "model.1.sub.0.RDB1.conv1.0.weight")
        or _has_all(s, "model.0.weight", "model.1.sub.0.RDB1.conv1x1.weight")
        or _has_all(s, "conv_first.weight", "body.0.rdb1.conv1.weight", "conv_body.weight", "conv_last.weight")
        or _has_all(s, "conv_first.weight", "RRDB_trunk.0.RDB1.conv1.weight", "trunk_conv.weight", "conv_last.weight")
    )


def rrdb_state(state: dict[str, Any]) -> dict[str, Any]:
    """Any RRDBNet layout's keys in basicsr's names: conv_first, body.N.rdbK.convJ, conv_body, conv_up1…,
    conv_hr, conv_last."""
    if "conv_first.weight" in state:
        renamed = {}
        for key, value in state.items():
            if found := _RDB_BSRGAN.fullmatch(key):
                key = "body.{}.rdb{}.conv{}.{}".format(*found.groups())
            elif key.startswith("trunk_conv."):
                key = "conv_body." + key.removeprefix("trunk_conv.")
            elif key.startswith("HRconv."):
                key = "conv_hr." + key.removeprefix("HRconv.")
            elif found := _UPCONV_NEW.fullmatch(key):
                key = f"conv_up{found.group(1)}.{found.group(2)}"
            renamed[key] = value
        return renamed
    # Old layout: model.0 conv; model.1 the shortcut around the RRDBs (sub.N) and the trunk conv (sub.NB); then per
    # ×2 step an upsample, a conv and an activation (3 entries); then the HR conv, its activation and the last conv.
    blocks = 1 + max(int(m.group(1)) for k in state if (m := _RDB_OLD.fullmatch(k)))
    top = max(int(m.group(1)) for k in state if (m := _MODEL_OLD.fullmatch(k)))
    renamed = {}
    for key, value in state.items():
        if found := _RDB_OLD.fullmatch(key):
            renamed["body.{}.rdb{}.conv{}.{}".format(*found.groups())] = value
        elif found := _RDB_PLUS_OLD.fullmatch(key):
            renamed["body.{}.rdb{}.conv1x1.weight".format(*found.groups())] = value
        elif key.startswith(f"model.1.sub.{blocks}."):
            renamed["conv_body." + key.rsplit(".", 1)[1]] = value
        elif found := _MODEL_OLD.fullmatch(key):
            index, kind = int(found.group(1)), found.group(2)
            if index == 0:
                renamed[f"conv_first.{kind}"] = value
            elif index == top:
                renamed[f"conv_last.{kind}"] = value
            elif index == top - 2:
                renamed[f"conv_hr.{kind}"] = value
            elif index % 3 == 0:
                renamed[f"conv_up{index // 3}.{kind}"] = value
            else:
                raise ConfigError(f"{key}: not where an ESRGAN model has a layer", hint="is the file whole?")
        else:
            raise ConfigError(f"{key}: not a key of an ESRGAN model", hint="is the file an ESRGAN upscaler?")
    return renamed


def _torch_rrdbnet(state: dict[str, Any], triple: bool = False):
    import torch
    from torch import nn
    from torch.nn import functional

    def conv(name: str) -> nn.Conv2d:
        weight = state[f"{name}.weight"]
        layer = nn.Conv2d(weight.shape[1], weight.shape[0], weight.shape[2], padding=weight.shape[2] // 2)
        return layer

    def lrelu(x):
        return functional.leaky_relu(x, 0.2)

    class DenseBlock(nn.Module):
        def __init__(self, prefix: str):
            super().__init__()
            for j in range(1, 6):
                setattr(self, f"conv{j}", conv(f"{prefix}.conv{j}"))
            # ESRGAN+: a bias-free 1x1 conv from the block's input added to the second conv's output
            plus = state.get(f"{prefix}.conv1x1.weight")
            self.conv1x1 = None if plus is None else nn.Conv2d(plus.shape[1], plus.shape[0], 1, bias=False)

        def forward(self, x):
            features = [x]
            for j in range(1, 5):
                features.append(lrelu(getattr(self, f"conv{j}")(torch.cat(features, 1))))
                if self.conv1x1 is not None and j == 2:
                    features[2] = features[2] + self.conv1x1(x)
                elif self.conv1x1 is not None and j == 4:  # and the second's output to the fourth's
                    features[4] = features[4] + features[2]
            return self.conv5(torch.cat(features, 1)) * 0.2 + x

    class RRDB(nn.Module):
        def __init__(self, prefix: str):
            super().__init__()
            self.rdb1, self.rdb2, self.rdb3 = (DenseBlock(f"{prefix}.rdb{k}") for k in (1, 2, 3))

        def forward(self, x):
            return self.rdb3(self.rdb2(self.rdb1(x))) * 0.2 + x

    class RRDBNet(nn.Module):
        """basicsr's RRDBNet; `unshuffle` (x2plus: 2, x1: 4) packs the input's pixels into channels first."""

        def __init__(self, blocks: int, upsamples: int, unshuffle: int):
            super().__init__()
            self.unshuffle, self.upsamples = unshuffle, upsamples
            self.conv_first = conv("conv_first")
            self.body = nn.Sequential(*(RRDB(f"body.{i}") for i in range(blocks)))
            self.conv_body = conv("conv_body")
            for k in range(1, upsamples + 1):
                setattr(self, f"conv_up{k}", conv(f"conv_up{k}"))
            self.conv_hr = conv("conv_hr")
            self.conv_last = conv("conv_last")

        def forward(self, image):
            x = functional.pixel_unshuffle(image, self.unshuffle) if self.unshuffle > 1 else image
            features = self.conv_first(x)
            features = features + self.conv_body(self.body(features))
            for k in range(1, self.upsamples + 1):
                up = functional.interpolate(features, scale_factor=3.0 if triple else 2.0, mode="nearest")
                features = lrelu(getattr(self, f"conv_up{k}")(up))
            return self.conv_last(lrelu(self.conv_hr(features)))

    blocks = 1 + max(int(m.group(1)) for k in state if (m := _RDB_NEW.fullmatch(k)))
    upsamples = sum(1 for k in state if _UPCONV_NEW.fullmatch(k) and k.endswith(".weight"))
    in_channels, out_channels = state["conv_first.weight"].shape[1], state["conv_last.weight"].shape[0]
    unshuffle = (
        int(math.isqrt(in_channels // out_channels)) if in_channels in (4 * out_channels, 16 * out_channels) else 1
    )
    if in_channels // unshuffle**2 != 3 or out_channels != 3:
        raise ConfigError(
            f"an ESRGAN model with {in_channels} input and {out_channels} output channels: enginefarm exports RGB "
            "upscalers only",
            hint="export a 3-channel RGB model",
        )
    if triple and (upsamples != 1 or unshuffle != 1):
        raise ConfigError(
            f"a file named as a ×3 ESRGAN model with {upsamples} upsample steps (a ×3 file has one)",
            hint="rename it if it is not a ×3 model",
        )
    model = RRDBNet(blocks, upsamples, unshuffle)
    model.load_state_dict(state, strict=True)
    return model.eval(), (3 if triple else 2**upsamples // unshuffle), unshuffle, blocks


def build_rrdbnet(source: Source) -> Parts:
    try:
        state = rrdb_state(source.state)
        triple = "model.0.weight" in source.state and bool(_NAMED_X3.search(source.path.stem))
        model, scale, multiple, blocks = _torch_rrdbnet(state, triple)
    except (KeyError, ValueError, RuntimeError) as exc:
        raise ConfigError(
            f"{source.path}: an ESRGAN model whose layers do not fit together ({str(exc).splitlines()[0]})",
            hint="is the file whole? re-download it",
        ) from None
    width = int(state["conv_first.weight"].shape[0])
    details = {"scale": scale, "multiple": multiple, "blocks": blocks, "features": width}
    if any(".conv1x1." in k for k in state):
        details["plus"] = True  # ESRGAN+
    return _upscaler_parts("RRDBNet", model, scale, multiple, details)


def is_srvgg(source: Source) -> bool:
    """SRVGGNetCompact: a plain chain `body.N` of 3x3 convs and PReLUs (1-D weights), ending in a pixel shuffle."""
    s = source.state
    if not _has_all(s, "body.0.weight", "body.1.weight") or any(not k.startswith("body.") for k in s):
        return False
    return getattr(s["body.0.weight"], "ndim", 0) == 4 and getattr(s["body.1.weight"], "ndim", 0) == 1


def _torch_srvgg(state: dict[str, Any]):
    import torch
    from torch import nn
    from torch.nn import functional

    last = max(int(k.split(".")[1]) for k in state)
    in_channels, features = state["body.0.weight"].shape[1], state["body.0.weight"].shape[0]
    scale = math.isqrt(state[f"body.{last}.weight"].shape[0] // in_channels)
    if in_channels != 3 or scale * scale * in_channels != state[f"body.{last}.weight"].shape[0]:
        raise ConfigError(
            f"an SRVGG model with {in_channels} input channels and {state[f'body.{last}.weight'].shape[0]} before its "
            "pixel shuffle: enginefarm exports RGB upscalers only",
            hint="export a 3-channel RGB model",
        )

    class SRVGGNetCompact(nn.Module):
        def __init__(self):
            super().__init__()
            layers: list[nn.Module] = [nn.Conv2d(in_channels, features, 3, padding=1), nn.PReLU(features)]
            for _ in range((last - 2) // 2):
                layers += [nn.Conv2d(features, features, 3, padding=1), nn.PReLU(features)]
            layers.append(nn.Conv2d(features, in_channels * scale * scale, 3, padding=1))
            self.body = nn.ModuleList(layers)

        def forward(self, image):
            x = image
            for layer in self.body:
                x = layer(x)
            # the network learns the residual over the nearest-neighbour enlargement
            return functional.pixel_shuffle(x, scale) + functional.interpolate(
                image, scale_factor=float(scale), mode="nearest"
            )

    model = SRVGGNetCompact()
    model.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()}, strict=True)
    return model.eval(), scale, features, (last - 2) // 2


def build_srvgg(source: Source) -> Parts:
    try:
        model, scale, features, convs = _torch_srvgg(source.state)
    except (KeyError, ValueError, RuntimeError) as exc:
        raise ConfigError(
            f"{source.path}: an SRVGG model whose layers do not fit together ({str(exc).splitlines()[0]})",
            hint="is the file whole? re-download it",
        ) from None
    details = {"scale": scale, "multiple": 1, "convs": convs, "features": features}
    return _upscaler_parts("SRVGGNetCompact", model, scale, 1, details)


def _upscaler_parts(architecture: str, model, scale: int, multiple: int, details: dict) -> Parts:
    low, opt, high = (max(multiple, (n // multiple) * multiple) for n in TILE_PROFILE)
    part = Part(
        module=model,
        inputs={"image": ("batch", 3, "height", "width")},
        outputs={"upscaled": ("batch", 3, "upscaled_height", "upscaled_width")},
        profile={"batch": (1, 1, 1), "height": (low, opt, high), "width": (low, opt, high)},
        ranges={"image": IMAGE_RANGE},
        resources={"activation_channels": int(details["features"]) * scale * scale},
    )
    return Parts(architecture, "upscaler", {"upscaler": part}, details)


ARCHITECTURES = [
    Architecture("ESRGAN / Real-ESRGAN (RRDBNet)", "upscaler", is_rrdbnet, build_rrdbnet),
    Architecture("Real-ESRGAN Compact (SRVGGNetCompact)", "upscaler", is_srvgg, build_srvgg),
]
