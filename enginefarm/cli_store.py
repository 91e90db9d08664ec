"""`enginefarm ls`, `index`, `publish` and `gc`: what is in a store, copying between stores, and clearing one out."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from enginefarm.cli_console import RichProgress, console, plain_table
from enginefarm.cli_options import (
    component_option,
    json_option,
    keep_versions_option,
    key_option,
    model_option,
    open_store_to_read,
    precision_option,
    store_option,
    target_option,
)
from enginefarm.settings import load_settings

if TYPE_CHECKING:
    from enginefarm.cache.records import Verdict

RICH_ROWS = 1000  # longer listings are printed as plain aligned text


@click.command("ls")
@store_option()
@model_option()
@json_option()
@click.option(
    "--models", "by_model", is_flag=True, help="One line per model: family, versions, targets, download size here."
)
def ls_cmd(store, model, as_json, by_model):
    """List the artifacts in a store (through each model's index)."""
    from rich.table import Table

    from enginefarm.cache.index import read_index

    if by_model:
        _ls_models(store, model, as_json)
        return
    settings = load_settings()
    opened = open_store_to_read(store, settings)
    rows = []
    for name in opened.list_models():
        if model and name != model:
            continue
        for entry in read_index(opened, name).entries.values():
            p50_ms = entry.benchmarks[0].p50_ms if entry.benchmarks else None
            rows.append(
                {
                    "model": name,
                    **{
                        k: getattr(entry, k)
                        for k in (
                            "model_version",
                            "component",
                            "precision",
                            "profile_name",
                            "target",
                            "build_key",
                            "size",
                            "stored_size",
                            "created",
                        )
                    },
                    "p50_ms": p50_ms,
                    "validation": _verdict_text(entry.validation),
                    "sizes": _sizes_text(entry.profile),
                }
            )
    from enginefarm.cache.versions import version_key

    rows.sort(
        key=lambda r: (r["target"], r["precision"])
    )  # stable sorts: by component, newest version first, then target
    rows.sort(key=lambda r: version_key(r["model_version"]), reverse=True)
    rows.sort(key=lambda r: (r["model"], r["component"]))
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    title = f"{len(rows)} artifacts in {opened.url}"
    columns = (
        "model/component",
        "version",
        "precision",
        "profile",
        "target",
        "key",
        "size MiB",
        "stored MiB",
        "p50 ms",
        "validation",
        "sizes",
    )
    cells = (
        (
            f"{r['model']}/{r['component']}",
            r["model_version"] or "?",
            r["precision"],
            r["profile_name"],
            r["target"],
            r["build_key"][:12],
            f"{(r['size'] or 0) / 2**20:.2f}",
            f"{(r['stored_size'] or 0) / 2**20:.2f}",
            f"{r['p50_ms']:.2f}" if r["p50_ms"] is not None else "-",
            r["validation"],
            r["sizes"] or "-",
        )
        for r in rows
    )
    if len(rows) > RICH_ROWS:  # rich lays out every cell (about 2.5 ms a row): 10^5 rows took 254 s
        click.echo(plain_table(title, columns, list(cells)))
        return
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in cells:
        table.add_row(*row)
    console().print(table)


def _ls_models(store, model, as_json) -> None:
    """`ls --models`: what an app shows before a download (enginefarm.models)."""
    from enginefarm.runner.models import models

    found = [m for m in models(store) if not model or m.name == model]
    if as_json:
        click.echo(json.dumps([m.to_dict() for m in found], indent=1))
        return
    columns = ("model", "family", "versions", "targets", "download here")
    cells: list[tuple[str, ...]] = [
        (
            m.name,
            m.family or "?",
            ", ".join(m.versions) or "?",
            ", ".join(m.targets),
            f"{m.download_bytes / 1e6:.1f} MB" + (f" (nothing runs {', '.join(m.missing)} here)" if m.missing else ""),
        )
        for m in found
    ]
    click.echo(plain_table(f"{len(found)} models", columns, cells))


def _sizes_text(profile: dict) -> str | None:
    """The image sizes and batch a denoiser's or VAE's engine takes, in pixels (every family's VAE scales by 8);
    None for a component without a latent image input (text encoders, assets)."""
    from enginefarm.diffusion.sizes import pixel_range

    for name in ("sample", "hidden_states", "latent_sample"):
        bounds = profile.get(name) or {}
        # a VAE encoder's `sample` is the image itself (3 channels): already pixels
        factor = 1 if len(bounds.get("min", ())) == 4 and bounds["min"][1] == 3 else 8
        covered = pixel_range(profile, name, factor)
        if covered is not None:
            return str(covered)
    return None


def _verdict_text(verdict: Verdict) -> str:
    """An index entry's verdict in a few words: passed with its worst cosine, not run here, or failed (not served)."""
    if not verdict.stored("passed"):
        return "-"
    again = " (re-checked)" if verdict.revalidated else ""
    if verdict.passed is None:
        return "not run where built"
    if verdict.passed:
        cosine = verdict.min_cosine
        return f"passed{again}" + (f", cos {cosine:.6f}" if cosine is not None else "")
    return f"FAILED{again}: not served"


@click.command("index")
@store_option(required=True)
def index_cmd(store):
    """Rebuild every model's index from the store's manifests."""
    from enginefarm.cache.artifacts import rebuild_index
    from enginefarm.cache.stores import open_store

    counts = rebuild_index(open_store(store))
    for model, count in sorted(counts.items()):
        click.echo(f"{model}: {count} artifacts")
    if not counts:
        click.echo("no manifests found")


@click.command("publish")
@click.option("--from", "source", metavar="URL", required=True, help="Store to copy from.")
@click.option("--to", "dest", metavar="URL", required=True, help="Store to copy to (a directory or s3://).")
@model_option(repeatable=True)
@component_option()
@target_option()
@precision_option()
@key_option()
def publish_cmd(source, dest, models, components, targets, precisions, keys):
    """Copy artifacts between stores (local → S3, say), uploading only the blobs the destination lacks.

    An https:// store cannot be listed: name the models to copy from one with --model."""
    from enginefarm.cache.artifacts import copy_artifacts, select_entries
    from enginefarm.cache.stores import open_store

    src, dst = open_store(source), open_store(dest)
    selected = [entry.build_key for entry in select_entries(src, models, components, targets, precisions, keys)]
    if not selected:
        from enginefarm.errors import ArtifactNotFoundError

        raise ArtifactNotFoundError(
            f"nothing in {src.url} matches the selection", hint="see `enginefarm ls --store URL`"
        )
    with RichProgress() as progress:
        results = copy_artifacts(src, dst, selected, progress=progress)
    copied = sum(v == "copied" for v in results.values())
    click.echo(f"{copied} copied, {len(results) - copied} already in {dst.url}")


@click.command("gc")
@store_option(required=True)
@click.option(
    "--grace", default="24h", show_default=True, help="Keep unreferenced blobs younger than this (s, m, h, d)."
)
@keep_versions_option()
@click.option("--delete", is_flag=True, help="Really delete; without it, only show what would go.")
def gc_cmd(store, grace, keep_versions, delete):
    """Remove blobs no manifest references and superseded build-cache objects, older than the grace period (dry run by
    default).

    With --keep-versions N, first the artifacts of older model versions: their manifests, index entries, and the blobs
    nothing kept uses (a blob a kept manifest uses is never removed)."""
    from enginefarm.cache.artifacts import CACHE_NEWEST_KEPT, collect_garbage
    from enginefarm.cache.prune import prune_store
    from enginefarm.cache.stores import open_store
    from enginefarm.settings import parse_duration

    grace_s = parse_duration("--grace", grace)
    opened = open_store(store)
    if keep_versions:
        _print_pruning(prune_store(opened, keep_versions, delete=delete), delete)
    plan = collect_garbage(opened, grace_s, delete=delete)
    done = "deleted" if delete else "would delete"
    for digest in plan.to_delete:
        click.echo(f"{done} blob {digest}")
    for name in plan.partials:
        click.echo(f"{done} leftover of an interrupted write: {name}")
    for name in plan.stale_caches:
        click.echo(f"{done} build cache caches/{name}")
    young = len(plan.unreferenced) - len(plan.to_delete)
    click.echo(
        f"{plan.referenced} blobs referenced; {len(plan.to_delete)} unreferenced "
        f"{'deleted' if delete else 'to delete (dry run: add --delete)'}; {young} unreferenced but younger than {grace}"
    )
    if plan.stale_caches:
        click.echo(
            f"{len(plan.stale_caches)} superseded build-cache objects {'deleted' if delete else 'to delete'} (the "
            f"newest {CACHE_NEWEST_KEPT} of each kept)"
        )
    if plan.partials:
        click.echo(f"{len(plan.partials)} leftovers of interrupted writes {'deleted' if delete else 'to delete'}")


def _print_pruning(pruning, delete: bool) -> None:
    verb = "removed" if delete else "would remove"
    for manifest in pruning.removed:
        click.echo(
            f"{verb} {manifest.ref} v{manifest.model_version} {manifest.target} {manifest.precision} "
            f"[{manifest.build_key[:12]}]"
        )
    for digest in pruning.blobs:
        click.echo(f"{verb} blob {digest} (only older versions used it)")
    kept = "; ".join(f"{ref}: {', '.join(versions)}" for ref, versions in pruning.kept_versions.items())
    click.echo(
        f"{len(pruning.removed)} artifacts of older versions and {len(pruning.blobs)} blobs "
        f"{'removed' if delete else 'to remove (dry run: add --delete)'}" + (f"; kept versions {kept}" if kept else "")
    )


COMMANDS = (ls_cmd, index_cmd, publish_cmd, gc_cmd)
