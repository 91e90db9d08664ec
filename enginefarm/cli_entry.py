"""The `enginefarm` console script. The command's own dependencies (click, rich and rich's pygments) come with the
`cli` extra, which an app that only loads artifacts leaves out; so this entry point imports them only to start the
command, and when they are missing it names the extra in one line instead of a traceback."""

from __future__ import annotations

import sys

CLI_MODULES = ("click", "rich", "pygments")  # what `pip install 'enginefarm[cli]'` brings, by top-level module


def main() -> None:
    try:
        import click  # noqa: F401
        import rich  # noqa: F401  (imported lazily by the commands; checked here so a missing one fails before any work)

        from enginefarm.cli import main as command
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in CLI_MODULES:
            raise
        print("error: the enginefarm command needs its CLI extra", file=sys.stderr)
        print("hint: pip install 'enginefarm[cli]'", file=sys.stderr)
        sys.exit(1)
    command()


if __name__ == "__main__":
    main()
