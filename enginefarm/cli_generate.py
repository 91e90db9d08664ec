"""`enginefarm generate`: one image from a built model, through `enginefarm.diffusion.Pipeline`, with a progress bar
per denoising step and the time of each stage."""

from __future__ import annotations

from pathlib import Path

import click

from enginefarm.cli_console import RichProgress, console
from enginefarm.cli_options import precision_option, store_option


@click.command("generate")
@click.argument("model")
@click.argument("prompt")
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
@store_option()
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("image.png"), show_default=True)
def generate_cmd(
    model,
    prompt,
    assets,
    version,
    negative_prompt,
    steps,
    guidance_scale,
    seed,
    width,
    height,
    scheduler,
    init_image,
    strength,
    control_image,
    controlnet_scale,
    precision,
    target,
    device,
    memory_budget,
    store,
    out,
):
    """Generate an image of PROMPT with MODEL (built by `enginefarm build` from the recipe `enginefarm export`
    wrote)."""
    from enginefarm.diffusion import Pipeline, read_png, write_png
    from enginefarm.diffusion.budget import parse_budget

    parse_budget(memory_budget, "--memory-budget")  # a mistake is told before anything is fetched

    image = read_png(init_image) if init_image else None
    control = read_png(control_image) if control_image else None
    with RichProgress() as progress:
        pipe = Pipeline.load(
            model,
            store=store,
            precision=precision,
            target=target,
            device=device,
            assets=assets,
            version=version,
            controlnet=control is not None,
            progress=progress,
            memory_budget=memory_budget,
        )
        result = pipe(
            prompt,
            negative_prompt,
            steps=steps,
            guidance_scale=guidance_scale,
            width=width,
            height=height,
            seed=seed,
            scheduler=scheduler,
            image=image,
            strength=strength,
            control_image=control,
            controlnet_conditioning_scale=controlnet_scale,
            on_step=lambda done, total: progress.work("denoising", done, total),
        )
    write_png(out, result)
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
