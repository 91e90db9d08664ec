"""A store rebuilt or replaced at the same URL: the device cache serves what the store lists now, not what it served.

Before the fix, an artifact the old store had served stayed a candidate from the cache even though the new store's
index no longer listed it; with no benchmarks the two tied and the cached one (listed first) won, so the app ran the
old weights until ENGINEFARM_HOME was cleared. A pinned old version, or a new build with a lower version number,
served the old weights too. What an unreachable store served last is still served (by design: the cache is what
keeps an app running through an outage), until the store, reached again, is seen to have withdrawn it.
"""

from __future__ import annotations

import shutil
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

import enginefarm
from enginefarm.cache.stores import open_store
from enginefarm.errors import ArtifactNotFoundError
from tests.releases import REF, artifact


def _sign(session) -> int:
    """+1 for the old store's weights (scale 1), -1 for the new one's (scale -1): y = x @ W * scale."""
    w = np.random.default_rng(1).normal(0, 0.3, (8, 8)).astype(np.float32)
    return round(float(session.run({"x": np.ones((1, 8), np.float32)})["y"].sum() / w.sum()))


def _replace(root, tmp_path, *, version: str = "1"):
    """rm -rf the store at `root` and publish other weights (another build key) there: the new store's artifact."""
    shutil.rmtree(root)
    return artifact(open_store(root), tmp_path, f"new-{version}", scale=-1.0, version=version)


def test_a_store_replaced_at_the_same_path_serves_its_new_artifact_online_and_offline(tmp_path, monkeypatch):
    store = open_store(tmp_path / "S")
    old = artifact(store, tmp_path, "old")
    assert _sign(enginefarm.load(REF, device="cpu", store=store.url)) == 1
    new = _replace(store.root, tmp_path)  # the same model, version and target: only the weights differ
    assert new.build_key != old.build_key
    session = enginefarm.load(REF, device="cpu", store=store.url)
    assert session.artifact == new and _sign(session) == -1
    assert "1 cached artifact(s) of m are no longer in the store's index" in session.explain()
    monkeypatch.setenv("ENGINEFARM_OFFLINE", "1")  # the withdrawal is remembered: offline serves the new one too
    for named in (store.url, None):
        session = enginefarm.load(REF, device="cpu", store=named)
        assert session.artifact == new and _sign(session) == -1, named


@pytest.mark.parametrize(
    "new_version,pinned,served",
    [("2", "1", None), ("0.9", None, "0.9")],
    ids=["old version pinned, the store kept only v2", "the rebuild has a lower version"],
)
def test_a_version_the_replaced_store_no_longer_lists_is_not_served_from_the_cache(
    new_version, pinned, served, tmp_path
):
    store = open_store(tmp_path / "S")
    artifact(store, tmp_path, "old")
    enginefarm.load(REF, device="cpu", store=store.url)
    new = _replace(store.root, tmp_path, version=new_version)
    if served is None:
        with pytest.raises(ArtifactNotFoundError, match="version 1"):
            enginefarm.load(REF, device="cpu", store=store.url, version=pinned)
    else:
        session = enginefarm.load(REF, device="cpu", store=store.url, version=pinned)
        assert session.artifact == new and _sign(session) == -1


class _Server:
    """The folder `root` over HTTP on a fixed loopback port, stopped and started again like a real outage."""

    def __init__(self, root) -> None:
        self.root, self.port, self.server = root, 0, None
        self.start()
        self.url = f"http://127.0.0.1:{self.port}/S"

    def start(self) -> None:
        handler = partial(SimpleHTTPRequestHandler, directory=str(self.root))
        handler.log_message = lambda *args: None  # type: ignore[attr-defined]
        server = self.server = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        self.port = server.server_address[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


@pytest.mark.slow  # over a second of the quick loop's time (make test-fast)
def test_an_unreachable_store_serves_what_it_served_last_until_it_is_reached_again(tmp_path):
    artifact(open_store(tmp_path / "S"), tmp_path, "old")
    server = _Server(tmp_path)
    try:
        assert _sign(enginefarm.load(REF, device="cpu", store=server.url)) == 1
        _replace(tmp_path / "S", tmp_path)
        server.stop()  # the store cannot be asked: the cache keeps the app running with what it served
        session = enginefarm.load(REF, device="cpu", store=server.url)
        assert _sign(session) == 1 and "store unreachable" in session.explain()
        server.start()
        assert _sign(enginefarm.load(REF, device="cpu", store=server.url)) == -1
        server.stop()  # down again: what it withdrew meanwhile stays withdrawn
        assert _sign(enginefarm.load(REF, device="cpu", store=server.url)) == -1
    finally:
        server.stop()
