"""`enginefarm export`: a diffusers folder → ONNX files, checkpoints, assets and a recipe (the `export` extra)."""

from __future__ import annotations

from pathlib import Path

import click

from enginefarm.errors import ConfigError

_PATH = click.Path(path_type=Path)


def _triple(name: str, raw: str | None) -> tuple[int, int, int] | None:
    if raw is None:
        return None
    try:
        values = tuple(int(v) for v in raw.split(","))
    except ValueError:
        values = ()
    if len(values) != 3 or not 0 < values[0] <= values[1] <= values[2]:
        raise ConfigError(f"{name} {raw!r} is not MIN,OPT,MAX", hint=f"e.g. {name} 1,2,4 (positive, min <= opt <= max)")
    return values


def _items(raw: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in raw.split(",") if item.strip())


def _bytes(raw: str) -> int:
    from enginefarm.settings import parse_size

    return 0 if raw.strip() == "0" else parse_size("--external-data-above", raw) or 0


@click.command("export")
@click.argument("source", type=_PATH)
@click.option(
    "--out", required=True, type=_PATH, help="The folder to write (must be new or empty, unless --overwrite)."
)
@click.option("--name", help="The model name in the recipe (default: SOURCE's folder name).")
@click.option(
    "--base",
    type=_PATH,
    help="With a single-file SOURCE: the base model's diffusers folder (configs, tokenizers, scheduler).",
)
@click.option(
    "--controlnet",
    type=_PATH,
    help="A ControlNet folder to export with the pipeline, as one model of its ControlNet family.",
)
@click.option(
    "--targets", default="openvino:cpu,onnxruntime:cpu", show_default=True, metavar="T,…", help="The recipe's targets."
)
@click.option("--precisions", default="fp32,fp16", show_default=True, metavar="P,…", help="The recipe's precisions.")
@click.option(
    "--batch",
    metavar="MIN,OPT,MAX",
    help="Batch range of the text encoders' and denoiser's profiles (default: the family's, 1,2,2: one "
    "image with guidance). The VAE stays at batch 1: it runs an image at a time.",
)
@click.option(
    "--latent",
    metavar="MIN,OPT,MAX",
    help="Latent size range of the profiles, image pixels / 8 (default: the family's).",
)
@click.option(
    "--text-length",
    metavar="MIN,OPT,MAX",
    help="T5 token range of the profiles (SD3, Flux, Chroma; default 16,<family's>,512): OPT is the pipeline's "
    "default max_sequence_length.",
)
@click.option(
    "--external-data-above",
    default="2G",
    show_default=True,
    metavar="SIZE",
    help="Write weights to <component>.onnx.data above this size (protobuf cannot hold 2 GiB in one file).",
)
@click.option(
    "--memory",
    metavar="SIZE",
    help="Memory the export may use, e.g. 16G (default: the machine's total). It needs about twice its largest "
    "component's weights at fp32, and refuses before loading anything when that is more.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace --out if it holds something (only once the new export passed its checks).",
)
def export_cmd(
    source,
    out,
    name,
    base,
    controlnet,
    targets,
    precisions,
    batch,
    latent,
    text_length,
    external_data_above,
    memory,
    overwrite,
):
    """Export the diffusers pipeline folder SOURCE (model_index.json) to ONNX, one file per component, each checked
    against torch on ONNX Runtime at two shapes, with its checkpoint (safetensors, diffusers names), the assets a
    runtime needs (tokenizers, scheduler, configs) and recipe.toml, which `enginefarm build` builds.

    SOURCE may also be a standalone ControlNet folder (config.json): only `controlnet` is exported then; or a
    single-file checkpoint (SD 1.x/2.x original layout, SDXL SGM layout) or VAE file, over --base DIR.

    A filter's file or folder (an upscaler's .pth, a TAESD folder; see docs/filters.md) is exported as a filter:
    its ONNX parts, assets/filter.json and recipe.toml (--name, --targets, --precisions, --overwrite apply)."""
    from enginefarm.cli_console import RichProgress, console
    from enginefarm.export import export_model
    from enginefarm.export.filters.run import is_filter_source
    from enginefarm.settings import parse_size

    if is_filter_source(source, base=base, controlnet=controlnet):
        diffusion_only = {"--batch": batch, "--latent": latent, "--text-length": text_length, "--memory": memory}
        given = [option for option, value in diffusion_only.items() if value is not None]
        if given:
            raise ConfigError(
                f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for diffusion models; {source} is exported "
                "as a filter",
                hint="a filter's profile is in the recipe it writes: edit it there",
            )
        _export_filter(source, out, name, _items(targets), _items(precisions), overwrite)
        return
    with RichProgress() as progress:
        result = export_model(
            source,
            out,
            name,
            progress,
            controlnet=controlnet,
            targets=_items(targets),
            precisions=_items(precisions),
            batch=_triple("--batch", batch),
            latent=_triple("--latent", latent),
            text_length=_triple("--text-length", text_length),
            external_data_above=_bytes(external_data_above),
            overwrite=overwrite,
            base=base,
            memory=parse_size("--memory", memory) if memory else None,
        )
    from rich.table import Table

    table = Table(title=f"{result.name}: {result.family.id} ({result.family.title}), {result.seconds:.1f} s")
    for column in ("component", "ONNX", "MB", "seconds", "max deviation from torch"):
        table.add_column(column)
    for c in result.components:
        table.add_row(
            c.name,
            c.onnx.name + (" + .data" if c.external_data else ""),
            f"{c.size / 1e6:.1f}",
            f"{c.seconds:.1f}",
            f"{max(c.deviations.values()):.1e}",
        )
    console().print(table)
    click.echo(f"wrote {result.out}; build it with: enginefarm build {result.recipe}")


def _export_filter(source: Path, out: Path, name, targets, precisions, overwrite: bool) -> None:
    from enginefarm.cli_console import RichProgress, console
    from enginefarm.export.filters.run import export_filter

    with RichProgress() as progress:
        result = export_filter(
            source, out, name, targets=targets, precisions=precisions, overwrite=overwrite, progress=progress
        )
    from rich.table import Table

    kind = result.kind.replace("_", " ")
    table = Table(title=f"{result.name}: {result.architecture} ({kind}), {result.seconds:.1f} s")
    for column in ("part", "ONNX", "MB", "seconds", "max deviation from torch"):
        table.add_column(column)
    for part in result.parts:
        deviation = max(part.deviations.values())
        table.add_row(part.name, part.onnx.name, f"{part.size / 1e6:.1f}", f"{part.seconds:.1f}", f"{deviation:.1e}")
    console().print(table)
    click.echo(f"wrote {result.out}; build it with: enginefarm build {result.recipe}")


COMMANDS = (export_cmd,)
