"""Environment variables, parsed in one place. A leaf module: imports nothing from the project."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from enginefarm.errors import ConfigError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def parse_bool(name: str, raw: str | None) -> bool:
    value = (raw or "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean", hint="use 1/0, true/false, yes/no or on/off")


def parse_size(name: str, raw: str | None) -> int | None:
    """'10G', '500M', '123' (bytes) → bytes; empty → None (no quota)."""
    value = (raw or "").strip().upper().removesuffix("B")
    if not value:
        return None
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    scale = units.get(value[-1], 1)
    digits = value[:-1] if value[-1] in units else value
    try:
        size = int(float(digits) * scale)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a size", hint="use bytes or a suffix: 500M, 10G") from None
    if size <= 0:
        raise ConfigError(f"{name}={raw!r} must be positive")
    return size


def parse_number(name: str, raw: str | None, default: float, low: float, high: float) -> float:
    value = (raw or "").strip()
    if not value:
        return default
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not low <= number <= high:
        raise ConfigError(f"{name}={raw!r} must be between {low:g} and {high:g}")
    return number


def parse_duration(name: str, raw: str) -> float:
    """'90s', '30m', '24h', '7d', '2w', '1y' or plain seconds → seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
    value = (raw or "").strip().lower()
    try:
        seconds = float(value[:-1]) * units[value[-1]] if value and value[-1] in units else float(value)
    except (ValueError, IndexError):
        raise ConfigError(f"{name} {raw!r} is not a duration", hint="e.g. 30m, 24h, 7d, 1y") from None
    if seconds < 0:
        raise ConfigError(f"{name} {raw!r} must not be negative")
    return seconds


def parse_choice(name: str, raw: str | None, choices: tuple[str, ...]) -> str:
    """One of `choices` (case-insensitive); empty → the first."""
    value = (raw or "").strip().upper()
    if not value:
        return choices[0]
    if value not in choices:
        raise ConfigError(
            f"{name}={raw!r} is not one of {', '.join(choices)}", hint=f"use one of: {', '.join(choices)}"
        )
    return value


DEFAULT_MAX_ARTIFACT_SIZE = 64 << 30
COREML_COMPUTE_UNITS = ("ALL", "CPU_AND_GPU", "CPU_AND_NE", "CPU_ONLY")  # coremltools.ComputeUnit names
# On-device timing of close candidates at the first load: auto (only where it costs a few seconds), on, off.
MEASURE_MODES = ("AUTO", "ON", "OFF")


@dataclass(frozen=True)
class Settings:
    home: Path
    store: str
    offline: bool
    cache_quota: int | None
    recipe_path: tuple[Path, ...]
    http_deadline_s: float = 3600.0
    http_min_rate: float = 16 * 1024
    http_connections: int = 1
    s3_verify: bool = False
    channel: str | None = None  # a signed release channel: resolve only among its targets
    trusted_root: Path | None = None  # the channel's root.json, shipped with the app
    coreml_compute_units: str = "ALL"
    store_explicit: bool = False  # ENGINEFARM_STORE was set: a local path that does not exist is an error, not "empty"
    # The most an artifact fetched outside a signed channel may claim (its manifest is unsigned there): what a
    # lying manifest can make the cache write before its hash check fails. SDXL's fp32 UNet is ~10 GB.
    max_artifact_size: int = DEFAULT_MAX_ARTIFACT_SIZE
    measure: str = "auto"  # time the close candidates on this device at the first load: auto | on | off
    host_lock_dir: Path | None = None  # where builds and benchmarks of this host coordinate (None: the system temp dir)
    probe_cache: bool = (
        True  # remember device probes in home/device-probes.json (hardware/probe_cache.py); off: probe every load
    )


def _default_home() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("enginefarm", appauthor=False))


def _default_store() -> str:
    import platformdirs

    return str(Path(platformdirs.user_data_dir("enginefarm", appauthor=False)) / "store")


def _home_folder(raw: str) -> Path:
    """ENGINEFARM_HOME as a folder that exists or can be made: neither it nor any folder above it may be a file."""
    home = Path(raw).expanduser()
    for path in (home, *home.parents):
        if path.exists() or path.is_symlink():
            if not path.is_dir():
                raise ConfigError(
                    f"ENGINEFARM_HOME={raw!r}: {path} is a file, not a folder",
                    variable="ENGINEFARM_HOME",
                    hint="point ENGINEFARM_HOME at a folder (it is created if missing), or unset it for the default",
                )
            break
    return home


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    home = env.get("ENGINEFARM_HOME") or str(_default_home())
    store = env.get("ENGINEFARM_STORE") or _default_store()
    recipe_path = tuple(Path(p) for p in (env.get("ENGINEFARM_RECIPE_PATH") or "").split(os.pathsep) if p)
    return Settings(
        home=_home_folder(home),
        store=store,
        offline=parse_bool("ENGINEFARM_OFFLINE", env.get("ENGINEFARM_OFFLINE")),
        cache_quota=parse_size("ENGINEFARM_CACHE_QUOTA", env.get("ENGINEFARM_CACHE_QUOTA")),
        recipe_path=recipe_path,
        http_deadline_s=parse_number(
            "ENGINEFARM_HTTP_DEADLINE", env.get("ENGINEFARM_HTTP_DEADLINE"), 3600.0, 1, 7 * 86400
        ),
        http_min_rate=parse_number("ENGINEFARM_HTTP_MIN_RATE", env.get("ENGINEFARM_HTTP_MIN_RATE"), 16 * 1024, 0, 1e12),
        http_connections=int(
            parse_number("ENGINEFARM_HTTP_CONNECTIONS", env.get("ENGINEFARM_HTTP_CONNECTIONS"), 1, 1, 32)
        ),
        s3_verify=parse_bool("ENGINEFARM_S3_VERIFY", env.get("ENGINEFARM_S3_VERIFY")),
        channel=(env.get("ENGINEFARM_CHANNEL") or "").strip() or None,
        trusted_root=Path(env["ENGINEFARM_TRUSTED_ROOT"]).expanduser() if env.get("ENGINEFARM_TRUSTED_ROOT") else None,
        coreml_compute_units=parse_choice(
            "ENGINEFARM_COREML_COMPUTE_UNITS", env.get("ENGINEFARM_COREML_COMPUTE_UNITS"), COREML_COMPUTE_UNITS
        ),
        store_explicit=bool(env.get("ENGINEFARM_STORE")),
        max_artifact_size=parse_size("ENGINEFARM_MAX_ARTIFACT_SIZE", env.get("ENGINEFARM_MAX_ARTIFACT_SIZE"))
        or DEFAULT_MAX_ARTIFACT_SIZE,
        measure=parse_choice("ENGINEFARM_MEASURE", env.get("ENGINEFARM_MEASURE"), MEASURE_MODES).lower(),
        host_lock_dir=Path(env["ENGINEFARM_HOST_LOCK_DIR"]).expanduser()
        if env.get("ENGINEFARM_HOST_LOCK_DIR")
        else None,
        probe_cache=parse_bool("ENGINEFARM_PROBE_CACHE", env.get("ENGINEFARM_PROBE_CACHE") or "on"),
    )
