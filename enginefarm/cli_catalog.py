"""Catalog recipes on the command line: `enginefarm lock`, the offline `plan` of a catalog folder, and the
download-and-export stage `build` runs before it builds a catalog recipe."""

from __future__ import annotations

import time
from pathlib import Path

import click

from enginefarm.cli_console import console as _console
from enginefarm.settings import load_settings


def has_catalog(paths) -> bool:
    from enginefarm.builder.catalog import is_catalog_recipe

    return any(Path(p).is_dir() or is_catalog_recipe(Path(p)) for p in paths)


def print_catalog_plan(paths, runners: Path | None, fmt: str = "table") -> None:
    """`plan FOLDER|CATALOG_RECIPE… [--runners FILE] [--format json|github]`: every job, offline, with totals;
    `github`: the farm workflow's matrix, one entry per model and runner."""
    import dataclasses
    import json

    from rich.markup import escape
    from rich.table import Table

    from enginefarm.builder.catalog import catalog_paths
    from enginefarm.builder.catalog_plan import catalog_matrix, plan_catalog

    started = time.monotonic()
    planned = plan_catalog(catalog_paths(list(paths)), runners)
    seconds = time.monotonic() - started
    if fmt == "github":
        if runners is None:
            raise click.UsageError("--format github needs --runners FILE (the matrix names each runner's labels)")
        click.echo(json.dumps(catalog_matrix(planned, runners)))
        return
    if fmt == "json":
        totals = {"stored_gb_per_target": planned.stored_gb_per_target(), "jobs_per_runner": planned.jobs_per_runner()}
        jobs = [dataclasses.asdict(job) for job in planned.jobs]
        click.echo(json.dumps({"jobs": jobs, **totals, "sizes_unknown": list(planned.unknown)}, indent=1))
        return
    table = Table(title=f"{len(planned.jobs)} jobs of {len(planned.models)} catalog recipes (planned offline)")
    for column in ("model/component", "target", "precision", "memory (export)", "build (est.)", "stored", "runs on"):
        table.add_column(column)
    for job in planned.jobs:
        table.add_row(
            f"{job.model}/{job.component}",
            job.target,
            job.precision,
            f"{job.need_gb:g} GB ({job.export_gb:g})",
            f"{job.seconds / 60:.0f} min",
            f"{job.stored_bytes / 1e9:.2f} GB",
            escape(job.runner or f"none: {job.why}") if runners else "-",
        )
    console = _console()
    console.print(table)
    for target, size in sorted(planned.stored_gb_per_target().items()):
        console.print(f"stored for {target}: {size:.1f} GB")
    if runners:
        per_runner = ", ".join(f"{name} {count}" for name, count in sorted(planned.jobs_per_runner().items()))
        console.print(f"jobs per runner: {per_runner}")
        for job in planned.unroutable:
            console.print(f"[red]no runner[/] {job.model}/{job.component} {job.target} {job.precision}: {job.why}")
    for path in planned.unknown:
        console.print(f"[yellow]sizes unknown offline[/] {path}: lock it (`enginefarm lock`) to plan it")
    console.print(f"planned in {seconds:.2f} s")


def exported_recipes(paths) -> list[Path]:
    """`build`'s first stage: each catalog recipe downloaded, verified and exported; other recipes as given."""
    from enginefarm.builder.catalog import is_catalog_recipe, load_catalog_recipe
    from enginefarm.builder.catalog_export import export_catalog

    settings = load_settings()
    console = _console()
    out = []
    for path in paths:
        if not is_catalog_recipe(Path(path)):
            out.append(Path(path))
            continue
        recipe = load_catalog_recipe(path)
        done = export_catalog(recipe, settings.home, offline=settings.offline)
        peak = f", peak {done.export_peak_bytes / 1e9:.1f} GB" if done.export_peak_bytes else " (kept)"
        console.print(
            f"[green]exported[/] {recipe.name}: download {done.download_seconds:.0f} s, export "
            f"{done.export_seconds:.0f} s{peak} → {done.recipe}"
        )
        out.append(done.recipe)
    return out


@click.command("lock")
@click.argument("recipes", nargs=-1, required=True, type=click.Path(path_type=Path))
def lock_cmd(recipes):
    """Download each source file RECIPES leave unlocked and record its sha256 and size in RECIPE.lock.

    Run it on a machine with network; check the digests against the publisher's where it publishes them. `build`
    refuses an unlocked source when CI=true."""
    from enginefarm.builder.catalog import catalog_paths, load_catalog_recipe, lock_path
    from enginefarm.builder.catalog_fetch import lock

    settings = load_settings()
    console = _console()
    for path in catalog_paths(list(recipes)):
        recipe = load_catalog_recipe(path)
        done = lock(recipe, settings.home / "sources" / "catalog")
        if not done:
            console.print(f"[green]locked[/]  {path}: every file is pinned")
            continue
        for f in done:
            console.print(f"[green]locked[/]  {f.url}: {f.size} bytes, sha256 {f.sha256}")
        console.print(f"wrote {lock_path(path)}")


COMMANDS = (lock_cmd,)
