"""`enginefarm generate`: one image from a built model, through `enginefarm.diffusion.Pipeline`, with a progress bar
per denoising step and the time of each stage."""

from __future__ import annotations

from pathlib import Path

import click

from enginefarm.cli_console import RichProgress, console
from enginefarm.cli_options import precision_option, store_option


@click.command("generate")
@click.argument("model", required=False)
@click.argument("prompt", required=False)
@click.option(
    "--assets",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Read the model's assets (tokenizers, configs) from this folder instead of the store.",
)
@click.option("--version", default=None, help="The model version (default: the newest).")
@click.option(
    "--negative",
    "negative_prompt",
    default=None,
    help="Negative prompt (default: none; SDXL then uses zeros, as diffusers).",
)
@click.option(
    "--steps",
    default=None,
    type=click.IntRange(1, 1000),
    help="Denoising steps (default: the family's, 25; Flux schnell 4).",
)
@click.option(
    "--guidance",
    "guidance_scale",
    type=float,
    default=None,
    help="Classifier-free guidance scale (default 7.5; SDXL 5).",
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--width", type=int, default=None, help="Image width in pixels (default: the model's native size).")
@click.option("--height", type=int, default=None, help="Image height in pixels (default: the model's native size).")
@click.option(
    "--scheduler",
    default=None,
    metavar="NAME",
    help="A diffusers scheduler class or Easy Diffusion's name for it: ddim, plms, euler, euler_a, heun, dpm2, "
    "dpm2_a, lms, dpmpp_2m, dpmpp_2m_sde, dpmpp_2s_a, dpmpp_sde, dpm_solver_stability, ddpm, deis, unipc, unipc_tu, "
    "unipc_tu_2, lcm (*_karras: Karras sigmas; default: the model's own).",
)
@click.option(
    "--image",
    "init_image",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A PNG to start from (image to image).",
)
@click.option(
    "--strength",
    type=click.FloatRange(0.0, 1.0),
    default=None,
    help="How much of --image to redraw (default 0.8; with --mask 1, SDXL 0.9999).",
)
@click.option(
    "--mask",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Inpainting: a PNG the size of --image, white where to repaint, black where to keep.",
)
@click.option(
    "--control-image",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A PNG conditioning the ControlNet (the model must be exported with one).",
)
@click.option("--controlnet-scale", type=float, default=1.0, show_default=True)
@click.option(
    "--control-from",
    default=None,
    metavar="canny|shuffle|NAME",
    help="Make the control image from --control-image as a photo: canny (edges) or shuffle (content shuffle, by "
    "--seed), in numpy, or a preprocessor filter in the store (e.g. a depth model); soft edges take modes, "
    "NAME:safe, NAME:scribble, or Easy Diffusion's names (softedge_pidsafe, scribble_hed… for the filters pidinet, "
    "hed). The image takes the photo's size unless --width/--height are given.",
)
@click.option(
    "--safety",
    default=None,
    metavar="NAME",
    help="Check each image with this safety checker filter first; see --on-flagged for what a flagged image becomes.",
)
@click.option(
    "--on-flagged",
    type=click.Choice(["blur", "black", "refuse"]),
    default="blur",
    show_default=True,
    help="A flagged image: blurred (Easy Diffusion), black (diffusers) or not written; it gets no face fix or upscale.",
)
@click.option("--face-fix", default=None, metavar="NAME", help="Restore faces with this face restoration filter.")
@click.option(
    "--face-strength",
    type=click.FloatRange(0.0, 1.0),
    default=1.0,
    show_default=True,
    help="How much of the restored faces to blend in (1: all of it, as Easy Diffusion's GFPGAN).",
)
@click.option("--upscale", default=None, metavar="NAME", help="Enlarge each image with this upscaler filter, last.")
@click.option(
    "--upscale-by",
    type=click.FloatRange(0.0, 16.0, min_open=True),
    default=None,
    metavar="F",
    help="The final size as a factor (2 with an x4 model, as Easy Diffusion's 'upscale by'; default: the model's).",
)
@precision_option(repeatable=False)
@click.option(
    "--target", default=None, metavar="BACKEND:DEVICE", help="Use only artifacts of this target, e.g. openvino:cpu."
)
@click.option("--device", default="auto", show_default=True)
@click.option(
    "--memory-budget",
    default=None,
    metavar="SIZE|auto",
    help="Keep the loaded components within SIZE (e.g. 12G) or 'auto' (90% of what is available): each is loaded "
    "when a stage needs it and closed when the next would not fit. The image is the same; default: all loaded.",
)
@click.option(
    "--lora",
    "loras",
    multiple=True,
    metavar="FILE[:STRENGTH]",
    help="A LoRA as model sites ship it (.safetensors), at STRENGTH (default 1). Repeatable.",
)
@click.option(
    "--weights",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A whole-model checkpoint or a UNet file (a fine-tune) applied to the built engines, no rebuild.",
)
@click.option(
    "--vae",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A VAE file (diffusers or the original layout) in place of the model's own.",
)
@click.option(
    "--embedding",
    "embeddings",
    multiple=True,
    metavar="FILE[:WORD]",
    help="A textual-inversion file; the prompt names it by WORD (default: the file's stem). Repeatable.",
)
@click.option(
    "--num-images",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Images of the prompt in one call; image i is the one --seed SEED+i makes alone. Written as OUT-i.png.",
)
@click.option(
    "--prompt-syntax",
    type=click.Choice(["a1111", "compel", "none"]),
    default="a1111",
    show_default=True,
    help="How weights are written in the prompt: a1111 (word:1.3), compel word+ / (words)1.3, or none.",
)
@click.option(
    "--clip-skip",
    type=click.IntRange(0, 10),
    default=None,
    help="Skip the text encoder's last K layers (SD 1.x/2.x/XL).",
)
@click.option("--tiling", type=click.Choice(["x", "y", "xy"]), default=None, help="A seamless texture in these axes.")
@click.option(
    "--preview-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write a preview PNG of each step here (step-001.png, ...), as an app shows live previews.",
)
@click.option(
    "--preview",
    default=None,
    metavar="NAME",
    help="Make --preview-dir's previews with this preview decoder filter (TAESD-class; default: a linear map).",
)
@click.option(
    "--decoder",
    default=None,
    metavar="NAME",
    help="Decode the final images with this preview decoder filter instead of the model's VAE (quick drafts).",
)
@click.option(
    "--embeddings-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="A folder of textual-inversion files: each is loaded when the prompt names its file's stem.",
)
@click.option(
    "--again",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    metavar="PNG",
    help="Make an image written by `enginefarm generate` again: its stored parameters are the defaults of every "
    "option not given (MODEL and PROMPT too).",
)
@store_option()
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("image.png"), show_default=True)
@click.pass_context
def generate_cmd(ctx, model, prompt, **opts):
    """Generate an image of PROMPT with MODEL (built by `enginefarm build` from the recipe `enginefarm export`
    wrote). The PNG holds the parameters it was made with (`--again` reads them)."""
    from enginefarm.diffusion import Pipeline, read_png, write_png
    from enginefarm.diffusion.budget import parse_budget
    from enginefarm.diffusion.metadata import png_text

    from .cli_generate_args import (
        again_defaults,
        check_filters,
        control_image,
        embedding_specs,
        lora_specs,
        read_mask,
        run_filters,
        write_previews,
    )

    if opts["again"] is not None:
        model, prompt, opts = again_defaults(ctx, opts["again"], model, prompt, opts)
    if model is None or prompt is None:
        raise click.UsageError("give MODEL and PROMPT (or --again PNG)")
    parse_budget(opts["memory_budget"], "--memory-budget")  # a mistake is told before anything is fetched
    check_filters(opts)  # a filter missing from the store is told before anything is generated
    loras = lora_specs(opts["loras"])
    embeddings = embedding_specs(opts["embeddings"])

    out = opts["out"]
    image = read_png(opts["init_image"]) if opts["init_image"] else None
    mask = read_mask(opts["mask"], opts["init_image"]) if opts["mask"] else None
    if opts["preview_dir"] is not None:
        opts["preview_dir"].mkdir(parents=True, exist_ok=True)
    with RichProgress() as progress:
        control = control_image(opts, progress)
        pipe = Pipeline.load(
            model,
            store=opts["store"],
            precision=opts["precision"],
            target=opts["target"],
            device=opts["device"],
            assets=opts["assets"],
            version=opts["version"],
            controlnet=control is not None,
            progress=progress,
            memory_budget=opts["memory_budget"],
            weights=opts["weights"],
            vae=opts["vae"],
            loras=loras,
            embeddings=embeddings,
            embeddings_dir=opts["embeddings_dir"],
            preview=opts["preview"],
            decoder=opts["decoder"],
        )
        call = dict(
            steps=opts["steps"],
            guidance_scale=opts["guidance_scale"],
            width=opts["width"],
            height=opts["height"],
            seed=opts["seed"],
            scheduler=opts["scheduler"],
            prompt_syntax=opts["prompt_syntax"],
            clip_skip=opts["clip_skip"],
            tiling=opts["tiling"],
        )
        if image is not None and opts["strength"] is not None:
            call["strength"] = opts["strength"]
        scale = 1 if pipe.preview_decoder is not None else pipe.vae_scale_factor  # a TAESD preview is full size
        previews = write_previews(opts["preview_dir"], scale) if opts["preview_dir"] else None
        result = pipe(
            prompt,
            opts["negative_prompt"],
            image=image,
            mask_image=mask,
            num_images_per_prompt=opts["num_images"],
            on_preview=previews,
            control_image=control,
            controlnet_conditioning_scale=opts["controlnet_scale"],
            on_step=lambda done, total: progress.work("denoising", done, total),
            **call,
        )
        generated = result if result.ndim == 4 else result[None]
        images, flagged_notes = run_filters(opts, generated, progress)
    record = {
        "model": model,
        "version": opts["version"],
        "prompt": prompt,
        "negative_prompt": opts["negative_prompt"],
        **call,
        **pipe.last_settings,  # the defaults the call resolved (steps, guidance, scheduler, size)
        "precision": opts["precision"],
        "loras": [[str(f), s] for f, s in loras],
        "embeddings": [str(e) if isinstance(e, Path) else [str(e[0]), e[1]] for e in embeddings],
        "weights": str(opts["weights"]) if opts["weights"] else None,
        "vae": str(opts["vae"]) if opts["vae"] else None,
        "target": opts["target"],
        **{key: opts[key] for key in ("control_from", "safety", "face_fix", "upscale", "upscale_by", "decoder")},
    }
    paths = [out] if len(images) == 1 else [out.with_name(f"{out.stem}-{i}{out.suffix}") for i in range(len(images))]
    for i, (path, one) in enumerate(zip(paths, images, strict=True)):
        if one is None:  # refused by --on-flagged refuse
            continue
        own = {**record, "seed": record["seed"] + i}  # image i is the one-image call with seed + i
        write_png(path, one, png_text({k: v for k, v in own.items() if _recorded(k, v)}))
    result = next((one for one in images if one is not None), generated[0])
    written = [path for path, one in zip(paths, images, strict=True) if one is not None] or paths
    out = written[0] if len(written) == 1 else f"{written[0]} … {written[-1].name}"
    shown = console()
    for note in flagged_notes:
        shown.print(f"note: {note}", highlight=False, markup=False)
    if all(one is None for one in images):
        shown.print("no image written: every image was flagged (--on-flagged refuse)", highlight=False, markup=False)
        ctx.exit(1)
    times = pipe.timings
    loads = sum(v for k, v in times.items() if k.startswith("load "))
    per_step = times["denoise"] / max(times["steps"], 1)
    shown.print(
        f"wrote {out} ({result.shape[1]}×{result.shape[0]}): load {loads:.2f} s, text {times['text']:.2f} s, "
        f"{times['steps']} steps {times['denoise']:.2f} s ({per_step * 1000:.0f} ms/step), decode "
        f"{times.get('decode', 0):.2f} s",
        highlight=False,
        markup=False,
    )
    if pipe.residency is not None:
        residency = pipe.residency
        shown.print(
            f"memory budget {residency.budget / 1e9:.1f} GB: {residency.loads} loads", highlight=False, markup=False
        )
        held = residency.measured()
        largest = max(held, key=lambda c: held[c], default=None)
        if largest is not None and held[largest] > residency.budget:  # closing others cannot help: say so
            shown.print(
                f"note: {largest} alone held {held[largest] / 1e9:.1f} GB while it ran, over the budget: no budget "
                "keeps a run below its largest stage (a smaller image or batch does)",
                highlight=False,
                markup=False,
            )
    for name, session in pipe.sessions.items():
        shown.print(
            f"  {name}: {session.artifact.target} {session.artifact.precision} [{session.artifact.build_key[:12]}]",
            highlight=False,
            markup=False,
        )


COMMANDS = (generate_cmd,)


def _recorded(key: str, value) -> bool:
    """What the PNG's record keeps: every setting given, except the default prompt syntax (a prompt that reads
    "a1111" is kept)."""
    if key == "prompt_syntax":
        return value != "a1111"
    return value is not None and value != []
