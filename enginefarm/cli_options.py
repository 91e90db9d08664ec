"""Options that `enginefarm` and `enginefarm release` share, so a selection reads the same in both."""

from __future__ import annotations

import click

target_option = click.option("--target", "targets", multiple=True, metavar="T", help="Only this target (backend:device or backend). Repeatable.")
precision_option = click.option("--precision", "precisions", multiple=True, type=click.Choice(["fp32", "fp16", "bf16"]), help="Only this precision. Repeatable.")


def stacked(*options):
    """One decorator applying `options` in the order listed (as if written one above the other)."""

    def apply(func):
        for option in reversed(options):
            func = option(func)
        return func

    return apply
