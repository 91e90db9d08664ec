"""OpenVINO's compiled models kept on the device, inside the artifact's own cache folder, so that a warm start
compiles nothing and a request's static shape is compiled once per device.

    artifacts/<build-key>/.compiled/ov-<version>-<device>-<digest>/
        dynamic/                 OpenVINO's model cache (CACHE_DIR) of the IR as built: dynamic within its profile
        static-<shape digest>/   the same for the IR reshaped to one request's static input shapes
        shapes.json              per shape: static or dynamic, chosen by timing both here, and when last used

The folder name keys what a compiled blob is valid for: the OpenVINO version, the device as OpenVINO names it (its
full name and optimization capabilities) and the compile config; OpenVINO keys its own blobs by the model and
config again. Being inside the artifact's folder, the blobs are held, counted in the cache quota
(cache/device_cache.py `compiled_bytes`) and evicted with it. A blob is trusted only while its stat is the one
recorded just after OpenVINO wrote it (as cache/proof.py does for an artifact's files); one that changed since, or
was never recorded, is deleted before the compile, which then writes it anew. OpenVINO itself recompiles over a
blob it cannot read.

Static shapes are bounded: at most MAX_STATIC_SHAPES compiled per artifact and tag, least recently used removed.
Standard library only: a warm load imports this.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

FOLDER = ".compiled"  # the device cache's COMPILED (cache/device_cache.py): evicted and counted with the artifact
MAX_STATIC_SHAPES = 3  # compiled static shapes kept per artifact (each holds the weights again)
ROOM_FACTOR = 2  # a compile is kept only while the disk has this many times the IR's weights free
MAX_CHOICES = 32  # remembered static-or-dynamic verdicts per artifact
_CHOICES = "shapes.json"
_PROOF = ".verified"


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _unproven(folder: Path, names: list[str]) -> list[str]:
    try:
        stamps = json.loads((folder / _PROOF).read_bytes())
    except (OSError, ValueError):
        return names
    out = []
    for name in names:
        try:
            if not isinstance(stamps, dict) or stamps.get(name) != _stamp(folder / name):
                out.append(name)
        except OSError:
            out.append(name)
    return out


def _record(folder: Path, names: list[str]) -> None:
    tmp = folder / f"{_PROOF}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps({name: _stamp(folder / name) for name in names}), encoding="utf-8")
        os.replace(tmp, folder / _PROOF)
    except OSError:
        tmp.unlink(missing_ok=True)


def tag_dir(artifact: Path, version: str, device: str, identity: dict[str, Any], config: dict[str, str]) -> Path:
    """The folder of the compiled models valid for this OpenVINO, device and config."""
    canon = json.dumps({"device": identity, "config": config}, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canon.encode()).hexdigest()[:16]
    return Path(artifact) / FOLDER / f"ov-{version}-{device.lower()}-{digest}"


def usable(tag: Path) -> bool:
    """Make the tag folder, and drop those of other OpenVINO versions (never loaded by this one). False where the
    cache cannot be written (a read-only cache compiles without keeping anything)."""
    root = tag.parent
    try:
        tag.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    if not os.access(tag, os.W_OK):
        return False
    version = tag.name.split("-")[1]
    try:
        for sibling in root.iterdir():
            if sibling.name.startswith("ov-") and sibling.name.split("-")[1] != version:
                shutil.rmtree(sibling, ignore_errors=True)
    except OSError:
        pass
    return True


def room_for(tag: Path, weights: Path) -> bool:
    """Whether the disk has room for a compiled copy of the IR's `weights` and then some; a full disk is the cache's
    to refuse at fetch time, not a compile's to cause."""
    try:
        return shutil.disk_usage(tag).free > ROOM_FACTOR * os.stat(weights).st_size
    except OSError:
        return False


def _blobs(folder: Path) -> list[str]:
    try:
        return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    except OSError:
        return []


def before_compile(folder: Path) -> list[str]:
    """Delete what OpenVINO must not load from `folder` (a file changed since it was recorded, or never recorded);
    return what is left, to tell afterwards whether the compile wrote anything."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in _unproven(folder, _blobs(folder)):
        try:
            (folder / name).unlink()
        except OSError:
            pass
    return _blobs(folder)


def after_compile(folder: Path, before: list[str]) -> bool:
    """Record the stat of what the compile wrote. True when it wrote something (the compile was not a cache hit)."""
    now = _blobs(folder)
    if now == before:
        try:
            os.utime(folder)  # last used, for the static shapes' LRU
        except OSError:
            pass
        return False
    _record(folder, now)
    return True


def shape_key(shapes: dict[str, tuple[int, ...]]) -> str:
    canon = json.dumps({k: list(v) for k, v in sorted(shapes.items())}, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


def static_dir(tag: Path, key: str) -> Path:
    return tag / f"static-{key}"


STATIC_IR = ".model.xml"  # a dot name: the compile's blob check (_blobs) leaves it alone
_PARAMETER = re.compile(r'<layer id="\d+" name="([^"]+)" type="Parameter".*?</layer>', re.S)


def static_ir(xml: Path, folder: Path, shapes: dict[str, tuple[int, ...]]) -> Path | None:
    """The IR at `xml` with its inputs fixed to `shapes`, as a file in `folder` whose weights are a link to `xml`'s
    (no copy), or None where it cannot be written (a file system without symbolic links, an input not in
    `shapes`). OpenVINO keys its cache of a model read from a path by the file, cheaply; the same model reshaped in
    memory is keyed by hashing every weight, which cost a 0.57 GB UNet ~1.5 s at each start. The file is written only
    when its text changes: OpenVINO's key holds the file's time."""
    seen: set[str] = set()

    def fixed(match: re.Match) -> str:
        name = match.group(1)
        dims = shapes[name]  # KeyError: an input we were not given the shape of
        seen.add(name)
        block = re.sub(r'shape="[^"]*"', f'shape="{",".join(map(str, dims))}"', match.group(0), count=1)
        given = iter(dims)
        return re.sub(r"<dim>-?\d+</dim>", lambda _: f"<dim>{next(given)}</dim>", block)

    try:
        text = _PARAMETER.sub(fixed, xml.read_text(encoding="utf-8"))
        if seen != set(shapes):
            return None
        out, weights = folder / STATIC_IR, folder / (STATIC_IR[: -len(".xml")] + ".bin")
        if not weights.is_symlink() or os.readlink(weights) != os.path.relpath(xml.with_suffix(".bin"), folder):
            weights.unlink(missing_ok=True)
            weights.symlink_to(os.path.relpath(xml.with_suffix(".bin"), folder))
        if not out.is_file() or out.read_text(encoding="utf-8") != text:
            tmp = folder / f"{STATIC_IR}.{os.getpid()}.tmp"
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, out)
        return out
    except (OSError, KeyError, StopIteration, NotImplementedError):
        return None


def choices(tag: Path) -> dict[str, Any]:
    """Per shape key: {"shape", "pick": "static"|"dynamic", "static_ms", "dynamic_ms", "used"}."""
    try:
        found = json.loads((tag / _CHOICES).read_bytes())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def remember(tag: Path, key: str, entry: dict[str, Any]) -> None:
    """Write a shape's verdict; keep the newest MAX_CHOICES, and the compiled static shapes within their bound."""
    found = choices(tag)
    found[key] = {**entry, "used": time.time()}
    newest = sorted(found, key=lambda k: found[k].get("used", 0), reverse=True)[:MAX_CHOICES]
    _write(tag, {k: found[k] for k in newest})
    bound_static(tag, keep=key)


def _write(tag: Path, found: dict[str, Any]) -> None:
    tmp = tag / f".{_CHOICES}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(found, sort_keys=True), encoding="utf-8")
        os.replace(tmp, tag / _CHOICES)
    except OSError:
        tmp.unlink(missing_ok=True)


def bound_static(tag: Path, keep: str) -> list[str]:
    """Remove the least recently used compiled static shapes beyond MAX_STATIC_SHAPES (and those dynamic won)."""
    found = choices(tag)
    folders = [p for p in tag.glob("static-*") if p.is_dir()]
    removed = []
    for folder in folders:
        key = folder.name.removeprefix("static-")
        if found.get(key, {}).get("pick") == "dynamic":  # timed slower here: its blob would never be loaded
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(key)
    live = sorted((p for p in folders if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    for folder in live[MAX_STATIC_SHAPES:]:
        key = folder.name.removeprefix("static-")
        if key != keep:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(key)
    return removed
