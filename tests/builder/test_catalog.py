"""Catalog recipes: every published model's recipe parses, plans offline, routes and carries pins of the right shape;
`lock` and the verified, resumable download run against a real HTTP server on loopback (Range requests included)."""

from __future__ import annotations

import hashlib
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from enginefarm.builder.catalog import CHECKPOINT, catalog_paths, load_catalog_recipe, lock_path
from enginefarm.builder.catalog_fetch import check_locked, fetch_file, lock
from enginefarm.builder.catalog_plan import PARAMETERS, _components, plan_catalog
from enginefarm.errors import ConfigError, RecipeError, SourceError

ROOT = Path(__file__).resolve().parents[2]
CATALOG = ROOT / "recipes" / "catalog"
RUNNERS = ROOT / "ci" / "runners.toml"


def test_every_catalog_recipe_parses_with_pins_of_the_right_shape():
    paths = catalog_paths([CATALOG])
    names = {load_catalog_recipe(p).name for p in paths}
    assert {"sd-1.5", "sdxl-base-1.0", "flux.1-dev", "sd3.5-large", "chroma", "realesrgan-x4plus"} <= names
    pinned = 0
    for path in paths:
        recipe = load_catalog_recipe(path)
        assert recipe.licence and isinstance(recipe.gated, bool)
        for f in recipe.files:
            if f.pinned:
                pinned += 1
                assert re.fullmatch(r"[0-9a-f]{64}", f.sha256 or ""), f
                assert isinstance(f.size, int) and f.size > 0, f
                if f.url.startswith("hf://"):
                    assert re.fullmatch(r"[0-9a-f]{40}", f.revision or ""), f
            else:
                assert f.url.startswith("hf://") and f.revision or f.url.startswith("https://"), f
            text = path.read_text()
            assert ("UNLOCKED" in text) or all(g.pinned for g in recipe.files if g.path == CHECKPOINT), path
    assert (
        pinned >= 9
    )  # SD 1.5, SDXL base, refiner, Turbo, Flux.1 schnell and dev; Real-ESRGAN x4plus and anime, GFPGAN 1.4


def test_the_catalog_plans_offline_and_every_job_routes():
    planned = plan_catalog(catalog_paths([CATALOG]), RUNNERS)
    assert planned.jobs and not planned.unroutable
    sdxl_unet = [j for j in planned.jobs if j.model == "sdxl-base-1.0" and j.component == "unet"]
    assert {j.target for j in sdxl_unet} == {"onnxruntime:cpu", "openvino:cpu", "tensorrt-rtx:ampere+"}
    # 2.567 B parameters: 10.3 GB at fp32, stored at fp16 as half; its need (20.6 GB) is over the 16 GB hosted runner
    assert all(j.weight_bytes == 4 * 2_567_463_684 and j.stored_bytes == j.weight_bytes // 2 for j in sdxl_unet)
    assert all(j.runner == "big-cpu" and j.need_gb > 16 for j in sdxl_unet)
    assert sum(planned.jobs_per_runner().values()) == len(planned.jobs)
    flux = next(j for j in planned.jobs if j.model == "flux.1-dev" and j.component == "transformer")
    assert flux.need_gb > 90 and flux.seconds > sdxl_unet[0].seconds
    assert {p.name for p in CATALOG.glob("taes*.toml")} <= {Path(u).name for u in planned.unknown}


def test_plan_of_the_catalog_folder_prints_every_job_and_the_totals(cli):
    import json

    shown = json.loads(cli("plan", str(CATALOG), "--runners", str(RUNNERS), "--format", "json", check=True).stdout)
    planned = plan_catalog(catalog_paths([CATALOG]), RUNNERS)
    assert len(shown["jobs"]) == len(planned.jobs) and shown["jobs_per_runner"] == planned.jobs_per_runner()
    assert {"model", "component", "target", "precision", "need_gb", "seconds", "stored_bytes", "runner"} <= set(
        shown["jobs"][0]
    )


def test_the_farm_matrix_builds_each_model_once_on_the_runner_of_its_largest_job(cli):
    import json

    matrix = json.loads(cli("plan", str(CATALOG), "--runners", str(RUNNERS), "--format", "github", check=True).stdout)
    planned = plan_catalog(catalog_paths([CATALOG]), RUNNERS)
    entries = matrix["matrix"]["include"]
    assert matrix["jobs"] == len(planned.jobs) and matrix["entries"] == len(entries) and not matrix["skipped"]
    # every CPU target is on both runners: one entry per model (one download, one export), where the UNet fits
    sized = {job.model for job in planned.jobs}
    recipes = sorted(r.path.name for r in planned.models if r.name in sized)
    assert sorted(Path(e["recipes"]).name for e in entries) == recipes
    sd15 = next(e for e in entries if e["name"].startswith("sd-1.5 "))
    need = max(max(j.need_gb, j.export_gb) for j in planned.jobs if j.model == "sd-1.5")
    # SD 1.5's UNet at its default profile plans within the hosted 16 GB runner; SDXL's fp32 UNet does not
    assert sd15["runs-on"] == ["ubuntu-latest"] and sd15["memory_gb"] == need <= 16
    sdxl = next(e for e in entries if e["name"].startswith("sdxl-base-1.0 "))
    assert sdxl["runs-on"] == ["self-hosted", "linux", "x64", "ram-192"] and sdxl["memory_gb"] > 16
    assert set(sd15["targets"].split()) == {j.target for j in planned.jobs if j.model == "sd-1.5"}
    assert "export" in sd15["extras"].split(",") and sd15["jobs"] == ""
    upscaler = next(e for e in entries if e["name"].startswith("realesrgan-x4plus "))
    assert upscaler["runs-on"] == ["ubuntu-latest"]  # a small model stays on the hosted runner
    refused = cli("plan", str(CATALOG), "--format", "github")
    assert refused.returncode != 0 and "needs --runners" in refused.stderr and "Traceback" not in refused.stderr


def test_a_runner_too_small_for_a_job_is_named_with_what_it_needs(tmp_path):
    runners = tmp_path / "runners.toml"
    runners.write_text('[[runner]]\nname = "small"\nlabels = ["x"]\ntargets = ["onnxruntime:cpu"]\nram_gb = 8\n')
    planned = plan_catalog([CATALOG / "sd-1.5.toml"], runners)
    unet = [j for j in planned.unroutable if j.component == "unet" and j.target == "onnxruntime:cpu"]
    assert unet and "needs" in unet[0].why and "GB RAM" in unet[0].why
    assert all(j.runner is None and "no runner builds" in j.why for j in planned.jobs if j.target != "onnxruntime:cpu")


def test_the_shipped_parameter_counts_are_the_configs_counts():
    """The offline plan's table equals the meta-device count of the configs shipped for the export."""
    import importlib

    torch = pytest.importorskip("torch")
    from enginefarm.builder.catalog_configs import CONFIGS

    for name in ("sd-1.5", "sdxl-refiner-1.0"):
        files = CONFIGS[name]
        for relative, config in files.items():
            folder = relative.split("/")[0]
            if folder not in ("unet", "text_encoder", "text_encoder_2"):
                continue
            library, cls_name = files["model_index.json"][folder]
            cls = getattr(importlib.import_module(library), cls_name)
            with torch.device("meta"):
                model = cls(cls.config_class(**config)) if library == "transformers" else cls.from_config(config)
            assert sum(p.numel() for p in model.parameters()) == PARAMETERS[name][folder], (name, folder)


def _recipe(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "model.toml"
    path.write_text(
        '[model]\nname = "m"\nversion = "1"\n[export]\nfamily = "sd1"\nconfigs = "sd-1.5"\nlicence = "x"\n'
        f'gated = false\n{body}\n[defaults]\ntargets = ["onnxruntime:cpu"]\n'
    )
    return path


@pytest.mark.parametrize(
    ("body", "key", "reason"),
    [
        (
            '[export.checkpoint]\nsource = "hf://a/b/c.safetensors@main"\nsha256 = "' + "0" * 64 + '"\nsize = 1',
            "source",
            "40 hex",
        ),
        (
            '[export.checkpoint]\nsource = "https://x/c.safetensors"\nsha256 = "' + "0" * 64 + '"',
            "checkpoint",
            "together",
        ),
        ('[export.checkpoint]\nsource = "https://x/c"\nsha256 = "abc"\nsize = 1', "sha256", "64"),
        ('[export.checkpoint]\nsource = "ftp://x/c"', "source", "hf://"),
        ('[export.files]\n"../x" = { source = "https://x/y" }', "files", "relative"),
    ],
)
def test_a_wrong_pin_is_a_one_line_recipe_error(tmp_path, body, key, reason):
    with pytest.raises(RecipeError) as error:
        load_catalog_recipe(_recipe(tmp_path, body))
    assert key in str(error.value) and reason in str(error.value)


class _Server:
    """Files by URL path, with HTTP Range requests (206), as the Hub's CDN answers them."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.ranges: list[str | None] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = server.files.get(self.path)
                header = self.headers.get("Range")
                server.ranges.append(header)
                if body is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                start = int(header.split("=")[1].rstrip("-")) if header else 0
                self.send_response(206 if header else 200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                self.wfile.write(body[start:])

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()


@pytest.fixture
def hub(monkeypatch, tmp_path):
    server = _Server()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("CI", raising=False)
    yield server
    server.http.shutdown()


REV = "a" * 40


def test_lock_records_the_digests_and_build_refuses_unlocked_sources_in_ci(hub, tmp_path, monkeypatch):
    weights, vocab = b"weights" * 1000, b'{"a": 1}'
    hub.files[f"/org/repo/resolve/{REV}/model.safetensors"] = weights
    hub.files["/org/repo/resolve/main/tokenizer/vocab.json"] = vocab
    path = _recipe(
        tmp_path,
        f'[export.checkpoint]\nsource = "hf://org/repo/model.safetensors@{REV}"\n'
        '[export.files]\n"tokenizer/vocab.json" = { source = "hf://org/repo/tokenizer/vocab.json@main" }\n',
    )
    recipe = load_catalog_recipe(path)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(ConfigError, match="not locked"):
        check_locked(recipe)
    monkeypatch.delenv("CI")
    done = lock(recipe, tmp_path / "downloads")
    assert {f.url: (f.sha256, f.size) for f in done} == {
        f"hf://org/repo/model.safetensors@{REV}": (hashlib.sha256(weights).hexdigest(), len(weights)),
        "hf://org/repo/tokenizer/vocab.json@main": (hashlib.sha256(vocab).hexdigest(), len(vocab)),
    }
    assert lock_path(path).is_file()
    locked = load_catalog_recipe(path)  # the lock file's pins are the recipe's now
    assert not locked.unlocked and locked.checkpoint and locked.checkpoint.size == len(weights)
    monkeypatch.setenv("CI", "true")
    check_locked(locked)


def test_a_download_resumes_and_a_changed_file_is_refused_before_use(hub, tmp_path):
    data = bytes(range(256)) * 4096
    hub.files["/f.bin"] = data
    path = _recipe(
        tmp_path,
        f'[export.checkpoint]\nsource = "{hub.url.replace("http", "https", 1)}/f.bin"\n'
        f'sha256 = "{hashlib.sha256(data).hexdigest()}"\nsize = {len(data)}\n',
    )
    pin = load_catalog_recipe(path).checkpoint
    assert pin is not None
    from dataclasses import replace

    pin = replace(pin, url=f"{hub.url}/f.bin")  # plain http on loopback; the recipe parser asks for https://
    folder = tmp_path / "downloads"
    part = folder / pin.sha256 / "f.bin.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(data[:100_000])  # an interrupted download
    got, _ = fetch_file(pin, folder)
    assert got.read_bytes() == data and hub.ranges[-1] == "bytes=100000-" and not part.exists()
    hub.files["/g.bin"] = data[:-1] + b"\x00"  # the publisher's file changed
    with pytest.raises(SourceError, match="does not match its pin"):
        fetch_file(replace(pin, url=f"{hub.url}/g.bin", sha256="1" * 64), folder)
    assert not any((folder / ("1" * 64)).iterdir())  # nothing left to be used
    assert _components(load_catalog_recipe(CATALOG / "realesrgan-x4plus.toml")) == {"filter": 67040989}


def test_a_filter_folder_downloads_and_goes_to_the_filter_exporter(hub, tmp_path):
    """TAESD as its diffusers folder, file by file: assembled under the recipe's name (the latent space's)."""
    import json

    from enginefarm.builder.catalog_export import export_catalog
    from tests.filters.tiny_filters import write_taesd_folder

    folder = write_taesd_folder(tmp_path / "served")
    lines = []
    for path in sorted(folder.iterdir()):
        data = path.read_bytes()
        hub.files[f"/madebyollin/taesdxl/resolve/{REV}/{path.name}"] = data
        lines.append(
            f'"{path.name}" = {{ source = "hf://madebyollin/taesdxl/{path.name}@{REV}", '
            f'sha256 = "{hashlib.sha256(data).hexdigest()}", size = {len(data)} }}'
        )
    recipe = tmp_path / "taesdxl.toml"
    recipe.write_text(
        '[model]\nname = "taesdxl"\nversion = "1"\n[export]\nkind = "filter"\nlicence = "MIT"\ngated = false\n'
        "[export.files]\n" + "\n".join(lines) + '\n[defaults]\ntargets = ["onnxruntime:cpu"]\nprecisions = ["fp32"]\n'
    )
    done = export_catalog(load_catalog_recipe(recipe), tmp_path / "home")
    assert done.recipe.is_file() and done.export_seconds > 0
    assert done.export_peak_bytes > 100e6  # torch and the traced model were in this process's memory
    described = json.loads((done.recipe.parent / "assets" / "filter.json").read_text())
    assert described["kind"] == "preview_decoder" and described["details"]["latent_scaling_factor"] == 0.13025
    kept = export_catalog(load_catalog_recipe(recipe), tmp_path / "home")
    assert kept.export_seconds == 0 and kept.export_peak_bytes == 0  # kept, not redone


def test_a_controlnet_recipe_exports_its_controlnet_with_the_base_pipeline(tmp_path):
    """The ControlNet's files go beside the base's folder, as `export --controlnet DIR` takes them: the model is of the
    ControlNet family, with the UNet that takes its residuals, which the plan counts."""
    import json

    from enginefarm.builder.catalog_configs import CONFIGS
    from enginefarm.builder.catalog_export import _check_family, assemble, split_controlnet
    from enginefarm.export.source import read_source

    recipe = load_catalog_recipe(CATALOG / "controlnet-sd1.5-canny.toml")
    unet = CONFIGS["sd-1.5"]["unet/config.json"]
    controlnet_config = {k: v for k, v in unet.items() if k not in ("up_block_types", "out_channels", "sample_size")}
    files = {}
    for f in recipe.files:  # stand-ins for the downloads: only the configs are read here
        path = tmp_path / "downloads" / f.path.replace("/", "_")
        path.parent.mkdir(exist_ok=True)
        config = {**controlnet_config, "_class_name": "ControlNetModel"}
        path.write_text(json.dumps(config) if f.path == "controlnet/config.json" else "{}")
        files[f.path] = path
    folder = assemble(recipe, files, tmp_path / "holder" / recipe.name)
    controlnet = split_controlnet(folder)
    assert controlnet is not None and not (folder / "controlnet").exists()
    assert read_source(folder, controlnet).family.id == "controlnet-sd1"
    _check_family(recipe, folder, controlnet)
    components = _components(recipe)
    assert components["unet_controlnet"] == components["unet"] == 4 * 859_520_964
    assert components["controlnet"] == 4 * PARAMETERS["controlnet-sd1"]["controlnet"]


def test_a_job_goes_where_its_model_also_exports():
    """`build` exports on the runner that builds: SDXL's text encoder goes where its 20.6 GB export fits."""
    planned = plan_catalog([CATALOG / "sdxl-base-1.0.toml", CATALOG / "sd-1.5.toml"], RUNNERS)
    sdxl_text = [j for j in planned.jobs if j.model == "sdxl-base-1.0" and j.component == "text_encoder"]
    assert sdxl_text and all(j.need_gb < 16 < j.export_gb and j.runner == "big-cpu" for j in sdxl_text)
    sd15_text = [j for j in planned.jobs if j.model == "sd-1.5" and j.component == "text_encoder"]
    assert all(j.export_gb < 16 and j.runner == "hosted-cpu" for j in sd15_text)  # 2 x the 3.4 GB UNet: 6.9 GB
