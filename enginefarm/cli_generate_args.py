"""`enginefarm generate`'s values that need more than click's types: LoRA and embedding specs as a user types them,
and `--again`, which takes every option not given from the parameters stored in an earlier image."""

from __future__ import annotations

from pathlib import Path

import click
from click.core import ParameterSource

from enginefarm.errors import ConfigError


def _file_and_rest(spec: str, option: str, what: str) -> tuple[Path, str | None]:
    """`FILE` or `FILE:REST`; a path that itself holds a colon (C:\\loras\\x.safetensors) is taken whole when it
    exists."""
    if Path(spec).is_file():
        return Path(spec), None
    head, sep, rest = spec.rpartition(":")
    if sep and Path(head).is_file():
        return Path(head), rest
    raise ConfigError(
        f"{option} {spec}: no such file", hint=f"give {option} FILE or {option} FILE:{what} with an existing FILE"
    )


def lora_specs(specs: tuple[str, ...]) -> list[tuple[Path, float]]:
    """--lora FILE[:STRENGTH] → [(file, strength)], strength 1 when left out."""
    loras = []
    for spec in specs:
        path, rest = _file_and_rest(spec, "--lora", "STRENGTH")
        try:
            strength = 1.0 if rest is None else float(rest)
        except ValueError:
            raise ConfigError(
                f"--lora {spec}: {rest!r} is not a strength", hint="give --lora FILE:0.8 (a number; default 1)"
            ) from None
        loras.append((path, strength))
    return loras


def embedding_specs(specs: tuple[str, ...]) -> list[Path | tuple[Path, str]]:
    """--embedding FILE[:WORD] → what Pipeline.load's `embeddings` takes."""
    found: list[Path | tuple[Path, str]] = []
    for spec in specs:
        path, word = _file_and_rest(spec, "--embedding", "WORD")
        found.append(path if not word else (path, word))
    return found


def again_defaults(ctx: click.Context, png: Path, model, prompt, opts: dict) -> tuple[str | None, str | None, dict]:
    """MODEL, PROMPT and the options, each from the command line where given, else from `png`'s stored
    parameters (`enginefarm.diffusion.metadata`)."""
    from enginefarm.diffusion.metadata import read_parameters

    record = read_parameters(png)
    given = lambda name: ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)  # noqa: E731
    opts = dict(opts)
    for key in (
        "steps",
        "guidance_scale",
        "width",
        "height",
        "seed",
        "scheduler",
        "negative_prompt",
        "version",
        "strength",
        "safety",
        "face_fix",
        "upscale",
        "upscale_by",
        "decoder",
    ):
        if not given(key) and record.get(key) is not None:
            opts[key] = record[key]
    if not given("precision") and record.get("precision"):
        opts["precision"] = record["precision"]
    if not given("loras") and record.get("loras"):
        opts["loras"] = tuple(f"{f}:{s}" for f, s in record["loras"])
    if not given("embeddings") and record.get("embeddings"):
        opts["embeddings"] = tuple(e if isinstance(e, str) else f"{e[0]}:{e[1]}" for e in record["embeddings"])
    for key in ("weights", "vae"):
        if not given(key) and record.get(key):
            opts[key] = Path(record[key])
    return model or record.get("model"), prompt or record.get("prompt"), opts


def read_mask(path: Path, image: Path | None):
    """--mask PNG → float [H, W] in [0, 1] (its channels' mean: white repaints, black keeps)."""
    from enginefarm.diffusion import read_png

    if image is None:
        raise ConfigError("--mask needs the image it masks", hint="give --image PNG with --mask PNG")
    return read_png(path).mean(axis=-1)


def write_previews(folder: Path, scale: int):
    """An on_preview callback writing each step's preview as folder/step-NNN.png (-i for a batch's image i), at the
    image's size."""
    import numpy as np

    from enginefarm.diffusion import write_png

    def write(step: int, preview) -> None:
        batch = preview if preview.ndim == 4 else preview[None]
        for i, one in enumerate(batch):
            name = f"step-{step:03d}.png" if len(batch) == 1 else f"step-{step:03d}-{i}.png"
            write_png(folder / name, np.repeat(np.repeat(one, scale, axis=0), scale, axis=1))

    return write


def control_image(opts: dict, progress=None):
    """--control-image PNG as the control image; with --control-from canny|shuffle|NAME, the PNG is a photo made
    into one (numpy canny or content shuffle, by the run's seed; or the preprocessor NAME from the store). Without
    --width/--height the image takes the photo's size; with them, the photo is resized to it first."""
    from enginefarm.diffusion import read_png

    source = opts.get("control_from")
    if opts["control_image"] is None:
        if source:
            raise ConfigError("--control-from needs a photo", hint="give --control-image PHOTO.png --control-from NAME")
        return None
    image = read_png(opts["control_image"])
    if not source:
        return image
    from enginefarm.filters import control_from
    from enginefarm.filters.preprocess import resize

    height, width = image.shape[:2]
    size = (opts["height"] or height, opts["width"] or width)
    if size != (height, width):
        image = resize(image, size, "bicubic")
    opts["height"], opts["width"] = size
    return control_from(
        image,
        source,
        store=opts["store"],
        precision=opts["precision"],
        target=opts["target"],
        device=opts["device"],
        progress=progress,
        seed=opts.get("seed"),
    )


FILTER_OPTIONS = {  # opts key → (option, kind)
    "safety": ("--safety", "safety_checker"),
    "face_fix": ("--face-fix", "face_restorer"),
    "upscale": ("--upscale", "upscaler"),
}


def check_filters(opts: dict) -> None:
    """Each filter option names a filter of its kind in the store (one line if not), before anything is generated."""
    from enginefarm.filters.apply import find

    chosen = {key: (*FILTER_OPTIONS[key], opts[key]) for key in FILTER_OPTIONS if opts.get(key)}
    source = opts.get("control_from")
    if source and source not in ("canny", "shuffle"):
        from enginefarm.filters.softedge import control_source

        chosen["control_from"] = ("--control-from", "preprocessor", control_source(source)[0])
    for key in ("preview", "decoder"):
        if opts.get(key):
            chosen[key] = (f"--{key}", "preview_decoder", opts[key])
    if opts.get("preview") and opts.get("preview_dir") is None:
        raise ConfigError("--preview makes the previews --preview-dir writes", hint="give --preview-dir DIR too")
    for option, kind, name in chosen.values():
        find(name, kind, option, store=opts["store"], device=opts["device"])


def run_filters(opts: dict, images, progress=None) -> tuple[list, list[str]]:
    """--safety, --face-fix and --upscale on each generated image, in that order, each filter loaded once from the
    store: (the images, None where --on-flagged refuse dropped one; a note per flagged image)."""
    from contextlib import ExitStack

    from enginefarm.filters import apply
    from enginefarm.filters.apply import load_named

    chosen = {key: opts[key] for key in FILTER_OPTIONS if opts.get(key)}
    if not chosen:
        return list(images), []
    load = dict(store=opts["store"], precision=opts["precision"], target=opts["target"], device=opts["device"])
    results, notes = [], []
    with ExitStack() as stack:
        loaded = {}
        for key, name in chosen.items():
            loaded[key] = stack.enter_context(load_named(name, FILTER_OPTIONS[key][0], progress=progress, **load))
        for i, image in enumerate(images):
            done = apply(
                image,
                **loaded,
                on_flagged=opts["on_flagged"],
                face_strength=opts["face_strength"],
                upscale_by=opts["upscale_by"],
            )
            if done.flagged:
                what = "refused: not written" if done.image is None else f"{opts['on_flagged']} image written"
                notes.append(f"image {i} was flagged by the safety checker {opts['safety']} ({what})")
            results.append(done.image)
    return results, notes
