"""An image's generation parameters, stored in its PNG so it can be made again from the file alone.

Two text chunks, as SD apps write them: `parameters`, the A1111 line format that model sites and other apps read
(prompt, `Negative prompt:`, then `Key: value` pairs), and `enginefarm`, the same call as JSON with every value this
runtime needs to repeat it (`enginefarm generate --again FILE.png`).

    text = png_text({"model": "sd15", "prompt": "a fox", "seed": 7, "steps": 25, ...})
    write_png("fox.png", image, text)
    read_parameters("fox.png")  # → the dict given to png_text
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from enginefarm.errors import ConfigError

from .images import read_png_text

KEY = "enginefarm"

# A1111's names for the fields every SD app shows, in its order.
_A1111_FIELDS = (
    ("steps", "Steps"),
    ("scheduler", "Sampler"),
    ("guidance_scale", "CFG scale"),
    ("seed", "Seed"),
    ("size", "Size"),
    ("model", "Model"),
    ("strength", "Denoising strength"),
    ("clip_skip", "Clip skip"),
    ("tiling", "Tiling"),
)


def png_text(record: dict[str, Any]) -> dict[str, str]:
    """The text chunks for one image from its parameters: `prompt`, `negative_prompt`, `seed`, `steps`,
    `guidance_scale`, `scheduler`, `width`, `height`, `model`, `loras` ([[file, strength], ...]) and whatever else the
    call took (kept as given, JSON-serializable)."""
    fields = dict(record)
    if fields.get("width") and fields.get("height"):
        fields["size"] = f"{fields['width']}x{fields['height']}"
    pairs = [f"{label}: {fields[key]}" for key, label in _A1111_FIELDS if fields.get(key) not in (None, "")]
    loras = fields.get("loras") or []
    if loras:
        pairs.append("LoRAs: " + ", ".join(f"{Path(str(f)).stem}:{s:g}" for f, s in loras))
    lines = [str(fields.get("prompt", ""))]
    if fields.get("negative_prompt"):
        lines.append(f"Negative prompt: {fields['negative_prompt']}")
    lines.append(", ".join(pairs))
    return {"parameters": "\n".join(lines), KEY: json.dumps(record, ensure_ascii=False, sort_keys=True)}


def read_parameters(path: str | Path) -> dict[str, Any]:
    """The parameters `png_text` stored in a PNG: the dict it was given."""
    text = read_png_text(path)
    if KEY not in text:
        other = " (it has A1111-style parameters, which are not read back)" if "parameters" in text else ""
        raise ConfigError(
            f"{path} holds no enginefarm generation parameters{other}",
            hint="give a PNG written by `enginefarm generate`",
        )
    try:
        record = json.loads(text[KEY])
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: its enginefarm parameters are damaged ({exc})", hint="give another PNG") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{path}: its enginefarm parameters are not a record", hint="give another PNG")
    return record
