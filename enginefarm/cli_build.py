"""`enginefarm plan`, `build`, `validate` and `report`: the farm's side, from recipes to stored artifacts and a
report."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import click

from enginefarm.cli_console import console as _console
from enginefarm.cli_options import (
    component_option,
    jobs_parallel_option,
    open_store_to_read,
    precision_option,
    recipe_option,
    report_option,
    runners_option,
    stacked,
    store_option,
    target_option,
)
from enginefarm.settings import load_settings


def _plan(
    recipes, store, targets, precisions, components, jobs=(), runners=None, runner_labels=(), *, creates_store=False
):
    from enginefarm.builder.ci_runners import load_runners
    from enginefarm.builder.planner import plan
    from enginefarm.builder.recipe import load_recipe
    from enginefarm.cache.stores import open_store

    settings = load_settings()
    loaded = [load_recipe(p) for p in recipes]
    # `build` creates its store; the other commands read one, and a store that is not there yet reads as empty.
    opened = open_store(store or settings.store) if creates_store else open_store_to_read(store, settings)
    planned = plan(
        loaded,
        settings.home / "sources",
        store=opened,
        targets=targets,
        precisions=precisions,
        components=components,
        job_ids=jobs,
        offline=settings.offline,
        runners=load_runners(runners) if runners else None,
        runner_labels_filter=runner_labels,
    )
    return planned, opened, settings


_recipes = click.argument("recipes", nargs=-1, required=True, type=click.Path(path_type=Path))
_select = stacked(_recipes, store_option(), target_option(), precision_option(), component_option())


@click.command("plan")
@_select
@click.option("--format", "fmt", type=click.Choice(["table", "json", "github"]), default="table", show_default=True)
@runners_option()
@click.option("--runner-labels", default="", metavar="A,B,…", help="Only jobs a runner with these labels can build.")
def plan_cmd(recipes, store, targets, precisions, components, fmt, runners, runner_labels):
    """Show the jobs RECIPES expand to, with their build keys and status here.

    --format github prints {"matrix": …} for a GitHub Actions build matrix (at most 256 entries, jobs batched
    per runner), the job count, and the jobs no runner can build."""
    from enginefarm.builder.ci_matrix import github_matrix
    from enginefarm.cache.build_keys import short
    from enginefarm.cli_catalog import has_catalog, print_catalog_plan

    if has_catalog(recipes):  # catalog recipes plan offline, from their pins and published parameter counts
        print_catalog_plan(recipes, runners, fmt)
        return
    labels = tuple(filter(None, (label.strip() for label in runner_labels.split(","))))
    planned, _, _ = _plan(recipes, store, targets, precisions, components, runners=runners, runner_labels=labels)
    if fmt == "json":
        click.echo(json.dumps([p.to_dict() for p in planned], indent=1))
        return
    if fmt == "github":
        click.echo(json.dumps(github_matrix(planned)))
        return
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"{len(planned)} jobs")
    farm = bool(runners or labels)  # the CI runner a job goes to means something only for a farm's runners
    for column in ("job", "key", "model/component", "precision", "profile", "target", "memory", "runs on", "status"):
        if column != "runs on" or farm:
            table.add_column(column)
    for p in planned:
        style = (
            "green"
            if p.built
            else "red"
            if p.unroutable or p.refused
            else "yellow"
            if p.availability.can_build
            else "dim"
        )
        table.add_row(
            p.job.id,
            short(p.key),
            f"{p.job.model}/{p.job.component}",
            p.job.precision,
            p.job.profile_name,
            str(p.job.target),
            f"{p.to_dict()['memory_gb']:g} GB",
            *([escape(",".join(p.runs_on))] if farm else []),
            f"[{style}]{escape(p.status)}[/]",
        )
    _console().print(table)


@click.command("build")
@_select
@click.option(
    "--job", "jobs", multiple=True, metavar="ID", help="Only the planned job with this id (see `plan`). Repeatable."
)
@jobs_parallel_option()
@click.option("--no-bench", is_flag=True, help="Skip the benchmark (resolution then cannot rank by speed).")
@report_option()
@click.option(
    "--memory",
    metavar="SIZE",
    help="Memory the jobs may use together, e.g. 16G (default: what is available when the build starts).",
)
def build_cmd(recipes, store, targets, precisions, components, jobs, parallel, no_bench, report, memory):
    """Build, validate, benchmark and publish every job of RECIPES that is not in the store yet.

    A stored artifact whose [validate] settings changed since it was judged is re-validated, not rebuilt. Jobs run
    in parallel (-j) only while their estimated memory needs fit --memory together; `plan` shows each job's need.
    The report (--report) gives each job's time and peak memory per stage."""
    from rich.markup import escape

    from enginefarm.settings import parse_size

    budget = parse_size("--memory", memory)
    console = _console()
    from enginefarm.cli_catalog import exported_recipes

    recipes = exported_recipes(recipes)  # a catalog recipe: downloaded, verified and exported first
    if components and set(components) == {"assets"} and not jobs:  # only the assets: nothing to plan or compile
        from enginefarm.cache.stores import open_store

        _publish_assets(console, recipes, open_store(store or load_settings().store))
        return
    planned, opened, settings = _plan(
        recipes, store, targets, precisions, tuple(c for c in components if c != "assets"), jobs, creates_store=True
    )
    todo = [
        p.job for p in planned if p.availability.can_build and not p.refused and (not p.built or p.stale_validation)
    ]
    for p in planned:
        if p.built and not p.stale_validation:
            console.print(f"[green]exists[/]   {p.job.label}")
        elif p.refused or not p.availability.can_build:
            console.print(f"[dim]skipped[/]  {p.job.label}: {escape(p.status)}")
    published = bool(todo)
    if published:  # before the first job: a build killed midway still leaves what its artifacts need to run
        _publish_assets(console, recipes, opened)
    results = _run_jobs(
        console,
        todo,
        opened,
        settings,
        f"building {len(todo)} job(s) into {opened.url}",
        parallel,
        bench=not no_bench,
        memory=budget,
    )
    if not published and (not components or "assets" in components):
        _publish_assets(console, recipes, opened)  # a model built part by part still needs them to run
    revalidated = sum(r.status == "revalidated" for r in results)
    refused = sum(bool(p.refused) and not p.built for p in planned)
    unavailable = sum(not p.availability.can_build and not p.refused and not p.built for p in planned)
    repaired = sum(r.status == "built" and r.reason.startswith("repaired") for r in results)
    meanwhile = sum(r.status == "exists" for r in results)  # planned as missing, stored by the time its worker looked
    console.print(
        f"{sum(r.status == 'built' for r in results)} built"
        + (f" ({repaired} repaired: blobs were missing)" if repaired else "")
        + f", {sum(r.status == 'failed' for r in results)} failed, "
        f"{sum(p.built for p in planned)} already stored"
        + (f" ({revalidated} re-validated)" if revalidated else "")
        + (f", {meanwhile} published by another builder meanwhile" if meanwhile else "")
        + f", {unavailable} unavailable here"
        + (f", {refused} refused (see `enginefarm plan`)" if refused else "")
    )
    _finish(results, report)


def _publish_assets(console, recipes, opened) -> None:
    """Each recipe's [model] assets folder, beside its artifacts (once: the same files are never stored twice)."""
    from enginefarm.builder.assets import publish_assets
    from enginefarm.builder.recipe import load_recipe

    for path in recipes:
        recipe = load_recipe(path)
        done = publish_assets(opened, recipe)
        if done is not None:
            state = "[green]published[/]" if done.written else "[green]exists[/]   "
            console.print(
                f"{state} {recipe.name}/assets v{recipe.version}: {done.files} files, {done.size / 1e6:.2f} MB "
                f"\\[{done.key[:12]}]"
            )


@click.command("validate")
@_select
@jobs_parallel_option()
@report_option()
def validate_cmd(recipes, store, targets, precisions, components, parallel, report):
    """Re-check the stored artifacts of RECIPES against their current [validate] settings; rebuild nothing.

    Each verdict is recorded in the store: an artifact that fails is no longer picked by `load`."""
    planned, opened, settings = _plan(recipes, store, targets, precisions, components)
    console = _console()
    todo = [p.job for p in planned if p.built]
    for p in planned:
        if not p.built:
            console.print(f"[dim]skipped[/]  {p.job.label}: {'not in the store' if p.key else p.status}")
    results = _run_jobs(
        console,
        todo,
        opened,
        settings,
        f"re-validating {len(todo)} artifact(s) in {opened.url}",
        parallel,
        bench=False,
        validate_only=True,
    )
    console.print(
        f"{sum(r.status == 'revalidated' for r in results)} passed, {sum(r.status == 'failed' for r in results)} "
        f"failed, {len(planned) - len(todo)} not stored"
    )
    _finish(results, report)


def _run_jobs(
    console,
    todo,
    opened,
    settings,
    title: str,
    parallel: int,
    *,
    bench: bool,
    validate_only: bool = False,
    memory: int | None = None,
) -> list:
    """Run jobs in worker processes with a live line each; returns their results."""
    from rich.markup import escape
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.text import Text

    from enginefarm.builder.executor import run_jobs
    from enginefarm.builder.memory import gb as memory_gb

    if not todo:
        return []
    live = console.is_terminal  # a log file or a pipe gets a line per stage and job: bars draw nothing there
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=not live
    ) as bar:
        overall = bar.add_task(title, total=len(todo))
        rows = {job.id: bar.add_task(f"[dim]queued[/]   {job.label}", total=None) for job in todo}
        labels = {job.id: job.label for job in todo}
        started = time.monotonic()

        def show(task, description: str, **fields) -> None:
            bar.update(task, description=description, **fields)
            if not live:
                plain = Text.from_markup(description).plain
                console.print(f"[{time.monotonic() - started:6.0f} s] {plain}", markup=False, highlight=False)

        def on_event(job_id, kind, detail):
            task = rows.get(job_id)
            if task is None:
                return
            if kind == "step":
                show(task, f"[cyan]{detail:<9}[/] {labels[job_id]}")
            elif kind == "transfer":
                _name, done, total = detail
                description = f"[cyan]upload {done / 2**20:.1f}/{total / 2**20:.1f} MiB[/] {labels[job_id]}"
                if live:
                    bar.update(task, description=description)
                elif done >= total:  # one line per upload, not one per chunk
                    show(task, description)
            elif kind == "done":
                color = {
                    "built": "green",
                    "exists": "green",
                    "revalidated": "green",
                    "missing": "yellow",
                    "failed": "red",
                }[detail.status]
                reason = detail.reason.removeprefix(f"{labels[job_id]}: ").splitlines()[0] if detail.reason else ""
                peak = f", peak {_decimal_gb(detail.peak_rss_mb):.1f} GB" if detail.peak_rss_mb else ""
                if peak and detail.planned_mb:  # in the plan's unit and rounding (GB, 10^9, up), as `plan` prints it
                    peak += f" of {memory_gb(int(detail.planned_mb * 2**20)):.1f} planned"
                extra = (
                    f" ({detail.seconds:.1f}s{peak})"
                    if detail.status in ("built", "revalidated")
                    else f": {escape(reason)}"
                    if reason
                    else ""
                )
                show(task, f"[{color}]{detail.status:<9}[/] {labels[job_id]}{extra}", total=1, completed=1)
                bar.advance(overall)

        return run_jobs(
            todo,
            opened.url,
            settings.home / "build",
            parallel=parallel,
            bench=bench,
            on_event=on_event,
            memory=memory,
            validate_only=validate_only,
        )


def _decimal_gb(mib: float) -> float:
    return mib * 2**20 / 1e9


def _finish(results: list, report: Path | None) -> None:
    """Write the JSON report; print each failure in full (with the SDK's traceback under -v); exit 1 on any."""
    if report:
        report.write_text(json.dumps([r.to_dict() for r in results], indent=1))
    failed = [r for r in results if r.status == "failed"]
    if not failed:
        return
    verbose = logging.getLogger().isEnabledFor(logging.INFO)
    for r in failed:
        click.echo(f"failed: {r.reason}", err=True)
        if verbose and r.detail:
            click.echo(r.detail.rstrip(), err=True)
    if not verbose and any(r.detail for r in failed):
        click.echo("(-v shows the SDK's traceback)", err=True)
    sys.exit(1)


@click.command("report")
@store_option()
@click.option(
    "--reports",
    "reports",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="Build result JSON files (from `build --report`) or folders of them. Repeatable.",
)
@recipe_option("Recipes whose jobs should exist: the ones not built show as missing.", repeatable=True)
@runners_option()
@click.option("--out", type=click.Path(path_type=Path), default=Path("farm-report"), show_default=True)
@click.option("--title", default="enginefarm build report", show_default=True)
@click.option(
    "--pictures",
    is_flag=True,
    help="Render one prompt through every backend × precision of each model whose assets are stored.",
)
@click.option(
    "--prompt", default="a lighthouse on a cliff at dawn, oil painting", show_default=True, help="The pictures' prompt."
)
@click.option("--seed", default=0, show_default=True, type=int, help="The pictures' seed.")
@click.option("--picture-steps", default=8, show_default=True, type=click.IntRange(1, 200))
@click.option(
    "--picture-size",
    default=None,
    type=int,
    help="The pictures' width and height in pixels (default: each model's native size).",
)
def report_cmd(store, reports, recipes, runners, out, title, pictures, prompt, seed, picture_steps, picture_size):
    """Write an HTML report (status grid, validation, latency plots, build times, sizes) and a markdown summary."""
    from enginefarm.builder.report import collect, write_report
    from enginefarm.cache.stores import open_store

    opened = open_store(store or load_settings().store)
    files = [f for p in reports for f in (sorted(p.glob("*.json")) if p.is_dir() else [p])]
    expected = []
    if recipes:
        planned, _, _ = _plan(recipes, store, (), (), (), runners=runners)
        expected = [{**p.to_dict(), "why": p.status} for p in planned if not p.built]
    rows = collect(opened, files, expected)
    rendered = []
    if pictures:
        from enginefarm.builder.report_pictures import render_pictures

        out.mkdir(parents=True, exist_ok=True)
        rendered = render_pictures(opened, out, prompt=prompt, seed=seed, steps=picture_steps, size=picture_size)
        if not rendered:
            click.echo(
                "note: no model in the store has its assets published, so there are no pictures (see `[model] assets`)",
                err=True,
            )
    counts = write_report(rows, out, title, rendered)
    click.echo(
        f"{counts['built']} built, {counts['failed']} failed, {counts['missing']} missing → {out / 'report.html'}, "
        f"{out / 'summary.md'}"
    )


COMMANDS = (plan_cmd, build_cmd, validate_cmd, report_cmd)
