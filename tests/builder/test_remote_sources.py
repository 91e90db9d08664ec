"""https:// and hf:// sources as the Hub serves them, from a real HTTP server on loopback: the .onnx and its external
data files, each pinned; gated repositories with a token that never leaves the Hub; one-line errors."""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from enginefarm.builder.planner import expand
from enginefarm.builder.recipe import load_recipe
from enginefarm.builder.sources import source_digest
from enginefarm.errors import RecipeError
from tests import models

TOKEN = "hf_secret"


class Server:
    """Files by URL path; paths under /gated/ want TOKEN; `redirect` sends a path's file through the other server."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str | None]] = []  # (path, Authorization)
        self.redirect: dict[str, str] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                server.requests.append((self.path, self.headers.get("Authorization")))
                if self.path.startswith("/gated/") and self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self.send_response(401 if self.headers.get("Authorization") is None else 403)
                    self.end_headers()
                elif self.path in server.redirect:
                    self.send_response(302)
                    self.send_header("Location", server.redirect[self.path])
                    self.end_headers()
                elif self.path in server.files:
                    body = server.files[self.path]
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self.send_response(404)
                    self.end_headers()

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def paths(self) -> list[str]:
        return [path for path, _ in self.requests]


@pytest.fixture
def hub(monkeypatch, tmp_path):
    servers = [Server(), Server()]  # the Hub, and a CDN it redirects large files to
    monkeypatch.setenv("HF_ENDPOINT", servers[0].url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    yield servers
    for server in servers:
        server.http.shutdown()


@pytest.fixture
def published(tmp_path):
    """A model saved as exporters save big ones: the graph in model.onnx, its weights in model.onnx.data."""
    import onnx

    original = models.linear(tmp_path / "original" / "model.onnx", scale=3.0)
    model = onnx.load(str(original))
    onnx.save(model, str(original), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    return original


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def recipe(tmp_path: Path, source: str, onnx_sha: str, pins: dict[str, str] | None) -> Path:
    pinned = (
        "" if pins is None else "external_sha256 = { " + ", ".join(f'"{k}" = "{v}"' for k, v in pins.items()) + " }\n"
    )
    path = tmp_path / "recipe.toml"
    path.write_text(
        '[model]\nname = "remote"\nversion = "1"\n\n[defaults]\nprecisions = ["fp32"]\ntargets = '
        f'["onnxruntime:cpu"]\n\n[components.m]\nsource = "{source}"\nsha256 = "{onnx_sha}"\n{pinned}\n'
        f"[components.m.profiles.default]\nbatch = [1, 1, 2]\n"
    )
    return path


def serve(server: Server, folder: str, original: Path) -> tuple[bytes, bytes]:
    graph, data = original.read_bytes(), original.with_name("model.onnx.data").read_bytes()
    server.files[f"{folder}/model.onnx"] = graph
    server.files[f"{folder}/model.onnx.data"] = data
    return graph, data


@pytest.mark.slow  # over a second of the quick loop's time (make test-fast)
def test_an_hf_source_brings_its_external_data_and_plans_the_same_source(hub, published, tmp_path):
    graph, data = serve(hub[0], "/org/repo/resolve/main/unet", published)
    path = recipe(tmp_path, "hf://org/repo/unet/model.onnx", sha(graph), {"model.onnx.data": sha(data)})
    downloads = tmp_path / "downloads"
    [job] = expand(load_recipe(path), downloads)
    assert job.source.digest == source_digest(published)  # the same model as the local one, weights included
    assert (downloads / sha(graph) / "model.onnx.data").read_bytes() == data
    import onnxruntime as ort

    x = np.ones((1, 8), np.float32)
    got = ort.InferenceSession(str(job.source.path)).run(None, {"x": x})[0]
    assert np.array_equal(got, ort.InferenceSession(str(published)).run(None, {"x": x})[0])

    before = len(hub[0].requests)
    expand(load_recipe(path), downloads)  # downloaded and matching: nothing is fetched again
    assert len(hub[0].requests) == before


@pytest.mark.slow  # over a second of the quick loop's time (make test-fast)
def test_unpinned_external_data_names_the_digests_to_check(hub, published, tmp_path):
    graph, data = serve(hub[0], "/org/repo/resolve/v2", published)
    with pytest.raises(RecipeError, match=f'external data is not pinned.*"model.onnx.data" = "{sha(data)}"'):
        expand(load_recipe(recipe(tmp_path, "hf://org/repo/model.onnx@v2", sha(graph), None)), tmp_path / "downloads")
    pinned = recipe(tmp_path, "hf://org/repo/model.onnx@v2", sha(graph), {"model.onnx.data": sha(data)})
    expand(load_recipe(pinned), tmp_path / "downloads")  # pinned now: what was downloaded is used

    hub[0].files["/org/repo/resolve/v2/model.onnx.data"] = (
        bytes([data[0] ^ 0xFF]) + data[1:]
    )  # changed on the server since
    with pytest.raises(RecipeError, match="does not match its sha256"):
        expand(load_recipe(pinned), tmp_path / "elsewhere")
    assert not (tmp_path / "elsewhere" / sha(graph) / "model.onnx.data").exists()  # nothing wrong is kept


def test_a_gated_repository_takes_a_token_that_stays_on_the_hub(hub, published, tmp_path, monkeypatch, cli):
    graph, data = serve(hub[0], "/gated/repo/resolve/main", published)
    hub[1].files["/cdn/blob"] = hub[0].files.pop("/gated/repo/resolve/main/model.onnx.data")
    hub[0].redirect["/gated/repo/resolve/main/model.onnx.data"] = f"{hub[1].url}/cdn/blob"
    path = recipe(tmp_path, "hf://gated/repo/model.onnx", sha(graph), {"model.onnx.data": sha(data)})

    proc = cli("plan", str(path), env={"ENGINEFARM_HOME": str(tmp_path / "home")})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "HTTP 401, a gated or private repository" in proc.stderr and "set HF_TOKEN" in proc.stderr, proc.stderr
    proc = cli("plan", str(path), env={"ENGINEFARM_HOME": str(tmp_path / "home"), "HF_TOKEN": "hf_wrong"})
    assert proc.returncode == 1 and "the token has no access" in proc.stderr, proc.stderr

    (tmp_path / "hf-home").mkdir()
    (tmp_path / "hf-home" / "token").write_text(TOKEN + "\n")  # where `huggingface-cli login` keeps it
    [job] = expand(load_recipe(path), tmp_path / "downloads")
    assert job.source.digest == source_digest(published)
    assert hub[1].requests == [("/cdn/blob", None)]  # the CDN never saw the token
    assert ("/gated/repo/resolve/main/model.onnx", f"Bearer {TOKEN}") in hub[0].requests


@pytest.mark.slow  # over a second of the quick loop's time (make test-fast)
def test_a_missing_file_and_a_location_outside_the_folder_are_one_line_errors(hub, tmp_path):
    with pytest.raises(RecipeError, match="HTTP 404, not found"):
        expand(load_recipe(recipe(tmp_path, "hf://org/repo/nothing.onnx", "0" * 64, {})), tmp_path / "downloads")
    escaping = models.external_data(tmp_path / "evil" / "model.onnx", "../../outside.bin").read_bytes()
    hub[0].files["/org/repo/resolve/main/model.onnx"] = escaping
    with pytest.raises(RecipeError, match="outside the model's folder"):
        expand(load_recipe(recipe(tmp_path, "hf://org/repo/model.onnx", sha(escaping), {})), tmp_path / "downloads")
    assert not any("outside" in p for p in hub[0].paths())  # refused before anything was fetched


def test_external_sha256_is_for_remote_sources(tmp_path):
    models.linear(tmp_path / "m.onnx")
    path = tmp_path / "recipe.toml"
    path.write_text(
        '[model]\nname = "x"\nversion = "1"\n[defaults]\nprecisions = ["fp32"]\ntargets = ["onnxruntime:cpu"]\n'
        '[components.m]\nsource = "m.onnx"\nexternal_sha256 = { "a" = "' + "0" * 64 + '" }\n'
    )
    with pytest.raises(RecipeError, match="is for https:// and hf:// sources"):
        load_recipe(path)


@pytest.mark.slow  # over a second of the quick loop's time (make test-fast)
def test_an_escaped_path_in_the_url_stays_in_the_download_folder(hub, tmp_path):
    graph = models.linear(tmp_path / "plain" / "model.onnx").read_bytes()
    hub[0].files["/a/%2F..%2F..%2Fescaped.onnx"] = graph
    downloads = tmp_path / "deep" / "downloads"
    [job] = expand(
        load_recipe(recipe(tmp_path, f"{hub[0].url}/a/%2F..%2F..%2Fescaped.onnx", sha(graph), None)), downloads
    )
    assert job.source.path == downloads / sha(graph) / "escaped.onnx"
    assert not (tmp_path / "escaped.onnx").exists() and not (tmp_path / "deep" / "escaped.onnx").exists()
