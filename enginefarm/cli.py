"""The `enginefarm` command: the `main` group, its logging and error handling, and the commands it is made of.

Each command group lives in its own module (cli_build, cli_store, cli_run, cli_export, cli_generate, cli_cache,
cli_release), with the options they share in cli_options. Commands are thin: parse options, call the library, draw
results. User errors print one line."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from enginefarm import cli_build, cli_bundle, cli_catalog, cli_export, cli_generate, cli_run, cli_store
from enginefarm.cli_cache import cache_group
from enginefarm.cli_console import console
from enginefarm.cli_release import release_group
from enginefarm.errors import EnginefarmError, missing_extra


def _setup_logging(verbose: int) -> None:
    from rich.logging import RichHandler

    handler = RichHandler(console=console(stderr=True), show_path=False, show_time=False)
    logging.basicConfig(level=_level(verbose), handlers=[handler], format="%(message)s")


def _level(verbose: int) -> int:
    return logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG


def _more_verbose(ctx: click.Context, param: click.Parameter, count: int) -> None:
    """`enginefarm build -v`: the subcommand's -v adds to the group's (`enginefarm -v build -v` is -vv)."""
    if count:
        logging.getLogger().setLevel(_level(ctx.find_root().params.get("verbose", 0) + count))


def _verbose_everywhere(group: click.Group) -> None:
    """Every command takes -v after its name too, where users type it, not only before it."""
    for command in group.commands.values():
        command.params.append(
            click.Option(
                ["-v", "--verbose"],
                count=True,
                expose_value=False,
                callback=_more_verbose,
                help="More log output (-vv for debug).",
            )  # fmt: skip
        )
        if isinstance(command, click.Group):
            _verbose_everywhere(command)


class _Group(click.Group):
    """Turns every EnginefarmError into `error: … / hint: …` and exit 1; other exceptions are bugs and keep their
    traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except EnginefarmError as exc:
            _fail(exc)
        except ModuleNotFoundError as exc:  # an optional dependency: name the extra that brings it
            known = missing_extra(exc)
            if known is None:
                raise
            _fail(known)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        except OSError as exc:  # a full disk wherever it struck: the user's problem to fix, not a bug to trace
            from enginefarm.cache.space import disk_full, is_full

            if not is_full(exc):
                raise
            full = disk_full(
                Path(exc.filename).parent if exc.filename and Path(str(exc.filename)).is_absolute() else Path.cwd(),
                None,
            )
            click.echo(f"error: {full}", err=True)
            click.echo(f"hint: {full.hint}", err=True)
            sys.exit(1)


def _fail(exc: EnginefarmError) -> None:
    click.echo(f"error: {exc}", err=True)
    if exc.hint:
        click.echo(f"hint: {exc.hint}", err=True)
    sys.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.version_option(package_name="enginefarm")
def main(verbose: int) -> None:
    """Ahead-of-time engines for SD-class models: plan, build and publish them; fetch, verify and run them."""
    _setup_logging(verbose)
    import signal

    # SIGTERM (CI cancelling a job, `kill`) unwinds like Ctrl-C, so worker processes and temp files are cleaned up.
    # SIGINT gets Python's handler even where the launching shell ignored it (background jobs in scripts).
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


for command in (
    *cli_build.COMMANDS,
    *cli_catalog.COMMANDS,
    *cli_store.COMMANDS,
    *cli_run.COMMANDS,
    *cli_bundle.COMMANDS,
    *cli_export.COMMANDS,
    *cli_generate.COMMANDS,
    cache_group,
    release_group,
):
    main.add_command(command)
_verbose_everywhere(main)

if __name__ == "__main__":
    main()
