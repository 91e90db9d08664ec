"""`enginefarm release`: the maintainer's commands for signed release channels (python-tuf). Thin: parse, call
enginefarm.cache.trust.repo, print. Private keys stay in their files; nothing here prints one."""

from __future__ import annotations

import json
from datetime import UTC
from pathlib import Path

import click

from enginefarm.cli_options import (
    channel_option,
    json_option,
    key_option,
    keys_option,
    precision_option,
    stacked,
    store_option,
    target_option,
)
from enginefarm.errors import ArtifactNotFoundError, ConfigError
from enginefarm.settings import load_settings, parse_duration

ROLES = ("root", "targets", "snapshot", "timestamp")


def _store(url):
    from enginefarm.cache.stores import open_store

    return open_store(url or load_settings().store)


ROOT_WARNING_DAYS = 60  # a root is renewed offline, with keys kept away from CI: give maintainers weeks, not hours


def _warn_if_root_expires_soon(opened, channel: str) -> None:
    """One line on stderr when the channel's root expires within ROOT_WARNING_DAYS (or has expired)."""
    from datetime import datetime

    from enginefarm.cache.trust import repo

    expires = repo.root_expiry(opened, channel)
    left = expires - datetime.now(UTC)
    if left.days >= ROOT_WARNING_DAYS:
        return
    when = (
        f"expired on {expires:%Y-%m-%d}"
        if left.total_seconds() <= 0
        else f"expires on {expires:%Y-%m-%d %H:%M} UTC (in {left.days} days)"
    )
    click.echo(
        f"warning: the root of channel {channel} {when}: every app stops loading from it then; renew it with the root "
        f"keys: `enginefarm release refresh --role root --channel {channel} --keys ROOT-KEYS`",
        err=True,
    )


def _pairs(option: str, items, parse) -> dict:
    found = {}
    for item in items:
        role, sep, value = item.partition("=")
        if not sep or role not in ROLES:
            raise ConfigError(f"{option} {item!r}: write ROLE=VALUE", hint=f"ROLE is one of {', '.join(ROLES)}")
        found[role] = parse(value)
    return found


def _positive_int(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"threshold {value!r} must be a whole number of at least 1")
    return int(value)


def _seconds(value: str) -> int:
    seconds = int(parse_duration("--expires", value))
    if seconds < 60:
        raise ConfigError(f"--expires {value!r} is too short", hint="at least a minute; e.g. timestamp=2d, root=1y")
    return seconds


@click.group("release")
def release_group():
    """Signed release channels: what apps may load (python-tuf; `pip install 'enginefarm[release]'`)."""
    from enginefarm.cache.trust import require_tuf

    require_tuf()  # every release command signs or verifies: say what to install before anything starts


@release_group.command("init")
@store_option()
@keys_option()
@channel_option(release=True)
@click.option(
    "--threshold",
    "thresholds",
    multiple=True,
    metavar="ROLE=N",
    help="Signatures a role needs (and keys generated for it). Default 1. Repeatable.",
)
@click.option(
    "--expires",
    "expires",
    multiple=True,
    metavar="ROLE=DURATION",
    help="How long a role's signature lasts: root=1y targets=1y snapshot=1y timestamp=2d (defaults). Repeatable.",
)
def init_cmd(store, keys_dir, channel, thresholds, expires):
    """Create a channel: root, targets, snapshot and timestamp roles, with new keys in --keys (reused if already
    there)."""
    from enginefarm.cache.trust import repo

    opened = _store(store)
    state = repo.init(
        opened,
        channel,
        keys_dir,
        _pairs("--threshold", thresholds, _positive_int),
        _pairs("--expires", expires, _seconds),
    )
    click.echo(f"created channel {channel} in {opened.url} (root v{state.root.signed.version})")
    for role in ROLES:
        spec = state.root.signed.roles[role]
        click.echo(
            f"  {role:<9} {spec.threshold} of {len(spec.keyids)} key(s), expires "
            f"{getattr(state, role).signed.expires:%Y-%m-%d %H:%M} UTC"
        )
    click.echo(
        f"private keys are in {keys_dir} (mode 0600): keep the root keys offline, give CI only the timestamp key"
    )
    click.echo(
        f"ship the root with your app: enginefarm release export-root --channel {channel} --store {opened.url} --out "
        "root.json"
    )


def _selection(ref: str, targets, precisions, keys) -> dict:
    model, _, component = ref.partition("/")
    if not model or "/" in component:
        raise ConfigError(f"{ref!r} is not MODEL or MODEL/COMPONENT", hint="for example: sd15 or sd15/vae_decoder")
    return {
        "models": (model,),
        "components": (component,) if component else (),
        "targets": targets,
        "precisions": precisions,
        "keys": keys,
    }


_select = stacked(target_option(), precision_option(), key_option())


@release_group.command("promote")
@click.argument("ref", metavar="MODEL[/COMPONENT]")
@channel_option(release=True)
@store_option()
@keys_option()
@_select
def promote_cmd(ref, channel, store, keys_dir, targets, precisions, keys):
    """Release the selected artifacts of the store into the channel (signs targets, snapshot and timestamp)."""
    from enginefarm.cache.artifacts import select_entries
    from enginefarm.cache.trust import repo

    opened = _store(store)
    entries = select_entries(opened, **_selection(ref, targets, precisions, keys))
    if not entries:
        raise ArtifactNotFoundError(f"nothing in {opened.url} matches {ref}", hint="see `enginefarm ls --store URL`")
    for manifest in repo.promote(opened, channel, keys_dir, [e.build_key for e in entries]):
        click.echo(
            f"promoted {manifest.ref} {manifest.target} {manifest.precision} [{manifest.build_key[:12]}] to {channel}"
        )
    _warn_if_root_expires_soon(opened, channel)


@release_group.command("yank")
@click.argument("ref", metavar="MODEL[/COMPONENT]")
@channel_option(release=True)
@store_option()
@keys_option()
@_select
def yank_cmd(ref, channel, store, keys_dir, targets, precisions, keys):
    """Withdraw released artifacts: apps stop resolving to them at their next refresh. The artifacts stay in the
    store."""
    from enginefarm.cache.manifest import target_matches
    from enginefarm.cache.trust import repo

    chosen = _selection(ref, targets, precisions, keys)

    def picked(custom: dict) -> bool:
        return (
            custom.get("model") in chosen["models"]
            and (not chosen["components"] or custom.get("component") in chosen["components"])
            and target_matches(str(custom.get("target", "")), targets)
            and (not precisions or custom.get("precision") in precisions)
            and (not keys or any(str(custom.get("build_key", "")).startswith(k) for k in keys))
        )

    removed = repo.yank(_store(store), channel, keys_dir, lambda custom: not picked(custom))
    if not removed:
        raise ArtifactNotFoundError(
            f"nothing released in {channel} matches {ref}", hint=f"see `enginefarm release ls --channel {channel}`"
        )
    for custom in removed:
        click.echo(
            f"yanked {custom.get('model')}/{custom.get('component')} {custom.get('target')} {custom.get('precision')} "
            f"[{str(custom.get('build_key'))[:12]}] from {channel}"
        )


@release_group.command("ls")
@channel_option(release=True)
@store_option()
@json_option()
def ls_cmd(channel, store, as_json):
    """Show the channel's roles (version, expiry, keys) and its released artifacts."""
    from enginefarm.cache.trust import repo

    opened = _store(store)
    listing = repo.listing(opened, channel)
    _warn_if_root_expires_soon(opened, channel)
    if as_json:
        click.echo(json.dumps(listing, indent=1))
        return
    click.echo(f"channel {channel} in {listing['store']}")
    for role, info in listing["roles"].items():
        click.echo(
            f"  {role:<9} v{info['version']:<4} {info['threshold']} of {info['keys']} key(s), expires {info['expires']}"
        )
    click.echo(f"{len(listing['targets'])} released:")
    for t in listing["targets"]:
        click.echo(
            f"  {t.get('model')}/{t.get('component')} {t.get('target')} {t.get('precision')} "
            f"[{str(t.get('build_key'))[:12]}] {t['length']} bytes sha256 {str(t['sha256'])[:12]}"
        )


@release_group.command("refresh")
@channel_option(release=True)
@store_option()
@keys_option()
@click.option(
    "--role",
    "roles",
    multiple=True,
    type=click.Choice(ROLES),
    help="Also renew this role (needs its keys). Default: the timestamp only.",
)
def refresh_cmd(channel, store, keys_dir, roles):
    """Renew the timestamp (run it on a schedule in CI with only the timestamp key); --role renews more."""
    from enginefarm.cache.trust import repo

    opened = _store(store)
    state = repo.refresh(opened, channel, keys_dir, set(roles) | {"timestamp"})
    renewed = [r for r in ROLES if r in set(roles) | {"timestamp"}]
    for role in renewed:
        signed = getattr(state, role).signed
        click.echo(f"renewed {role} of {channel}: v{signed.version}, expires {signed.expires:%Y-%m-%d %H:%M} UTC")
    _warn_if_root_expires_soon(opened, channel)


@release_group.command("rotate")
@click.argument("role", type=click.Choice(ROLES))
@channel_option(release=True)
@store_option()
@keys_option()
@click.option(
    "--threshold",
    type=click.IntRange(1, 16),
    help="Signatures the role needs from now on (default: as before); as many new keys are made.",
)
def rotate_cmd(role, channel, store, keys_dir, threshold):
    """Replace every key of ROLE with new ones (old key files move to KEYS/retired/). Needs the root keys."""
    from enginefarm.cache.trust import repo

    new = repo.rotate(_store(store), channel, keys_dir, role, threshold)
    click.echo(
        f"rotated {role} of {channel}: {len(new)} new key(s) in {keys_dir}; clients follow the new root on their next "
        "refresh"
    )
    if role == "timestamp":
        click.echo("give CI the new timestamp key")


@release_group.command("export-root")
@channel_option(release=True)
@store_option()
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Where to write root.json (ship it with your app).",
)
def export_root_cmd(channel, store, out):
    """Write the channel's current root metadata: the trust anchor an app ships and passes as trusted_root."""
    from enginefarm.cache.atomic import write_bytes_atomic
    from enginefarm.cache.trust import repo

    write_bytes_atomic(out, repo.root_bytes(_store(store), channel))
    click.echo(f"wrote {out}")
