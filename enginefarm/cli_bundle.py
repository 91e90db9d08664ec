"""`enginefarm bundle`: write the smallest folder an app needs to load and run one target's artifacts, and prove it."""

from __future__ import annotations

from pathlib import Path

import click

from enginefarm.cli_options import precision_option, store_option


@click.command("bundle")
@click.option(
    "--target",
    required=True,
    metavar="BACKEND:DEVICE",
    help="The target whose artifacts the app runs (openvino:cpu, onnxruntime:cpu, ...).",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(path_type=Path),
    metavar="DIR",
    help="The bundle folder (new, empty, or an earlier bundle).",
)
@click.option(
    "--model",
    metavar="MODEL/COMPONENT",
    help="Prove with this artifact from the store (default: a built-in network built here).",
)
@store_option()
@precision_option(repeatable=False)
@click.option("--no-proof", is_flag=True, help="Write the bundle without running anything from it.")
def bundle_cmd(target, out, model, store, precision, no_proof):
    """Copy into DIR what an app needs to run TARGET's artifacts, and prove it.

    DIR holds enginefarm's runtime modules, numpy, zstandard (C backend), platformdirs, psutil and the vendor runtime
    trimmed to the device class; bundle.json lists every file. The app puts DIR on sys.path. The proof runs an artifact
    from DIR in a fresh `python -I -S` (sys.path: DIR and the standard library) and compares it with ONNX Runtime
    here: --model from --store, or a built-in network built here (needs the build extra)."""
    from enginefarm.bundle import write_bundle
    from enginefarm.bundle_proof import prove

    if store is not None and model is None:
        raise click.UsageError("--store is for --model: give both, or neither to prove with the built-in network")
    bundle = write_bundle(target, out)
    parts = {p.part: [] for p in bundle.parts}
    for p in bundle.parts:
        parts[p.part].append(f"{p.name} {p.version}")
    click.echo(f"bundled {bundle.target} into {bundle.folder}: {bundle.size / 1e6:.1f} MB")
    for part, size in bundle.size_by_part().items():
        click.echo(f"  {part:<15} {size / 1e6:7.1f} MB  {', '.join(parts.get(part, []))}")
    if bundle.notes:
        click.echo(f"  needs from the system: {bundle.notes}")
    if no_proof:
        click.echo("proof: skipped (--no-proof)")
        return
    proof = prove(bundle.folder, bundle.target, model=model, store=store, precision=precision)
    click.echo(f"proof ({proof.seconds:.1f} s): {proof.line}")


COMMANDS = [bundle_cmd]
