"""Store-side data is checked at the edge (issue 17, findings 3 and 6): a bad index entry is skipped with a warning
that names it, and every other artifact still resolves, in `load`, `fetch`, `ls` and `publish`; a malformed
manifest is refused before anything is cached, and an artifact that verifies but does not load is not kept."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import enginefarm
from enginefarm.cache.device_cache import DeviceCache
from enginefarm.cache.index import IndexEntry, parse_index, read_index
from enginefarm.cache.manifest import Manifest
from enginefarm.cache.stores import open_store
from enginefarm.errors import IntegrityError
from tests.releases import REF, artifact

GOOD = {
    "build_key": "e" * 64,
    "component": "lin",
    "precision": "fp32",
    "profile_name": "default",
    "target": "onnxruntime:cpu",
}

# Each replaces the whole entry, or one field of a valid one: the shapes that crashed fetch, load, ls and publish.
BAD_ENTRIES = {
    "null": None,
    "a list": [],
    "a string": "entry",
    "empty": {},
    "key not text": {**GOOD, "build_key": 5},
    "key not hex": {**GOOD, "build_key": "z" * 64},
    "target without device": {**GOOD, "target": "onnxruntime"},
    "target a number": {**GOOD, "target": 7},
    "component null": {**GOOD, "component": None},
    "precision a number": {**GOOD, "precision": 16},
    "benchmarks not a list": {**GOOD, "benchmarks": {"p50_ms": 1}},
    "benchmark speed text": {**GOOD, "benchmarks": [{"device": {"class": "cpu-x86_64-v3"}, "p50_ms": "fast"}]},
    "benchmark device null": {**GOOD, "benchmarks": [{"device": None, "p50_ms": 1.0}]},
    "constraints null": {**GOOD, "constraints": None},
    "runtime a string": {**GOOD, "constraints": {"runtime": "onnxruntime>=1"}},
    "os a string": {**GOOD, "constraints": {"os": "linux"}},
    "vram text": {**GOOD, "constraints": {"vram_mb": "lots"}},
    "size negative": {**GOOD, "size": -1},
    "profile corner text": {**GOOD, "profile": {"x": {"min": "1", "opt": [1], "max": [1]}}},
}


@pytest.fixture
def store_with_bad_entries(tmp_path):
    """m/lin published and loadable, plus every bad entry of BAD_ENTRIES in its index."""
    store = open_store(tmp_path / "store")
    good = artifact(store, tmp_path, "good")
    path = tmp_path / "store" / "index" / "m.json"
    index = json.loads(path.read_text())
    for i, (name, value) in enumerate(BAD_ENTRIES.items()):
        index["entries"][f"{i:02d}-{name}"] = value
    index["entries"]["f" * 64] = {**GOOD, "build_key": "d" * 64}  # filed under another key than it names
    path.write_text(json.dumps(index))
    return store, good


def test_a_bad_index_entry_is_skipped_with_a_warning_and_the_good_one_loads(store_with_bad_entries, caplog):
    store, good = store_with_bad_entries
    with caplog.at_level(logging.WARNING):
        session = enginefarm.load(REF, device="cpu", store=store.url)
    assert session.artifact.build_key == good.build_key
    assert session.run({"x": np.ones((1, 8), np.float32)})["y"].shape == (1, 8)
    warned = "\n".join(r.getMessage() for r in caplog.records)
    for i, name in enumerate(BAD_ENTRIES):
        assert f"entry {i:02d}-{name}"[:22] in warned, f"no warning names the bad entry {name!r}"
    assert "filed under" in warned


def test_fetch_ls_and_publish_skip_bad_entries_without_a_traceback(store_with_bad_entries, tmp_path, cli):
    store, good = store_with_bad_entries
    fetched = cli("fetch", REF, "--device", "cpu", "--store", store.url)
    assert fetched.returncode == 0 and good.build_key[:12] in fetched.stdout, fetched.stderr
    listed = cli("ls", "--store", store.url, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [row["build_key"] for row in json.loads(listed.stdout)] == [good.build_key]
    copied = cli("publish", "--from", store.url, "--to", str(tmp_path / "copy"))
    assert copied.returncode == 0 and "1 copied" in copied.stdout, copied.stderr
    for proc in (fetched, listed, copied):
        assert "Traceback" not in proc.stderr and "skipping" in proc.stderr  # the warning names what was left out
    assert set(read_index(open_store(tmp_path / "copy"), "m").entries) == {good.build_key}


@pytest.mark.parametrize(
    "raw", [b"[1, 2]", b"not json", b'{"format": 1, "entries": null}', b"[" * 100_000 + b"]" * 100_000]
)
def test_a_damaged_index_reads_as_empty(raw, caplog):
    assert parse_index(raw, "m").entries == {}
    assert "index of m" in caplog.text


def test_index_entries_round_trip_their_wire_form(tmp_path):
    store = open_store(tmp_path / "store")
    manifest = artifact(store, tmp_path, "a", p50=1.5)
    entry = read_index(store, "m").entries[manifest.build_key]
    assert entry == IndexEntry.of(manifest) == IndexEntry.from_dict(entry.to_dict(), "m")
    assert entry.model == "m" and entry.benchmarks[0].p50_ms == 1.5


def _valid_manifest_dict() -> dict:
    from tests.cache.test_store_conformance import make_manifest

    return make_manifest("x", "a" * 64, 10).to_dict()


@pytest.mark.parametrize(
    "field,value",
    [
        ("model", 5),
        ("target", "cpu"),
        ("build_key", "a" * 63),
        ("profile", {"x": {"min": [1]}}),
        ("toolchain", {"ort": 1}),
        ("files", {"model.onnx": 1}),
        (
            "files",
            [
                {
                    "path": "m",
                    "role": "model",
                    "size": "10",
                    "sha256": "a" * 64,
                    "codec": "none",
                    "stored_size": 10,
                    "stored_sha256": "a" * 64,
                }
            ],
        ),
        ("files", [{"path": "m"}]),
        ("io", {"inputs": "x"}),
        ("io", {"inputs": [{"name": "x", "dtype": "float33"}]}),
        ("constraints", {"os": "linux"}),
        ("benchmarks", [{"p50_ms": 1}]),
        ("options", []),
        ("validation", None),
    ],
)
def test_manifest_field_types_are_checked(field, value):
    data = {**_valid_manifest_dict(), field: value}
    with pytest.raises(IntegrityError, match="manifest is malformed"):
        Manifest.from_dict(data)


def test_a_manifest_path_with_a_trailing_newline_is_refused():
    data = _valid_manifest_dict()
    data["files"][0]["path"] = "model.onnx\n"
    with pytest.raises(IntegrityError):
        Manifest.from_dict(data)


def test_deeply_nested_manifest_json_is_an_integrity_error():
    with pytest.raises(IntegrityError, match="nested too deeply"):
        Manifest.from_json(b"[" * 100_000 + b"]" * 100_000)


def _rewrite_manifest(store, manifest: Manifest, **changes) -> None:
    path = store.root / "manifests" / f"{manifest.build_key}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_a_malformed_manifest_is_never_cached_and_a_fixed_store_loads(tmp_path, monkeypatch):
    """Finding 6: the manifest's files hash right but a field is wrong; before, it was cached, failed with an
    unhelpful error on every load even after the store was fixed, and `cache verify` said ok."""
    store = open_store(tmp_path / "store")
    good = artifact(store, tmp_path, "a")
    original = (store.root / "manifests" / f"{good.build_key}.json").read_bytes()
    _rewrite_manifest(store, good, io={"inputs": "x"})
    with pytest.raises(IntegrityError, match="io.inputs"):
        enginefarm.load(REF, device="cpu", store=store.url)
    assert list(DeviceCache(tmp_path / "home").entries()) == []
    (store.root / "manifests" / f"{good.build_key}.json").write_bytes(original)  # the store is fixed
    assert enginefarm.load(REF, device="cpu", store=store.url).artifact == good


def test_an_artifact_that_verifies_but_does_not_load_is_not_kept(tmp_path, caplog):
    """A store that served a model its backend cannot read (hashes consistent): after the store is fixed, the next
    load fetches again instead of failing on the cached copy forever."""
    from enginefarm.cache.artifacts import pack_files

    store = open_store(tmp_path / "store")
    good = artifact(store, tmp_path, "a")
    broken_src = tmp_path / "broken"
    broken_src.mkdir()
    (broken_src / "model.onnx").write_bytes(b"not an onnx model")
    files, blobs = pack_files(broken_src, [("model.onnx", "model")], tmp_path / "broken-blobs")
    for digest, path in blobs.items():
        store.put_blob(digest, path)
    manifest_path = store.root / "manifests" / f"{good.build_key}.json"
    original = manifest_path.read_bytes()
    manifest_path.write_bytes(Manifest.from_dict({**good.to_dict(), "files": [f.__dict__ for f in files]}).to_json())
    with pytest.raises(Exception) as caught:
        enginefarm.load(REF, device="cpu", store=store.url)
    assert str(caught.value).strip() and "failed" in str(caught.value) or "ONNX" in str(caught.value)
    assert list(DeviceCache(tmp_path / "home").entries()) == [], "an artifact that does not load must not stay cached"
    manifest_path.write_bytes(original)
    assert enginefarm.load(REF, device="cpu", store=store.url).artifact == good


def test_cache_verify_reports_a_malformed_cached_manifest(tmp_path, cli):
    store = open_store(tmp_path / "store")
    good = artifact(store, tmp_path, "a")
    enginefarm.load(REF, device="cpu", store=store.url)
    cached = tmp_path / "home" / "artifacts" / good.build_key / "manifest.json"
    cached.write_text(json.dumps({**json.loads(cached.read_text()), "io": {"inputs": "x"}}))
    proc = cli("cache", "verify")
    assert proc.returncode == 1 and f"evicted [{good.build_key[:12]}]" in proc.stdout, proc.stdout + proc.stderr
    assert not cached.parent.exists()


# A third-party store poisoning the cache (issue 25, finding 1) --------------------------------------------------
# Store A is anyone's; store G is the genuine one. A's artifact is a real, loadable m/lin with other weights (scale -1)
# that claims to be the fastest ever measured. Before the fix, one load from A made every later load of m/lin from G
# (same home) return A's model, pinned or not, even after A was gone; `cache verify` said ok.
def _weights_sign(session) -> float:
    """+1 for the genuine weights (scale 1), -1 for A's (scale -1): tests/models.py's W, fixed by its seed."""
    w = np.random.default_rng(1).normal(0, 0.3, (8, 8)).astype(np.float32)
    return round(float(session.run({"x": np.ones((1, 8), np.float32)})["y"].sum() / w.sum()))


@pytest.fixture
def genuine_and_evil(tmp_path):
    """(G, its m/lin, A, A's tampered m/lin), each published with its own index."""
    genuine = open_store(tmp_path / "G")
    good = artifact(genuine, tmp_path, "good")
    evil_store = open_store(tmp_path / "A")
    evil = artifact(evil_store, tmp_path, "evil", p50=0.0001, scale=-1.0)
    return genuine, good, evil_store, evil


def _refile_index(store, model: str, entry_changes: dict, as_model: str | None = None) -> None:
    """Rewrite store's index of m: every entry changed by `entry_changes`, filed as `as_model`'s index if given."""
    path = store.root / "index" / "m.json"
    index = json.loads(path.read_text())
    index["entries"] = {k: {**v, **entry_changes} for k, v in index["entries"].items()}
    if as_model:
        path.unlink()
        index["model"] = as_model
        path = store.root / "index" / f"{as_model}.json"
    path.write_text(json.dumps(index))


def test_a_manifest_naming_another_model_is_refused_and_never_cached(genuine_and_evil, tmp_path, cli):
    """The issue's attack: A's index/evil.json lists an entry whose manifest says m/lin."""
    genuine, good, evil_store, evil = genuine_and_evil
    _refile_index(evil_store, "m", {"component": "payload"}, as_model="evil")
    with pytest.raises(IntegrityError, match=r"names m/lin, asked for evil/payload") as caught:
        enginefarm.load("evil/payload", device="cpu", store=evil_store.url)
    assert caught.value.hint and "\n" not in str(caught.value)
    assert list(DeviceCache(tmp_path / "home").entries()) == [], "a model mismatch must not be cached under any name"
    proc = cli("fetch", "evil/payload", "--device", "cpu", "--store", evil_store.url)
    assert (
        proc.returncode == 1
        and "error:" in proc.stderr
        and "names m/lin" in proc.stderr
        and "Traceback" not in proc.stderr
    ), proc.stderr
    for pinned in ({}, {"target": "onnxruntime:cpu", "precision": "fp32"}):
        session = enginefarm.load(REF, device="cpu", store=genuine.url, **pinned)
        assert session.artifact == good and _weights_sign(session) > 0


@pytest.mark.parametrize(
    "field,value,asked,said",
    [
        ("component", "other", {"ref": "m/other"}, "names m/lin, asked for m/other"),
        ("precision", "fp16", {"precision": "fp16"}, "precision 'fp32' in the manifest, 'fp16' in the index"),
        ("model_version", "7", {"version": "7"}, "model_version '1' in the manifest, '7' in the index"),
        (
            "target",
            "openvino:cpu",
            {"target": "openvino:cpu"},
            "target 'onnxruntime:cpu' in the manifest, 'openvino:cpu' in the index",
        ),
    ],
)
def test_an_index_entry_that_its_manifest_contradicts_is_refused(field, value, asked, said, genuine_and_evil, tmp_path):
    """The index says one thing (what resolution ranked), the manifest another (what would be loaded)."""
    _, _, evil_store, evil = genuine_and_evil
    _refile_index(evil_store, "m", {field: value})
    asked = dict(asked)
    with pytest.raises(IntegrityError, match=said):
        enginefarm.load(asked.pop("ref", REF), device="cpu", store=evil_store.url, **asked)
    assert list(DeviceCache(tmp_path / "home").entries()) == []


def test_an_artifact_cached_from_another_store_never_stands_in_for_this_stores(genuine_and_evil, tmp_path):
    genuine, good, evil_store, evil = genuine_and_evil
    assert enginefarm.load(REF, device="cpu", store=evil_store.url).artifact == evil  # the user chose A once
    for pinned in ({}, {"target": "onnxruntime:cpu", "precision": "fp32"}, {"version": "1"}):
        session = enginefarm.load(REF, device="cpu", store=genuine.url, **pinned)
        assert session.artifact == good and _weights_sign(session) > 0, pinned
    assert "came from another store" in session.explain()
    import shutil

    shutil.rmtree(evil_store.root)  # A is gone: G still serves its own
    assert enginefarm.load(REF, device="cpu", store=genuine.url).artifact == good
    assert (
        enginefarm.load(REF, device="cpu", store=str(tmp_path / "G")).artifact == good
    )  # warm: from the cache, as G's


def test_a_manifest_claiming_another_stores_build_key_does_not_replace_it(tmp_path):
    """A publishes different weights under G's build key. Whatever the cache holds under that key, a load from G
    gets G's bytes, and a load from A gets A's."""
    genuine = open_store(tmp_path / "G")
    good = artifact(genuine, tmp_path, "good")
    evil_store = open_store(tmp_path / "A")
    forged = artifact(evil_store, tmp_path, "good", scale=-1.0)  # the same seed: the same build key
    assert forged.build_key == good.build_key and forged.files != good.files
    assert _weights_sign(enginefarm.load(REF, device="cpu", store=evil_store.url)) < 0
    session = enginefarm.load(REF, device="cpu", store=genuine.url)
    assert session.artifact == good and _weights_sign(session) > 0
    assert _weights_sign(enginefarm.load(REF, device="cpu", store=evil_store.url)) < 0
    assert _weights_sign(enginefarm.load(REF, device="cpu", store=genuine.url)) > 0


# Local store reads are capped, and special files refused (issue 25, finding 4) ---------------------------------
# Before: an index symlinked to /dev/zero was read until MemoryError (5.4 GB), a FIFO hung the reader for good.
# Each read runs in a child process with 1 GiB of address space and a timeout, so the unfixed code fails the test
# instead of taking the machine down.
SPECIAL_READER = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from enginefarm.cache.stores import open_store
from enginefarm.errors import StoreError
store, what = open_store(sys.argv[1]), sys.argv[2]
try:
    if what == "index":
        store.get_index_bytes("m")
    elif what == "manifest":
        store.get_manifest_bytes(sys.argv[3])
    elif what == "channel":
        store.open_channel_file("stable", "timestamp.json").read()
    else:
        store.open_blob(sys.argv[3]).read(1 << 20)
    print("read")
except StoreError as exc:
    print("refused:", exc)
"""


# Blobs are streams capped by their manifest's size (test_fault_injection); a big one is no fault.
@pytest.mark.parametrize(
    "what,special",
    [
        (w, s)
        for w in ("index", "manifest", "channel", "blob")
        for s in ("dev-zero", "fifo", "too-large")
        if (w, s) != ("blob", "too-large")
    ],
)
def test_a_store_file_that_is_special_or_endless_is_refused(what, special, tmp_path):
    import os
    import subprocess
    import sys

    store = open_store(tmp_path / "store")
    good = artifact(store, tmp_path, "a")
    path = {
        "index": store.root / "index" / "m.json",
        "manifest": store.root / "manifests" / f"{good.build_key}.json",
        "channel": store.root / "channels" / "stable" / "timestamp.json",
        "blob": store.root / "blobs" / "sha256" / good.files[0].stored_sha256[:2] / good.files[0].stored_sha256,
    }[what]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    if special == "dev-zero":
        path.symlink_to("/dev/zero")
    elif special == "fifo":
        os.mkfifo(path)
    else:
        with open(path, "wb") as handle:
            handle.truncate((64 << 20) + 1)  # sparse: one byte over the cap, no disk used
    key = good.files[0].stored_sha256 if what == "blob" else good.build_key
    proc = subprocess.run(
        [sys.executable, "-c", SPECIAL_READER, str(store.root), what, key], capture_output=True, text=True, timeout=20
    )
    assert proc.returncode == 0 and proc.stdout.startswith("refused:"), proc.stdout + proc.stderr[-500:]
    assert ("not a regular file" if special != "too-large" else "larger than") in proc.stdout


def test_an_http_store_that_redirects_to_a_local_file_says_so(tmp_path):
    """urllib follows http(s) redirects only: a redirect to file:// read "HTTP 302 Found"."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from enginefarm.errors import StoreError

    class Redirect(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(302)
            self.send_header("Location", "file:///etc/hostname")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        store = open_store(f"http://127.0.0.1:{server.server_address[1]}/store")
        with pytest.raises(StoreError, match="redirects to file:///etc/hostname") as refused:
            store.get_index_bytes("m")
        assert refused.value.hint and "\n" not in str(refused.value)
    finally:
        server.shutdown()
