"""A warm load's short way: the pick a full `load()` made, remembered with what decided it, and opened again without
the resolver while none of that has changed.

A full load (runner/load.py) reads the store's index and the cache, detects the devices, ranks the candidates,
verifies the winner and opens it: about 50 ms of imports and checks beside the backend's own load, which a warm
start pays every time for the same answer. When a full load succeeds, it writes `home/warm/<request>.json`: the
artifact's folder and files, how its backend opened it (the session's `reopen_plan`), what the session needs to check
inputs, the explanation, and the state the pick was made from:
- the request: the arguments, every ENGINEFARM_* variable and the settings (the record's name is a checksum of
  it; the whole request is compared);
- the store's index file (directory stores; a remote store's freshness needs a request, the cost this saves: its
  loads take the full path), the cache's artifact folder (an artifact cached or evicted), the device timings
  (runner/measure.py), the machine's probe state (hardware/probe_cache.py: kernel, CPU, devices, drivers, SDK
  packages, the probe code), and enginefarm's own code that decides a pick (each file's stat: an upgrade or an
  edit decides again);
- the artifact's own manifest, `.origins` (a store withdrawing it) and golden-sample verdicts.
A record is written only when that state was the same before the pick and after it (a load that fetched, timed or
checked something writes none; the next one does).

The next load of the same request compares it all (stats, and the probe state, about 1 ms) and checks the artifact's
files against their proof exactly as the full path does (cache/proof.py: a file whose stat changed since it was
hashed). Anything different, missing or unreadable takes the full path, which decides again and writes a new record;
nothing here raises. Custom weights, LoRAs, release channels, remote stores and ENGINEFARM_PROBE_CACHE=off always
take the full path (`remembers`), as do backends whose sessions live outside enginefarm.sessions.

This module imports the standard library, the proof and the probe state; the backend's session module when it opens
(enginefarm.sessions): not the resolver, the index, the manifest classes, the backend registry or logging
(tests/runner/test_warm.py)."""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from enginefarm.runner.request import Request
    from enginefarm.runner.session import Session
    from enginefarm.settings import Settings

FOLDER = "warm"
_FORMAT = 1
_TIMINGS, _VERDICTS, _ARTIFACTS = "device-timings", "verdicts", "artifacts"


def request(asked: Request, settings: Settings) -> dict[str, Any]:
    """What a load was asked, as JSON values: equal requests get the same pick from the same state."""
    fields = {name: getattr(settings, name) for name in settings.__dataclass_fields__}
    recipe = None if asked.recipe is None else str(asked.recipe)
    record = {
        "format": _FORMAT,
        "args": [asked.ref, asked.precision, asked.device, asked.store, asked.target, asked.version, recipe],
        "settings": fields,
        "env": sorted((k, v) for k, v in os.environ.items() if k.startswith("ENGINEFARM_")),
    }
    return json.loads(json.dumps(record, default=str))  # the form it has once read back


def _stat(path: Path) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size, st.st_ino]


def state(home: Path, index_file: str | None) -> dict[str, Any]:
    """The state a pick is made from, less the artifact's own (`_artifact_state`)."""
    from enginefarm.hardware.probe_cache import machine_state, probe_code

    return {
        "index": None if index_file is None else [index_file, _stat(Path(index_file))],
        "artifacts": _stat(home / _ARTIFACTS),
        "timings": _stat(home / _TIMINGS),
        "machine": json.loads(json.dumps(machine_state(probe_code()))),
        "code": _code_state(),
    }


# The code that decides a pick: an upgrade or an edited file (an editable install keeps its version) decides again.
_CODE = Path(__file__).resolve().parents[1]
_CODE_FOLDERS = (".", "runner", "backends", "sessions", "cache", "enginefarm")  # ".": the installed package


def _code_state() -> list[list[Any]]:
    found = []
    for folder in _CODE_FOLDERS:
        try:
            with os.scandir(_CODE / folder) as entries:
                for entry in entries:
                    if entry.name.endswith(".py"):
                        st = entry.stat()
                        found.append([folder, entry.name, st.st_mtime_ns, st.st_size])
        except OSError:
            found.append([folder, None])
    return sorted(found, key=str)


def _artifact_state(home: Path, key: str) -> dict[str, Any]:
    folder = home / _ARTIFACTS / key
    return {
        "manifest": _stat(folder / "manifest.json"),
        "origins": _stat(folder / ".origins"),
        "verdicts": _stat(home / _VERDICTS / key),
    }


def _record_path(home: Path, asked: dict[str, Any]) -> Path:
    digest = zlib.crc32(json.dumps(asked, sort_keys=True).encode())
    return home / FOLDER / f"{digest:08x}.json"


def remember(asked: dict[str, Any], home: Path, before: dict[str, Any], after: dict[str, Any], session: Any) -> bool:
    """Write the record of a full load's pick (`session`, a runner Session) if the state it was made from held
    through the load and its backend can open it again. False when nothing was written (best effort: a read-only
    home, a full disk)."""
    plan = session._reopen_plan()
    if plan is None or before != after:
        return False
    manifest = session.artifact
    home = Path(home)
    record = {
        "request": asked,
        "state": after,
        "key": manifest.build_key,
        "artifact": _artifact_state(home, manifest.build_key),
        "files": [f.path for f in manifest.files],
        "plan": plan,
        "facts": {
            "ref": manifest.ref,
            "target": manifest.target,
            "precision": manifest.precision,
            "profile": manifest.profile,
            "io": manifest.io,
        },
        "explanation": session._explanation,
    }
    path = _record_path(home, asked)
    import threading  # here: a warm load writes nothing

    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # each writer its own
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(record, default=str), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # its folder could not be made either
            pass
        return False
    return True


def reopen(asked: dict[str, Any], home: Path, index_file: str | None) -> Session | None:
    """The remembered pick of `asked`, opened, if nothing it was made from has changed; else None (the full path)."""
    home = Path(home)
    path = _record_path(home, asked)
    try:
        record = json.loads(path.read_bytes())
        if record.get("request") != asked:
            return None
        key, plan = record["key"], record["plan"]
        if not (_is_key(key) and plan["module"].startswith(_SESSIONS)):
            _forget(path)  # a record this code did not write: only build keys and enginefarm's own sessions
            return None
        folder = home / _ARTIFACTS / key
        if record["state"] != state(home, index_file) or record["artifact"] != _artifact_state(home, key):
            return None
        raw = (folder / "manifest.json").read_bytes()
        if not _vouched(record, asked, folder, json.loads(raw)):
            _forget(path)  # the record names what the cache did not verify for this request
            return None
        from enginefarm.cache.proof import unproven

        if unproven(folder, record["files"]):
            return None  # a file changed since it was hashed: the full path hashes it again
        from importlib import import_module

        from enginefarm.runner.session import Session

        session = Session.reopened(
            import_module(plan["module"]).reopen(folder, plan), record["facts"], raw, key, record["explanation"]
        )
    except Exception:  # anything unexpected here is a reason to decide again, never an error
        return None
    try:
        os.utime(folder / ".last_used")  # the cache's LRU stamp, as the full path's verified_dir leaves it
    except OSError:
        pass
    return session


def _forget(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


# The plan's entries that name a file the backend opens (backends/onnxruntime.py, backends/openvino.py).
_PLAN_FILES = ("model", "ir", "blob")


def _vouched(record: dict[str, Any], asked: dict[str, Any], folder: Path, manifest: Any) -> bool:
    """Whether the record opens only what the cache verified for this request: its key, ref, target and precision
    are those of the manifest in the artifact's own folder and of the request, its facts are the manifest's, and
    every file its plan opens is one of that manifest's files, inside that folder. A writer of the home cannot make
    the short way serve a file the full path would not have (an absolute path, `../<other key>/`, another key)."""
    ref, precision, _device, _store, target, _version, _recipe = asked["args"]
    named = [f["path"] for f in manifest["files"]]
    facts = record["facts"]
    mine = {
        "ref": f"{manifest['model']}/{manifest['component']}",
        "target": manifest["target"],
        "precision": manifest["precision"],
        "profile": manifest["profile"],
        "io": manifest.get("io", {}),
    }
    if manifest["build_key"] != record["key"] or facts != mine or record["files"] != named:
        return False
    backend = manifest["target"].partition(":")[0]
    if mine["ref"] != ref or (target is not None and target not in (mine["target"], backend)):
        return False
    if precision is not None and precision != mine["precision"]:
        return False
    plan = record["plan"]
    opened = [plan[name] for name in _PLAN_FILES if name in plan]
    root = os.path.realpath(folder)
    for rel in opened:
        if not (isinstance(rel, str) and rel in named) or os.path.isabs(rel) or ".." in rel.split("/"):
            return False
        inside = os.path.normpath(os.path.join(root, rel))
        if os.path.realpath(inside) != inside:
            return False  # a link on the way: the cache writes none
    return bool(opened)


_SESSIONS = "enginefarm.sessions."
_HEX = frozenset("0123456789abcdef")


def _is_key(key: Any) -> bool:
    return isinstance(key, str) and len(key) == 64 and set(key) <= _HEX


def remembers(store: str | None, settings: Settings) -> bool:
    """Whether a load with these settings may be remembered: not from a remote store, whose index can change with no
    local trace (offline, or a directory store: yes), not inside a release channel, not with the probe cache off."""
    if settings.channel or settings.trusted_root or not settings.probe_cache:
        return False  # ENGINEFARM_PROBE_CACHE=off: the device state is not to be remembered, nor the pick made on it
    url = store or settings.store
    return settings.offline or "://" not in url or url.startswith("file://")


def index_file(model: str, store: str | None, settings: Settings) -> str | None:
    """The index file of `model` in a directory store, found without opening the store; None offline (no index is
    read then) or for what is not a model name. Only for a load that `remembers`."""
    if settings.offline:
        return None
    from enginefarm.cache.stores.base import index_relpath, local_root
    from enginefarm.errors import StoreError

    try:
        return str(local_root(store or settings.store) / index_relpath(model))
    except StoreError:  # not a model name: the lookup says so in its own words
        return None
