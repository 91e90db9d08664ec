"""The cache on the user's device (ENGINEFARM_HOME): verified, materialized artifacts, with LRU quota.

    artifacts/<build-key>/manifest.json + files   complete artifacts only (a directory appears by rename), with
                                                  `.origins`: the stores that served it, or this device (origins.py)
    tmp/                                          downloads in progress (<key>.<pid>-<start>.<random>.incomplete),
                                                  resumed by the next fetch if their process died
    locks/                                        best-effort, to avoid fetching the same artifact twice

Nothing is loaded that has not been hashed, and nothing is hashed twice: every byte is hashed as it is fetched,
and `verified_dir` re-hashes only files whose stat changed since (proof.py). `problems` hashes everything.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from enginefarm.errors import ArtifactNotFoundError, ConfigError, DiskFullError, IntegrityError, StoreError

from . import origins, proof, workdirs
from .atomic import aging_mtime, remove_tree, sha256_file
from .manifest import Manifest
from .progress import ProgressLike, as_progress

if TYPE_CHECKING:
    from .stores.base import Store

log = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
_USED_STAMP = ".last_used"
# What a backend compiled on this device from an artifact (OpenVINO's model cache: sessions/openvino_compiled.py),
# kept in the artifact's folder: held and evicted with it, and counted in its size against the quota.
COMPILED = ".compiled"
_READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)

RESTARTS = 3  # times a file is fetched again from zero when the object changes under the transfer


@dataclass(frozen=True)
class CachedArtifact:
    manifest: Manifest
    path: Path
    size: int
    last_used: float


@dataclass(frozen=True)
class Checked:
    """A cached artifact as `verify_all` found it: `manifest` is None where it was missing or malformed."""

    key: str
    manifest: Manifest | None
    problems: tuple[str, ...] = ()
    kept: bool = False  # damaged, but left in place: the cache is read-only

    @property
    def damaged(self) -> bool:
        return self.manifest is None or bool(self.problems)

    @property
    def evicted(self) -> bool:
        return self.damaged and not self.kept


def _mismatch(entry, store: Store, key: str, detail: str) -> IntegrityError:
    return IntegrityError(
        f"{entry.path} of {key[:12]} from {store.url}: the stored bytes do not match their manifest "
        f"(tampered or corrupt store): {detail}",
        hint="the artifact was not cached; report it to whoever publishes this store",
        key=key,
    )


_LEASE = ".in-use"  # `.in-use.<pid>-<start>` in an artifact's folder: a live process reads it; no gc evicts it


def hold(folder: Path) -> None:
    """Mark the cached artifact at `folder` as in use by this process until it exits: no gc, of this process or
    another, evicts it meanwhile (a pipeline reads its assets long after fetching them). Best effort: a read-only
    cache is evicted by no one either."""
    try:
        (Path(folder) / f"{_LEASE}.{workdirs.owner_tag()}").touch()
    except OSError:
        pass


def _held(folder: Path) -> bool:
    """Whether a live process holds the artifact at `folder` (the leases of processes that are gone are removed)."""
    held = False
    try:
        leases = [p for p in folder.iterdir() if p.name.startswith(f"{_LEASE}.")]
    except OSError:
        return False
    for lease in leases:
        if workdirs.owner_alive(lease) is True:
            held = True
        else:
            lease.unlink(missing_ok=True)
    return held


def compiled_bytes(path: Path) -> int:
    """What the device compiled from the artifact at `path` holds on disk (COMPILED)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path / COMPILED):
        for name in files:
            try:  # lstat: a static shape's IR links to the artifact's weights, counted with the artifact
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def _last_used(path: Path) -> float | None:
    """When the artifact at `path` was last used; None if it is gone."""
    for candidate in (path / _USED_STAMP, path):
        try:
            return aging_mtime(candidate)  # a future stamp would never be least recently used
        except FileNotFoundError:
            continue
    return None


class DeviceCache:
    def __init__(self, home: Path) -> None:
        self.home = Path(home)
        self.artifacts = self.home / "artifacts"
        self.tmp = self.home / "tmp"
        self.locks = self.home / "locks"

    def path_of(self, key: str) -> Path:
        return self.artifacts / key

    # Reading ---------------------------------------------------------------------------------------------
    def manifest(self, key: str) -> Manifest | None:
        try:
            raw = (self.path_of(key) / MANIFEST_NAME).read_bytes()
        except FileNotFoundError:
            return None
        try:
            return Manifest.from_json(raw, expect_key=key)
        except IntegrityError:
            log.warning("cached manifest %s is corrupt; evicting it", key[:12])
            try:
                self.evict(key)
            except ConfigError:  # a read-only cache: the entry stays, unused
                pass
            return None

    def manifest_in_use(self, key: str) -> Manifest:
        """The manifest of an artifact this process just added, compiled or found here. Another process's gc may
        evict it meanwhile (or a corrupt manifest was evicted just now): that is a one-line error to retry, not a
        None that fails later."""
        manifest = self.manifest(key)
        if manifest is None:
            raise ArtifactNotFoundError(
                f"artifact {key[:12]} left the local cache ({self.artifacts}) while in use: evicted by another process "
                "or found corrupt",
                hint="run it again: it is fetched or compiled anew",
                key=key,
            )
        return manifest

    def entries(self) -> Iterator[CachedArtifact]:
        if not self.artifacts.is_dir():
            return
        for path in sorted(self.artifacts.iterdir()):
            if path.name.startswith("."):
                continue
            manifest = self.manifest(path.name)
            if manifest is None:
                continue
            used = _last_used(path)
            if used is None:  # evicted meanwhile by another process (a second gc): no longer an entry
                continue
            yield CachedArtifact(manifest, path, sum(f.size for f in manifest.files) + compiled_bytes(path), used)

    def problems(self, key: str, *, trust_proof: bool = False) -> list[str]:
        """Hash every file of a cached artifact, or with `trust_proof` only those whose stat changed since they were
        last hashed (proof.py). Empty list: intact, and the proof is renewed."""
        manifest = self.manifest(key)
        if manifest is None:
            return ["not cached"]
        root = self.path_of(key)
        entries = manifest.files
        if trust_proof:
            changed = set(proof.unproven(root, [f.path for f in entries]))
            entries = tuple(f for f in entries if f.path in changed)
            if not entries:
                return []
        found = []
        for entry in entries:
            path = root / entry.path
            if not path.is_file():
                found.append(f"{entry.path}: missing")
            elif path.stat().st_size != entry.size:
                found.append(f"{entry.path}: {path.stat().st_size} bytes, expected {entry.size}")
            elif sha256_file(path) != entry.sha256:
                found.append(f"{entry.path}: sha256 mismatch")
        if not found:
            proof.record(root, [f.path for f in manifest.files])
        return found

    def verify_all(self) -> Iterator[Checked]:
        """Hash every file of every cached artifact; evict the damaged ones (they are fetched again when needed) and
        those whose manifest is missing or malformed. Yields each artifact once checked, those without a manifest first.
        A read-only cache is checked all the same; its damaged artifacts are reported and `kept`."""
        read_only = self.read_only() is not None
        before = (
            {p.name for p in self.artifacts.iterdir() if not p.name.startswith(".")}
            if self.artifacts.is_dir()
            else set()
        )
        entries = list(self.entries())  # reading each manifest checks it; a malformed one is evicted
        for key in sorted(before - {e.manifest.build_key for e in entries}):
            if not read_only:
                self.evict(key)
            yield Checked(key, None, kept=read_only)
        for entry in entries:
            key = entry.manifest.build_key
            problems = tuple(self.problems(key))
            if problems and not read_only:
                self.evict(key)
            yield Checked(key, entry.manifest, problems, kept=read_only and bool(problems))

    def verified_dir(self, key: str) -> Path | None:
        """The artifact's directory if its files are the ones hashed (re-hashing those whose stat changed since);
        a damaged entry is evicted and None returned."""
        if self.manifest(key) is None:
            return None
        found = self.problems(key, trust_proof=True)
        if found:
            log.warning("cached artifact %s is damaged (%s); evicting it", key[:12], "; ".join(found))
            self.evict(key)
            return None
        self.touch(key)
        return self.path_of(key)

    def origins(self, key: str) -> set[str]:
        """Where the cached artifact came from (origins.py). Artifacts cached before origins were recorded count as
        this device's only if they were built here."""
        found = origins.read(self.path_of(key))
        if not found and (self.path_of(key) / MANIFEST_NAME).is_file():
            manifest = self.manifest(key)
            if manifest is not None and manifest.provenance.get("built_on_device"):
                return {origins.THIS_DEVICE}
        return found

    def served_by(self, key: str, origin: str) -> bool:
        """True if the cached artifact is what `origin` (a store's URL) served, or was built on this device."""
        return bool(self.origins(key) & {origin, origins.THIS_DEVICE})

    def withdraw(self, key: str, origin: str) -> bool:
        """`origin` no longer lists the cached artifact (its index was read and lacks the key): forget that it served
        it. True if the artifact is now withheld from loads from `origin`; False if this device built it (the store's
        index never lists those)."""
        if origins.THIS_DEVICE in self.origins(key):
            return False
        origins.discard(self.path_of(key), origin)
        return True

    def withdrawn(self, key: str) -> bool:
        """True if every store that served the cached artifact has withdrawn it since (`withdraw`); such an artifact is
        not offered even where the whole cache is (offline, no store named)."""
        return origins.withdrawn(self.path_of(key))

    def built_here_dir(self, key: str) -> Path | None:
        """The verified folder of an artifact this device built (compiled, patched, refitted) under `key`; None if the
        cache holds none, or holds one a store served under that key (a store chooses its manifests' keys)."""
        if origins.THIS_DEVICE not in self.origins(key):
            return None
        return self.verified_dir(key)

    def cached_as(self, manifest: Manifest, origin: str) -> Path | None:
        """The verified folder of exactly `manifest`, now recorded as served by `origin` too; None if not cached.
        Another artifact cached under the same build key (another store's manifest claiming it) is evicted: it is not
        what `origin` serves, and the caller fetches the real one in its place."""
        key = manifest.build_key
        cached = self.manifest(key)
        if cached is None:
            return None
        if cached != manifest:
            log.warning(
                "cached artifact %s is not the one %s serves under that build key (from %s); replacing it",
                key[:12],
                origin,
                ", ".join(sorted(self.origins(key))) or "an unrecorded store",
            )
            self.evict(key)
            return None
        path = self.verified_dir(key)
        if path is not None:
            origins.add(path, origin)
        return path

    def touch(self, key: str) -> None:
        stamp = self.path_of(key) / _USED_STAMP
        try:
            stamp.touch()
        except OSError:
            pass

    # Writing ---------------------------------------------------------------------------------------------
    def fetch(
        self, store: Store, manifest: Manifest, progress: ProgressLike = None, *, limit: int | None = None
    ) -> Path:
        """Download, decode and verify every file of `manifest` from `store`, then move the artifact into place.

        `limit` caps what an unsigned manifest may claim (ENGINEFARM_MAX_ARTIFACT_SIZE): decoding never writes past
        the manifest's sizes, so this bounds what a lying manifest can make the cache write. Free space is checked
        first. A damaged or truncated blob raises IntegrityError and leaves no cache entry behind; an interrupted
        download (a kill, a broken network) is resumed by the next fetch of the same artifact."""
        # Imported here: a warm load finds its artifact cached and never downloads (time to first inference).
        from . import resume
        from .faults import checkpoint
        from .locks import file_lock
        from .space import ensure_room, full_disk_as_error, mb

        key = manifest.build_key
        report = as_progress(progress)
        total = sum(f.size for f in manifest.files)
        if limit is not None and total > limit:
            raise IntegrityError(
                f"{manifest.ref} [{key[:12]}] claims {mb(total)} MB, more than the {mb(limit)} MB "
                "ENGINEFARM_MAX_ARTIFACT_SIZE allows; nothing was fetched",
                key=key,
                hint="raise ENGINEFARM_MAX_ARTIFACT_SIZE if you trust this store (or load through a signed release "
                "channel)",
            )
        with file_lock(self.locks / f"{key}.lock"):
            existing = self.cached_as(manifest, store.url)
            if existing is not None:
                return existing
            staging = self._adopt(key)
            kept = False
            try:
                ensure_room(self.tmp, total - workdirs.size_of(staging))
                with full_disk_as_error(self.tmp, total):
                    done = 0
                    name = f"{manifest.ref} {manifest.target} {manifest.precision}"
                    for entry in manifest.files:
                        dest = staging / entry.path
                        if not resume.is_complete(dest, entry):
                            self._fetch_file(
                                store, entry, dest, lambda n, base=done: report.transfer(name, base + n, total), key
                            )
                            checkpoint("fetch:file")
                        done += entry.size
                    checkpoint("fetch:commit")
                    return self._commit(staging, manifest, store.url)
            except (StoreError, KeyboardInterrupt) as exc:
                # A broken transfer or an interrupt: the next fetch of this artifact resumes from what was written.
                # Bad bytes are never resumed, and a full disk needs the space back.
                kept = not isinstance(exc, (IntegrityError, DiskFullError)) and workdirs.size_of(staging) > 0
                raise
            finally:
                if not kept:
                    shutil.rmtree(staging, ignore_errors=True)

    def _adopt(self, key: str) -> Path:
        """This artifact's download that a dead process (or an earlier failed fetch of ours) left, now ours;
        else a new staging folder. Other leftovers of the same artifact are removed."""
        found = (
            [p for p in self.tmp.glob(f"{key}.*.incomplete") if workdirs.owner_alive(p) is False or workdirs.mine(p)]
            if self.tmp.is_dir()
            else []
        )
        found.sort(key=workdirs.size_of, reverse=True)
        for extra in found[1:]:
            workdirs.remove(extra)
        staging = workdirs.unique_name(self.tmp, key, ".incomplete")
        if found:
            try:
                os.replace(found[0], staging)
                return staging
            except OSError:  # reclaimed under us: start afresh
                pass
        staging.mkdir(parents=True)
        return staging

    def _fetch_file(self, store: Store, entry, dest: Path, on_bytes, key: str) -> None:
        from . import resume
        from .blob_codecs import decode_stream
        from .stores.ranged import BlobChanged

        dest.parent.mkdir(parents=True, exist_ok=True)
        resumed, offset = resume.plan(store, entry, dest)
        for attempt in range(RESTARTS + 2):
            try:
                with (
                    store.open_blob(
                        entry.stored_sha256, entry.stored_size, **({"offset": offset} if offset else {})
                    ) as src,
                    open(dest, "r+b" if resumed else "wb") as out,
                ):
                    if resumed:
                        out.seek(resumed.done)
                    digest = decode_stream(
                        src, out, entry.codec, entry.size, on_bytes, **({"resume": resumed} if resumed else {})
                    )
            except IntegrityError as exc:  # truncated, too long, a bomb, not valid for its codec
                raise _mismatch(entry, store, key, str(exc)) from None
            except BlobChanged as exc:
                if attempt >= RESTARTS:
                    raise IntegrityError(
                        f"file {entry.path} from {store.url} keeps changing or does not match its manifest ({exc})",
                        hint="the artifact was not cached; the store's copy may be damaged",
                        key=key,
                    ) from None
                log.info("%s; fetching %s again from the start", exc, entry.path)
                resumed, offset = None, 0
                continue
            if digest == entry.sha256:
                return
            if resumed is None:
                break
            log.info(
                "%s does not verify after resuming; fetching it again from the start", entry.path
            )  # the kept prefix was bad
            resumed, offset = None, 0
        raise _mismatch(entry, store, key, "sha256 differs")

    def add_local(self, manifest: Manifest, source_dir: Path) -> Path:
        """Cache an artifact built on this device (files are copied and verified like a download)."""
        key = manifest.build_key
        staging = self._staging(key)
        try:
            for entry in manifest.files:
                dest = staging / entry.path
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source_dir / entry.path, dest)
                if sha256_file(dest) != entry.sha256:
                    raise IntegrityError(f"built file {entry.path} changed while caching it", key=key)
            return self._commit(staging, manifest, origins.THIS_DEVICE)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _staging(self, key: str) -> Path:
        return workdirs.fresh(self.tmp, key, ".incomplete")

    def _commit(self, staging: Path, manifest: Manifest, origin: str) -> Path:
        """Every file in `staging` has just been hashed against `manifest` (as it was fetched from `origin`, or
        copied)."""
        proof.record(staging, [f.path for f in manifest.files])  # moving the folder keeps each file's stat
        origins.write(staging, {origin})
        (staging / MANIFEST_NAME).write_bytes(manifest.to_json())
        with open(staging / MANIFEST_NAME, "rb") as handle:
            os.fsync(handle.fileno())
        final = self.path_of(manifest.build_key)
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(staging, final)
        except OSError:
            # Another process committed the same key first: theirs is as good as ours if it is the same manifest
            # (not another store's under this key) and verifies.
            if self.manifest(manifest.build_key) != manifest or self.verified_dir(manifest.build_key) is None:
                remove_tree(final)
                os.replace(staging, final)
            else:
                origins.add(final, origin)
        self.touch(manifest.build_key)
        return final

    def evict(self, key: str) -> None:
        try:
            remove_tree(self.path_of(key))
        except OSError as exc:
            if exc.errno not in _READ_ONLY_ERRNOS:
                raise
            raise self._read_only_error(f"cannot evict {key[:12]}", exc.strerror or str(exc)) from None

    def read_only(self) -> str | None:
        """Why this cache cannot be changed ("read-only file system", "no write permission"); None if it can."""
        for folder in (self.home, self.artifacts, self.tmp, self.home / "build" / "jobs"):
            if folder.is_dir() and not os.access(folder, os.W_OK):
                return (
                    "read-only file system"
                    if os.statvfs(folder).f_flag & os.ST_RDONLY
                    else f"no write permission on {folder}"
                )
        return None

    def _read_only_error(self, what: str, why: str) -> ConfigError:
        return ConfigError(
            f"{what}: the cache at {self.home} is read-only ({why})",
            variable="ENGINEFARM_HOME",
            hint="run it as the cache's owner, or set ENGINEFARM_HOME to a writable folder",
        )

    def check_writable(self, what: str) -> None:
        """Raise a one-line ConfigError saying `what` cannot be done if the cache is read-only."""
        why = self.read_only()
        if why is not None:
            raise self._read_only_error(what, why)

    # Housekeeping ----------------------------------------------------------------------------------------
    def size(self) -> int:
        """Bytes the cache holds: artifacts, plus downloads and build folders in progress or left behind."""
        return sum(entry.size for entry in self.entries()) + self.work_size()

    def _work_items(self) -> list[Path]:
        return [p for folder in (self.tmp, self.home / "build" / "jobs") if folder.is_dir() for p in folder.iterdir()]

    def work_size(self) -> int:
        return sum(workdirs.size_of(p) for p in self._work_items())

    def gc(self, quota: int | None, *, keep: AbstractSet[str] = frozenset(), max_tmp_age: float = 86400.0) -> list[str]:
        """Reclaim what dead processes left (build folders at once; downloads, which a later fetch would resume,
        once older than `max_tmp_age`), then evict least-recently-used artifacts until everything, leftovers
        included, fits `quota` bytes. Leftovers go before any artifact."""
        removed: list[str] = []
        now = time.time()
        workdirs.reclaim(self.home / "build" / "jobs")
        for path in self._work_items():
            alive = workdirs.owner_alive(path)
            try:
                old = now - aging_mtime(path, now) > max_tmp_age
            except FileNotFoundError:
                continue
            if alive is False and (old or path.parent != self.tmp) or alive is None and old:
                workdirs.remove(path)
        if quota is None:
            return removed
        entries = sorted(self.entries(), key=lambda e: e.last_used)
        total = sum(e.size for e in entries) + self.work_size()
        for path in (p for p in self._work_items() if workdirs.owner_alive(p) is not True):
            if total <= quota:
                break
            total -= workdirs.remove(path)
        for entry in entries:
            if total <= quota:
                break
            if entry.manifest.build_key in keep or _held(entry.path):
                continue
            self.evict(entry.manifest.build_key)
            total -= entry.size
            removed.append(entry.manifest.build_key)
        return removed
