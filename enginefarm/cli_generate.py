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
    help="A diffusers scheduler class or an alias: ddim, euler, euler_a, dpmpp_2m, "
    "dpmpp_2m_karras, lcm (default: the model's own).",
)
@click.option(
    "--image",
    "init_image",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A PNG to start from (image to image).",
)
@click.option(
    "--strength", type=click.FloatRange(0.0, 1.0), default=0.8, show_default=True, help="How much of --image to redraw."
)
@click.option(
    "--control-image",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A PNG conditioning the ControlNet (the model must be exported with one).",
)
@click.option("--controlnet-scale", type=float, default=1.0, show_default=True)
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

    from .cli_generate_args import again_defaults, embedding_specs, lora_specs

    if opts["again"] is not None:
        model, prompt, opts = again_defaults(ctx, opts["again"], model, prompt, opts)
    if model is None or prompt is None:
        raise click.UsageError("give MODEL and PROMPT (or --again PNG)")
    parse_budget(opts["memory_budget"], "--memory-budget")  # a mistake is told before anything is fetched
    loras = lora_specs(opts["loras"])
    embeddings = embedding_specs(opts["embeddings"])

    out = opts["out"]
    image = read_png(opts["init_image"]) if opts["init_image"] else None
    control = read_png(opts["control_image"]) if opts["control_image"] else None
    with RichProgress() as progress:
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
        )
        call = dict(
            steps=opts["steps"],
            guidance_scale=opts["guidance_scale"],
            width=opts["width"],
            height=opts["height"],
            seed=opts["seed"],
            scheduler=opts["scheduler"],
        )
        if image is not None:
            call["strength"] = opts["strength"]
        result = pipe(
            prompt,
            opts["negative_prompt"],
            image=image,
            control_image=control,
            controlnet_conditioning_scale=opts["controlnet_scale"],
            on_step=lambda done, total: progress.work("denoising", done, total),
            **call,
        )
    record = {
        "model": model,
        "version": opts["version"],
        "prompt": prompt,
        "negative_prompt": opts["negative_prompt"],
        **call,
        "width": result.shape[1],
        "height": result.shape[0],
        "precision": opts["precision"],
        "loras": [[str(f), s] for f, s in loras],
        "embeddings": [str(e) if isinstance(e, Path) else [str(e[0]), e[1]] for e in embeddings],
        "weights": str(opts["weights"]) if opts["weights"] else None,
        "vae": str(opts["vae"]) if opts["vae"] else None,
        "engines": {name: session.artifact.build_key for name, session in pipe.sessions.items()},
    }
    write_png(out, result, png_text({k: v for k, v in record.items() if v not in (None, [])}))
    shown = console()
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
