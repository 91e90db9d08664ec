"""`enginefarm run`, `fetch` and `doctor`: the device's side, loading and running the artifact that fits it."""

from __future__ import annotations

from pathlib import Path

import click

from enginefarm.cli_console import RichProgress, console
from enginefarm.cli_options import explain_option, load_options, recipe_option
from enginefarm.errors import ConfigError
from enginefarm.settings import load_settings


@click.command("run")
@click.argument("ref", metavar="MODEL/COMPONENT")
@click.option(
    "--input",
    "inputs",
    multiple=True,
    metavar="NAME=FILE.npy",
    help="An input array. Repeatable. A .npz gives all inputs at once.",
)
@click.option("--output", type=click.Path(path_type=Path, dir_okay=False), help="Write all outputs to this .npz.")
@recipe_option("Compile here from this recipe if nothing stored fits.")
@explain_option()
@click.option(
    "--weights",
    type=click.Path(path_type=Path),
    help="A custom checkpoint (.safetensors) in the base checkpoint's names.",
)
@click.option(
    "--lora",
    "loras",
    multiple=True,
    metavar="PATH[:STRENGTH]",
    help="A LoRA (.safetensors) and its strength (default 1). Repeatable.",
)
@load_options()
def run_cmd(
    ref,
    inputs,
    output,
    recipe,
    explain,
    weights,
    loras,
    precision,
    device,
    target,
    store,
    channel,
    trusted_root,
    model_version,
):
    """Run MODEL/COMPONENT on the best artifact for this device."""
    import time

    import numpy as np

    from enginefarm.runner.load import load
    from enginefarm.runner.request import Request

    request = Request(
        ref,
        precision,
        device,
        store,
        target,
        model_version,
        weights,
        [_lora_option(item) for item in loras],
        recipe=recipe,
        channel=channel,
        trusted_root=trusted_root,
    )
    feeds = _read_inputs(inputs)
    start = time.perf_counter()
    with RichProgress() as progress:
        session = load(request, progress=progress)
    loaded = time.perf_counter()
    outputs = session.run(feeds)
    done = time.perf_counter()
    if explain:
        click.echo(session.explain())
    for name, value in outputs.items():
        click.echo(
            f"{name}: {value.dtype}{list(value.shape)} mean {float(np.mean(value)):.5g} std {float(np.std(value)):.5g}"
        )
    click.echo(
        f"{session.artifact.target} {session.artifact.precision} [{session.artifact.build_key[:12]}]: load "
        f"{1000 * (loaded - start):.0f} ms, run {1000 * (done - loaded):.0f} ms"
    )
    if output:
        from enginefarm.cache.atomic import atomic_writer

        with atomic_writer(output) as handle:
            np.savez(handle, **outputs)
        click.echo(f"wrote {output}")


def _lora_option(item: str) -> tuple[str, float]:
    """PATH:STRENGTH, or PATH alone for strength 1 (a path may itself hold ':', so only a number after the last
    counts)."""
    path, sep, strength = item.rpartition(":")
    try:
        return (path, float(strength)) if sep and path else (item, 1.0)
    except ValueError:
        if sep and path and not Path(item).exists():  # a typo in the strength, not a path with ':' in it
            raise ConfigError(
                f"--lora {item}: strength {strength!r} is not a number",
                hint="--lora PATH[:STRENGTH], e.g. --lora style.safetensors:0.8",
            ) from None
        return item, 1.0


def _read_inputs(items: tuple[str, ...]) -> dict:
    import numpy as np

    feeds = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            path, name = name, ""
        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"input file not found: {file}")
        if file.suffix != ".npz" and not name:
            raise ConfigError(f"--input {item}: give NAME=FILE.npy", hint="only .npz files carry their own names")
        try:
            if file.suffix == ".npz":
                with np.load(file) as data:
                    feeds.update({k: data[k] for k in data.files})
            else:
                feeds[name] = np.load(file, allow_pickle=False)
        except (ValueError, OSError):
            raise ConfigError(
                f"cannot read {file}: not a numpy .npy/.npz file", hint="save arrays with numpy.save or numpy.savez"
            ) from None
    if not feeds:
        raise ConfigError("no inputs given", hint="--input NAME=FILE.npy (repeat per input) or --input FILE.npz")
    return feeds


@click.command("fetch")
@click.argument("ref", metavar="MODEL/COMPONENT")
@explain_option()
@load_options()
def fetch_cmd(ref, explain, precision, device, target, store, channel, trusted_root, model_version):
    """Fetch and verify the artifact `run` would use, into the local cache (for offline use later)."""
    from enginefarm.runner.load import fetch
    from enginefarm.runner.request import Request

    request = Request(ref, precision, device, store, target, model_version, channel=channel, trusted_root=trusted_root)
    with RichProgress() as progress:
        manifest, path, why = fetch(request, progress=progress)
    if explain:
        click.echo(why)
    click.echo(f"{manifest.ref} {manifest.target} {manifest.precision} [{manifest.build_key[:12]}] → {path}")


@click.command("doctor")
def doctor_cmd():
    """Show every device probe and every backend, with the reason when something is missing."""
    from rich.markup import escape
    from rich.table import Table

    from enginefarm.backends import all_backends, availability
    from enginefarm.cache.manifest import Target
    from enginefarm.runner.detect import run_probes

    settings = load_settings()
    out = console()
    devices = Table(title="devices")
    for column in ("probe", "found", "class", "targets"):
        devices.add_column(column)
    for probe in run_probes():
        if not probe.devices:
            devices.add_row(probe.name, f"[dim]{escape(probe.reason or '')}[/]", "", "")
        for d in probe.devices:
            devices.add_row(probe.name, d.name, d.bench_class, ", ".join(d.targets))
    out.print(devices)
    backends = Table(title="backends")
    for column in ("backend", "versions", "status"):
        backends.add_column(column)
    for backend in all_backends():
        avail = availability(Target(backend.name, backend.example_device))
        try:
            versions = ", ".join(f"{k} {v}" for k, v in backend.versions().items())
        except Exception:
            versions = "-"
        hint = "" if backend.install in (avail.reason or "") else f" ({backend.install})"
        status = (
            "[green]build + load[/]"
            if avail.can_build and avail.can_load
            else f"[dim]unavailable: {escape((avail.reason or '') + hint)}[/]"
        )
        if avail.can_build and not avail.can_load:  # TensorRT-RTX builds on a CPU and runs elsewhere
            status = f"[yellow]build only[/]: {escape(avail.reason or '')}"
        backends.add_row(backend.name, versions, status)
    out.print(backends)
    out.print(f"store: {settings.store}\ncache: {settings.home}{'  (offline)' if settings.offline else ''}")


COMMANDS = (run_cmd, fetch_cmd, doctor_cmd)
