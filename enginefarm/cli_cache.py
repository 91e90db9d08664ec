"""`enginefarm cache`: the local cache on this device (ENGINEFARM_HOME)."""

from __future__ import annotations

import sys

import click

from enginefarm.cli_console import console
from enginefarm.cli_options import keep_versions_option
from enginefarm.settings import load_settings


@click.group("cache")
def cache_group():
    """The local cache on this device (ENGINEFARM_HOME)."""


@cache_group.command("ls")
def cache_ls():
    """List cached artifacts, most recently used first."""
    import time

    from rich.table import Table

    from enginefarm.cache.device_cache import DeviceCache

    settings = load_settings()
    entries = sorted(DeviceCache(settings.home).entries(), key=lambda e: -e.last_used)
    table = Table(title=f"{len(entries)} cached in {settings.home}")
    for column in ("model/component", "precision", "target", "key", "MiB", "last used"):
        table.add_column(column)
    for e in entries:
        m = e.manifest
        table.add_row(
            m.ref,
            m.precision,
            m.target,
            m.build_key[:12],
            f"{e.size / 2**20:.2f}",
            time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used)),
        )
    console().print(table)


@cache_group.command("verify")
def cache_verify():
    """Hash every cached file; evict damaged artifacts (they are fetched again when needed)."""
    from enginefarm.cache.device_cache import DeviceCache

    cache = DeviceCache(load_settings().home)
    bad = 0
    for checked in cache.verify_all():
        m = checked.manifest
        bad += checked.damaged
        said = "damaged" if checked.kept else "evicted"
        if m is None:
            click.echo(f"{said} [{checked.key[:12]}]: its manifest is missing or malformed")
        elif checked.problems:
            click.echo(f"{said} {m.ref} {m.target} [{m.build_key[:12]}]: {'; '.join(checked.problems)}")
        else:
            click.echo(f"ok      {m.ref} {m.target} [{m.build_key[:12]}]")
    why = cache.read_only()
    if why is not None:
        click.echo(
            f"warning: the cache at {cache.home} is read-only ({why}): every artifact was checked, nothing was evicted",
            err=True,
        )
    if bad:
        sys.exit(1)


@cache_group.command("gc")
@click.option("--quota", metavar="SIZE", help="Shrink to this size (e.g. 5G). Default ENGINEFARM_CACHE_QUOTA.")
@keep_versions_option()
def cache_gc(quota, keep_versions):
    """Remove stale downloads, artifacts of older model versions (--keep-versions) and least-recently-used artifacts
    beyond the quota."""
    from enginefarm.cache.device_cache import DeviceCache
    from enginefarm.cache.prune import prune_cache
    from enginefarm.settings import parse_size

    settings = load_settings()
    limit = parse_size("--quota", quota) if quota else settings.cache_quota
    cache = DeviceCache(settings.home)
    cache.check_writable("cache gc removed nothing")
    evicted = prune_cache(cache, keep_versions) if keep_versions else []
    for manifest in evicted:
        click.echo(
            f"evicted {manifest.ref} v{manifest.model_version} {manifest.target} {manifest.precision} "
            f"[{manifest.build_key[:12]}]"
        )
    removed = evicted + cache.gc(limit, max_tmp_age=0)  # every leftover of a dead process, whatever its age
    click.echo(
        f"removed {len(removed)} artifacts; cache holds {cache.size() / 2**20:.1f} MiB"
        + ("" if limit else " (no quota set)")
    )
