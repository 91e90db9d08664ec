"""The options that more than one `enginefarm` command takes, each written once, so an option reads the same
wherever it appears. Each is a function returning click's decorator; where a command takes one value instead of
several (`run --target T` against `build --target T --target U`), `repeatable=False` says so."""

from __future__ import annotations

from pathlib import Path

import click

from enginefarm.cache import precision_table

_PATH = click.Path(path_type=Path)


def _repeatable(name: str, dest: str, help: str, repeatable: bool, **kwargs):
    """An option given once (into `dest`) or, if `repeatable`, any number of times (into `dest` + "s")."""
    return click.option(
        name,
        f"{dest}s" if repeatable else dest,
        multiple=repeatable,
        help=f"{help} Repeatable." if repeatable else help,
        **kwargs,
    )


def store_option(*, required: bool = False):
    where = "Store: a directory, file://, s3:// or https://"
    return click.option(
        "--store",
        metavar="URL",
        required=required,
        help=f"{where}." if required else f"{where} (default ENGINEFARM_STORE).",
    )


def target_option(*, repeatable: bool = True):
    return _repeatable("--target", "target", "Only this target (backend:device or backend).", repeatable, metavar="T")


def precision_option(*, repeatable: bool = True):
    help = "Only this precision." if repeatable else "Only this precision (default: the fastest measured)."
    return _repeatable("--precision", "precision", help, repeatable, type=click.Choice(precision_table.NAMES))


def component_option():
    return _repeatable("--component", "component", "Only this component.", True, metavar="NAME")


def model_option(*, repeatable: bool = False):
    return _repeatable("--model", "model", "Only this model.", repeatable, metavar="NAME")


def key_option():
    return _repeatable("--key", "key", "Only this build key (or its prefix).", True, metavar="KEY")


def json_option():
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def report_option():
    return click.option("--report", type=_PATH, help="Write the results as JSON here.")


def jobs_parallel_option():
    return click.option(
        "-j",
        "--jobs-parallel",
        "parallel",
        type=click.IntRange(1, 64),
        default=1,
        show_default=True,
        help="Jobs run at once, each in its own process.",
    )


def runners_option():
    return click.option(
        "--runners", type=_PATH, help="The farm's runners (TOML): which runner builds each job, and why none can."
    )


def recipe_option(help: str, *, repeatable: bool = False):
    """--recipe: what the recipe is for differs (compile from it, expect its jobs), so the command says it in `help`."""
    return _repeatable("--recipe", "recipe", help, repeatable, type=_PATH)


def keep_versions_option():
    return click.option(
        "--keep-versions",
        type=click.IntRange(min=1),
        metavar="N",
        help="Remove every model version but the N newest of each component.",
    )


def explain_option():
    return click.option("--explain", is_flag=True, help="Print why this artifact was chosen.")


def channel_option(*, release: bool = False):
    """--channel: the channel a release command manages (default stable), or the one `run` and `fetch` load from."""
    if release:
        return click.option(
            "--channel", default="stable", show_default=True, metavar="NAME", help="The release channel."
        )
    return click.option(
        "--channel", metavar="NAME", help="Only artifacts released in this signed channel (default ENGINEFARM_CHANNEL)."
    )


def keys_option():
    """The folder of private keys that `release` commands sign with."""
    return click.option(
        "--keys",
        "keys_dir",
        required=True,
        type=click.Path(file_okay=False, path_type=Path),
        help="Folder of private key files (0600). Only the keys of the roles being signed need be there.",
    )


def load_options():
    """How `run` and `fetch` pick the artifact to load."""
    return stacked(
        precision_option(repeatable=False),
        click.option("--device", default="auto", show_default=True, help="auto, cpu, nvidia, intel, amd or apple."),
        target_option(repeatable=False),
        store_option(),
        channel_option(),
        click.option("--trusted-root", type=_PATH, help="The channel's root.json (default ENGINEFARM_TRUSTED_ROOT)."),
        click.option(
            "--version",
            "model_version",
            metavar="V",
            help="Serve this model version (default: the newest with an artifact usable here).",
        ),
    )


def stacked(*options):
    """One decorator applying `options` in the order listed (as if written one above the other)."""

    def apply(func):
        for option in reversed(options):
            func = option(func)
        return func

    return apply


def open_store_to_read(store: str | None, settings):
    """The store a read-only command looks at. A local path that does not exist yet is an empty store, said in one
    line (a typo shows there too), and nothing is created: only `build` and `publish` create a store."""
    from enginefarm.cache.stores import missing_local_root, open_store

    opened = open_store(store or settings.store)
    missing = missing_local_root(opened)
    if missing is not None:
        click.echo(f"note: no store at {missing} yet: it is empty (`enginefarm build RECIPE` creates it)", err=True)
    return opened
