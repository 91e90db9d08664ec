"""What the commands draw with: a console sized for where its output goes, and bars for the library's progress
callback. rich is imported only when something is drawn."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import TaskID


def console(stderr: bool = False):
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # Piped output (CI logs, files) gets wide lines instead of rich's 80-column default.
    return Console(stderr=stderr, highlight=False, width=None if stream.isatty() else 200)


def plain_table(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """A table as aligned plain text, in time linear in its cells (for listings too long for rich to lay out)."""
    widths = [max([len(c), *(len(row[i]) for row in rows)]) for i, c in enumerate(columns)]
    line = lambda cells: "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([title, line(columns), line(tuple("-" * w for w in widths)), *map(line, rows)])


class RichProgress:
    """Draws the library's progress callback: messages as dim lines, transfers as bars with bytes, rate and ETA,
    other work (an engine compiled on the device) as bars with steps and elapsed time."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            Progress,
            ProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )
        from rich.text import Text

        from enginefarm.cache.progress import Progress as Callback

        class Either(ProgressColumn):
            """One column for both kinds of bar: `bytes` for transfers, `steps` for work."""

            def __init__(self, bytes_column, steps_column) -> None:
                super().__init__()
                self.columns = {"bytes": bytes_column, "steps": steps_column}

            def render(self, task):
                column = self.columns[task.fields.get("unit", "bytes")]
                return column.render(task) if column is not None else Text("")

        self.console = console(stderr=True)
        self.bars = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            Either(DownloadColumn(), MofNCompleteColumn()),
            Either(TransferSpeedColumn(), None),
            Either(TimeRemainingColumn(), TimeElapsedColumn()),
            console=self.console,
            transient=False,
        )
        self.tasks: dict[str, TaskID] = {}
        outer = self

        def update(name: str, done: int, total: int, unit: str) -> None:
            if name not in outer.tasks:
                outer.bars.start()
                outer.tasks[name] = outer.bars.add_task(name, total=total, unit=unit)
            outer.bars.update(outer.tasks[name], completed=done, total=total)

        class Callback_(Callback):
            def message(self, text: str) -> None:
                outer.console.print(f"[dim]{text}[/]", markup=True, highlight=False)

            def transfer(self, name: str, done: int, total: int) -> None:
                update(name, done, total, "bytes")

            def work(self, name: str, done: int, total: int) -> None:
                update(name, done, total, "steps")

        self.callback = Callback_()

    def __enter__(self):
        return self.callback

    def __exit__(self, *exc) -> None:
        if self.tasks:  # stopping bars that never started prints an empty line before the error or result
            self.bars.stop()
