"""A recipe's https:// and hf:// sources download under the HTTP store's limits (builder/downloads.py): a deadline for
the whole file, a rate floor, a stall timeout, and a size cap (the recipe's `size` pin, else the Content-Length, else
UNPINNED_CAP); what a killed download left beside the file is reclaimed. Servers on loopback: one trickling a byte at a
time, one sending an endless body."""

from __future__ import annotations

import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from enginefarm.builder import downloads
from enginefarm.builder.downloads import download
from enginefarm.builder.planner import expand
from enginefarm.builder.recipe import load_recipe
from enginefarm.cache.stores.ranged import Limits
from enginefarm.errors import EnginefarmError
from tests import models
from tests.builder.test_remote_sources import recipe, sha


class Misbehaving:
    """GET /trickle: a byte every `pause` s of a declared 1 MB; /endless: zeros, no Content-Length, for 64 MiB;
    /stall: headers, then nothing; /file: `body` whole."""

    def __init__(self, pause: float = 0.2) -> None:
        self.body = b""
        self.stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                try:
                    if self.path.endswith("/trickle.onnx"):
                        self._trickle()
                    elif self.path.endswith("/endless.onnx"):
                        self.send_response(200)
                        self.end_headers()
                        for _ in range(1024):  # 64 MiB: endless to a client that stops at 1 MiB, never a full disk
                            if server.stop.is_set():
                                break
                            self.wfile.write(b"\0" * 65536)
                    elif self.path.endswith("/to-file.onnx"):
                        self.send_response(302)
                        self.send_header("Location", "file:///etc/hostname")
                        self.end_headers()
                    elif self.path.endswith("/stall.onnx"):
                        self.send_response(200)
                        self.send_header("Content-Length", "1000")
                        self.end_headers()
                        server.stop.wait(30)
                    else:
                        self.send_response(200)
                        self.send_header("Content-Length", str(len(server.body)))
                        self.end_headers()
                        self.wfile.write(server.body)
                except OSError:  # the client gave up
                    pass

            def _trickle(self):
                self.send_response(200)
                self.send_header("Content-Length", str(1 << 20))
                self.end_headers()
                while not server.stop.is_set():
                    self.wfile.write(b"\0")
                    self.wfile.flush()
                    time.sleep(pause)

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.http.shutdown()


@pytest.fixture
def server():
    s = Misbehaving()
    yield s
    s.close()


def _within(seconds: float, work):
    """What `work()` raised, or None; fails the test if it is still running after `seconds` (it holds a build)."""
    result: list = []

    def run():
        try:
            work()
            result.append(None)
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert result, f"still downloading after {seconds} s"
    return result[0]


def _one_line(exc) -> str:
    assert isinstance(exc, EnginefarmError), repr(exc)
    assert "\n" not in str(exc) and exc.hint
    return str(exc)


@pytest.mark.slow  # over a second of the quick loop's time (make test-fast)
def test_a_trickling_source_is_given_up_at_its_deadline(server, tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINEFARM_HTTP_DEADLINE", "2")
    path = recipe(tmp_path, f"{server.url}/trickle.onnx", "0" * 64, None)
    started = time.monotonic()
    said = _one_line(_within(15, lambda: expand(load_recipe(path), tmp_path / "downloads")))
    assert "2 s deadline" in said and time.monotonic() - started < 10
    assert not [p for p in (tmp_path / "downloads").rglob("*") if p.is_file()]  # nothing half written is kept


@pytest.mark.slow  # over a second of the quick loop's time (make test-fast)
def test_a_trickle_below_the_rate_floor_and_a_stall_are_refused(server, tmp_path):
    floor = Limits(deadline_s=60, min_rate=100_000, window_s=0.5)
    said = _one_line(
        _within(10, lambda: download(f"{server.url}/trickle.onnx", tmp_path / "dl" / "t.onnx", hf=False, limits=floor))
    )
    assert "below the" in said and "floor" in said
    said = _one_line(
        _within(10, lambda: download(f"{server.url}/stall.onnx", tmp_path / "dl" / "s.onnx", hf=False, limits=floor))
    )
    assert "no data for" in said
    assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == []


def test_an_endless_body_stops_at_the_pinned_size(server, tmp_path):
    path = recipe(tmp_path, f"{server.url}/endless.onnx", "0" * 64, None)
    text = path.read_text().replace('sha256 = "' + "0" * 64 + '"', 'sha256 = "' + "0" * 64 + '"\nsize = 100000')
    path.write_text(text)
    said = _one_line(_within(15, lambda: expand(load_recipe(path), tmp_path / "downloads")))
    assert "larger than its pinned size of 100000 bytes" in said
    assert not [p for p in (tmp_path / "downloads").rglob("*") if p.is_file()]


def test_an_endless_body_with_no_size_pinned_stops_at_the_cap(server, tmp_path, monkeypatch):
    monkeypatch.setattr(downloads, "UNPINNED_CAP", 1 << 20)
    said = _one_line(_within(15, lambda: download(f"{server.url}/endless.onnx", tmp_path / "dl" / "e.onnx", hf=False)))
    assert "larger than 1 MiB" in said
    assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == []


def test_a_pinned_size_is_checked_and_a_killed_downloads_leftover_is_reclaimed(server, tmp_path):
    graph = models.linear(tmp_path / "plain" / "model.onnx").read_bytes()
    server.body = graph
    downloads_dir = tmp_path / "downloads" / sha(graph)
    downloads_dir.mkdir(parents=True)
    left = downloads_dir / f".file.onnx.{os.getpid()}-1.0123456789ab.incomplete"  # a download killed (its owner gone)
    left.write_bytes(b"\0" * 4096)
    path = recipe(tmp_path, f"{server.url}/file.onnx", sha(graph), None)
    wrong = path.read_text().replace(f'sha256 = "{sha(graph)}"', f'sha256 = "{sha(graph)}"\nsize = {len(graph) + 1}')
    path.write_text(wrong)
    said = _one_line(_within(15, lambda: expand(load_recipe(path), tmp_path / "downloads")))
    assert f"{len(graph)} bytes" in said and f"pinned size of {len(graph) + 1}" in said
    assert not left.exists()  # reclaimed
    path.write_text(wrong.replace(f"size = {len(graph) + 1}", f"size = {len(graph)}"))
    [job] = expand(load_recipe(path), tmp_path / "downloads")
    assert job.source.path.read_bytes() == graph
    assert sorted(p.name for p in downloads_dir.iterdir()) == ["file.onnx"]


def test_a_redirect_to_a_local_file_is_refused_in_words(server, tmp_path):
    said = _one_line(_within(10, lambda: download(f"{server.url}/to-file.onnx", tmp_path / "dl" / "r.onnx", hf=False)))
    assert "redirect" in said and "file:///etc/hostname" in said


@pytest.mark.slow  # over a second of the quick loop's time (make test-fast)
def test_a_catalog_source_that_trickles_is_given_up_and_kept_to_resume(server, tmp_path, monkeypatch):
    """Catalog recipes fetch their pinned files resumably (builder/catalog_fetch.py): under the same limits."""
    from enginefarm.builder.catalog import PinnedFile
    from enginefarm.builder.catalog_fetch import fetch_file

    monkeypatch.setenv("ENGINEFARM_HTTP_DEADLINE", "2")
    pinned = PinnedFile("unet/w.safetensors", f"{server.url}/trickle.onnx", "0" * 64, 1 << 20)
    said = _one_line(_within(15, lambda: fetch_file(pinned, tmp_path / "dl")))
    assert "2 s deadline" in said
