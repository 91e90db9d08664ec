from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

from tests import models, nvidia_fakes
from tests.servers import FaultProxy, MotoServer
from tests.tiny_pipelines import make_tiny_controlnet, make_tiny_pipeline

ROOT = Path(__file__).resolve().parents[1]


def builds(fixture_function):
    """Declares a fixture slow: it builds engines, exports a model (torch export), or starts a server. Put it under
    `@pytest.fixture`; every test that uses the fixture, directly or through other fixtures, is marked `slow`, so
    `make test-fast` (`-m "not slow"`) leaves it out without the test saying so."""
    fixture_function.enginefarm_builds = True
    return fixture_function


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
    """Every test gets its own cache and an empty store; nothing touches the user's real ones. (The store folder
    exists: a store path that does not is an error, tested on its own.)"""
    monkeypatch.setenv("ENGINEFARM_HOME", str(tmp_path / "home"))
    (tmp_path / "store").mkdir(exist_ok=True)
    monkeypatch.setenv("ENGINEFARM_STORE", str(tmp_path / "store"))
    monkeypatch.delenv("ENGINEFARM_OFFLINE", raising=False)
    monkeypatch.delenv("ENGINEFARM_CACHE_QUOTA", raising=False)
    monkeypatch.delenv("ENGINEFARM_RECIPE_PATH", raising=False)
    # Picks follow the farm's numbers unless a test turns on-device timing on; host locks stay within the test.
    monkeypatch.setenv("ENGINEFARM_MEASURE", "off")
    monkeypatch.setenv("ENGINEFARM_HOST_LOCK_DIR", str(tmp_path / "host-locks"))
    # Fake SDKs (tests/fakes) change what probes find within one home: probe every time
    # (tests/runner/test_probe_cache.py turns it on)
    monkeypatch.setenv("ENGINEFARM_PROBE_CACHE", "off")
    # OpenVINO's static shapes are picked by timing the first calls of a shape (a call may run on either compile):
    # tests that compare outputs bit for bit run on the dynamic compile; tests/sessions/test_openvino_static.py tries
    # the default (auto) on purpose.
    monkeypatch.setenv("ENGINEFARM_OPENVINO_STATIC", "never")


@pytest.fixture
def small_fs(tmp_path):
    """An 8 MiB tmpfs: a real filesystem that fills up."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (the injected-ENOSPC tests cover the same paths without it)")
    folder = tmp_path / "small"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], capture_output=True)


# The tiny decoder's tests build engines from it (most through tiny_recipe): declared slow with them.
@pytest.fixture
@builds
def tiny_sd(tmp_path) -> Path:
    return models.tiny_sd(tmp_path / "models" / "tiny_sd.onnx")


TINY_RECIPE = """
[model]
name = "tiny-sd"
version = "1"

[defaults]
precisions = {precisions}
targets = {targets}

[components.decoder]
source = "models/tiny_sd.onnx"

[components.decoder.profiles.default]
batch = [1, 1, 2]
height = [8, 16, 32]
width = [8, 16, 32]

[components.decoder.validate]
inputs = {{ latent = {{ low = -3.0, high = 3.0 }} }}
"""


def profile_tables(count: int, height: tuple[int, int, int] = (8, 8, 8)) -> str:
    """`count` profiles for the tiny decoder, p0..pN, differing in max batch: many jobs from one small recipe."""
    h = list(height)
    return "\n".join(
        f"[components.decoder.profiles.p{i}]\nbatch = [1, 1, {i + 1}]\nheight = {h}\nwidth = {h}\n"
        for i in range(count)
    )


@pytest.fixture
def write_recipe(tmp_path):
    def write(text: str, name: str = "recipe.toml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


@pytest.fixture
def tiny_recipe(tiny_sd, write_recipe):
    def make(precisions=("fp32",), targets=("onnxruntime:cpu",), name="recipe.toml") -> Path:
        as_toml = lambda items: "[" + ", ".join(f'"{i}"' for i in items) + "]"  # noqa: E731
        return write_recipe(TINY_RECIPE.format(precisions=as_toml(precisions), targets=as_toml(targets)), name)

    return make


def run_cli(*args: str, env: dict | None = None, check: bool = False) -> subprocess.CompletedProcess:
    """The real `enginefarm` command in a subprocess, as a user runs it."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "enginefarm.cli", *args], capture_output=True, text=True, env=full_env, timeout=600
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"enginefarm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def build_tiny_store(root: Path, precisions: tuple[str, ...], targets: tuple[str, ...]) -> Path:
    """The tiny decoder's TINY_RECIPE built by the real CLI into root/store, in an environment of its own under root
    (a module fixture's: the tests' isolated_env is not set yet). Tests copy the store they damage."""
    models.tiny_sd(root / "models" / "tiny_sd.onnx")
    as_toml = lambda items: "[" + ", ".join(f'"{i}"' for i in items) + "]"  # noqa: E731
    recipe = root / "recipe.toml"
    recipe.write_text(TINY_RECIPE.format(precisions=as_toml(precisions), targets=as_toml(targets)))
    (root / "store").mkdir()
    run_cli("build", str(recipe), "--no-bench", env=tiny_store_env(root), check=True)
    return root / "store"


def tiny_store_env(root: Path) -> dict[str, str]:
    """The environment build_tiny_store builds root/store in."""
    return {
        "ENGINEFARM_STORE": str(root / "store"),
        "ENGINEFARM_HOME": str(root / "home"),
        "ENGINEFARM_HOST_LOCK_DIR": str(root / "host-locks"),
        "ENGINEFARM_MEASURE": "off",
        "ENGINEFARM_PROBE_CACHE": "off",
    }


# Declared slow: the real CLI in a subprocess pays the interpreter's and enginefarm's start-up each call, and most of
# its users build or export with it.
@pytest.fixture
@builds
def cli():
    return run_cli


# The most the whole suite holds in its temporary folder at once, with passed tests' folders removed as they end
# (tmp_path_retention_policy): 1.7 GB measured on 2026-11-27 (df sampled every 5 s; it held 6.3 GB at the end before),
# with room to spare; the 2 GB model's test writes 6.5 GB more for a minute and checks for its own room. A run of a few
# tests needs far less, but not nothing: the biggest single test writes 360 MB.
SUITE_TMP_BYTES = 3 << 30
FEW_TESTS_TMP_BYTES = 512 << 20
FEW_TESTS = 200


def tmp_root(config) -> Path:
    """Where pytest puts its temporary folders: --basetemp, else its debug override, else the system's (TMPDIR)."""
    return Path(config.option.basetemp or os.environ.get("PYTEST_DEBUG_TEMPROOT") or tempfile.gettempdir())


def _stop_if_short(root: Path, need: int, reserve: int, what: str, code: pytest.ExitCode) -> None:
    """Stop the run in one line (the project's own disk-full message and hint) when `root` has less than `need` and
    `reserve` free."""
    from enginefarm.cache.space import ensure_room
    from enginefarm.errors import DiskFullError

    try:
        ensure_room(root, need, reserve, hint="free some space there, or point TMPDIR at a bigger disk")
    except DiskFullError as exc:
        pytest.exit(f"{exc} {what}; hint: {exc.hint}", returncode=code)


def pytest_collection_finish(session):
    """A run on a disk too small for it stops before the first test, in one line, instead of failing a tenth of the way
    in with a thousand errors (as a CI run most likely did on a disk with too little free)."""
    if session.config.option.collectonly or not session.items:
        return
    need = SUITE_TMP_BYTES if len(session.items) > FEW_TESTS else FEW_TESTS_TMP_BYTES
    what = f"for the temporary files of {len(session.items)} tests"
    _stop_if_short(tmp_root(session.config), need, 0, what, pytest.ExitCode.USAGE_ERROR)


# Below this, the next test could not even make its folder: the run stops there rather than erroring every test after.
RUN_OUT_OF_DISK = 128 << 20


def pytest_runtest_setup(item):
    """A disk that fills while the suite runs (something else writing to it) stops the run at the next test, in one
    line: CI's run that filled its disk went on to 1145 setup errors and then pytest's own traceback."""
    _stop_if_short(tmp_root(item.config), 0, RUN_OUT_OF_DISK, f"before {item.nodeid}", pytest.ExitCode.TESTS_FAILED)


def uses_a_slow_fixture(item) -> bool:
    """Whether any fixture `item` runs (its whole closure, as resolved for it) is declared with `builds`."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        getattr(defs[-1].func, "enginefarm_builds", False)
        for name in item.fixturenames
        if (defs := info.name2fixturedefs.get(name))
    )


def pytest_collection_modifyitems(config, items):
    """Tests that use a fixture declared with `builds` are marked `slow`. Tests marked `hardware(kind)` run only where
    ENGINEFARM_TEST_HARDWARE lists that kind."""
    enabled = {k.strip() for k in os.environ.get("ENGINEFARM_TEST_HARDWARE", "").split(",") if k.strip()}
    for item in items:
        if uses_a_slow_fixture(item) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
        marker = item.get_closest_marker("hardware")
        if marker and marker.args[0] not in enabled:
            kind = marker.args[0]
            item.add_marker(
                pytest.mark.skip(
                    reason=f"needs {kind} hardware: run with ENGINEFARM_TEST_HARDWARE={kind} on a machine that has it"
                )
            )


@pytest.fixture(scope="session")
@builds
def moto_server():
    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture
def s3_env(moto_server, monkeypatch):
    """boto3's standard configuration, pointed at the loopback moto server."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return moto_server


def make_bucket(endpoint: str) -> str:
    """A fresh bucket whose objects anyone may GET, like a public bucket behind a CDN."""
    import boto3

    name = f"ef-{uuid.uuid4().hex[:12]}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_bucket(Bucket=name)
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{name}/*"}
        ],
    }
    client.put_bucket_policy(Bucket=name, Policy=json.dumps(policy))
    return name


@pytest.fixture
def bucket(s3_env):
    return make_bucket(s3_env.url)


@pytest.fixture
def proxy(moto_server):
    proxy = FaultProxy(moto_server.port)
    yield proxy
    proxy.stop()


# Tiny diffusers pipelines and their exports, made once per test session (each export runs the real CLI): shared by
# the exporter's tests and the pipelines' (tests/export, tests/diffusion).
# Profiles small enough for the tiny models: latent 8 (64 image pixels) up to 16, batch up to 2.
TINY_PROFILE = ("--latent", "8,8,16", "--batch", "1,2,2")


@pytest.fixture(scope="session")
@builds
def tiny(tmp_path_factory):
    """family → the folder of its tiny pipeline (written on first use)."""
    root = tmp_path_factory.mktemp("tiny-pipelines")
    made: dict[str, Path] = {}

    def make(family: str) -> Path:
        if family not in made:
            made[family] = make_tiny_pipeline(family, root / family)
        return made[family]

    return make


@pytest.fixture(scope="session")
@builds
def tiny_controlnet(tiny, tmp_path_factory):
    """base family ("sd1", "sdxl") → a standalone ControlNet folder made from that tiny pipeline's UNet."""
    root = tmp_path_factory.mktemp("tiny-controlnets")
    made: dict[str, Path] = {}

    def make(base: str) -> Path:
        if base not in made:
            made[base] = make_tiny_controlnet(tiny(base), root / base)
        return made[base]

    return make


class Export:
    def __init__(self, out: Path, proc) -> None:
        self.out, self.proc = out, proc
        self.family_json = json.loads((out / "assets" / "family.json").read_text())


@pytest.fixture(scope="session")
@builds
def exported(tmp_path_factory):
    """(source folder, extra CLI args) → the Export of `enginefarm export SOURCE --out … <tiny profile> <extra>`,
    run once per session; a failed export fails the test that asked for it, with the CLI's output."""
    root = tmp_path_factory.mktemp("exports")
    done: dict[tuple, Export] = {}

    def export(source: Path, *extra: str, name: str | None = None) -> Export:
        key = (str(source), extra)
        if key not in done:
            out = root / f"{name or source.name}-{len(done)}"
            proc = run_cli("export", str(source), "--out", str(out), *TINY_PROFILE, *extra, check=True)
            done[key] = Export(out, proc)
        return done[key]

    return export


# What each family's checks need built: the txt2img families on both backends at fp32 and fp16; the img2img and
# ControlNet checks (the same loop with more inputs) on ONNX Runtime fp32, which keeps the suite's time down.
NARROW_BUILD = ("--target", "onnxruntime:cpu", "--precision", "fp32")


# SD3: both backends and precisions, without the VAE encoder (image to image is checked on SD3.5's narrow build).
def _TXT2IMG(*components: str) -> tuple[str, ...]:  # noqa: N802 (reads as the constant it builds)
    return tuple(a for c in components for a in ("--component", c))


_SD3_TXT2IMG = tuple(
    a
    for c in ("text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae_decoder")
    for a in ("--component", c)
)
FAMILY_BUILDS = {
    "sd1": (),
    "sd2-v": (),
    "sdxl": (),
    "sdxl-refiner": NARROW_BUILD,
    "controlnet-sd1": NARROW_BUILD,
    "controlnet-sdxl": NARROW_BUILD,
    # inpainting models (9-channel UNet; every call encodes with the VAE): SD 1.x on both backends and precisions,
    # SDXL (the same UNet contract with its added conditioning) on ONNX Runtime fp32
    "sd1-inpaint": (),
    "sdxl-inpaint": NARROW_BUILD,
    "sd3": _SD3_TXT2IMG,
    "sd3.5": NARROW_BUILD,
    # Flux dev: text to image on both backends and precisions; Chroma (the same transformer with a mask and
    # true CFG) on ONNX Runtime at both precisions
    "flux": _TXT2IMG("text_encoder", "text_encoder_2", "transformer", "vae_decoder"),
    "chroma": _TXT2IMG("text_encoder", "transformer", "vae_decoder") + ("--target", "onnxruntime:cpu"),
    # schnell (no guidance input, no shift): text to image on both backends and precisions
    "flux-schnell": _TXT2IMG("text_encoder", "text_encoder_2", "transformer", "vae_decoder"),
}
# The two ways in to a ControlNet model: the base pipeline's folder with `--controlnet FOLDER` (SD 1.x), or diffusers'
# ControlNet pipeline folder (SDXL: the export tests/export/test_export.py checks, so it is exported once, not twice).
CONTROLNET_BESIDE = ("controlnet-sd1",)
# Checks that need one more component of a family already built: built into the same store (the jobs built before
# are found there and skipped). Flux dev's image to image: its VAE encoder, on ONNX Runtime fp32.
ADDED_BUILDS = {"flux+vae_encoder": ("flux", _TXT2IMG("vae_encoder") + NARROW_BUILD)}


@pytest.fixture(scope="session")
@builds
def built(tiny, tiny_controlnet, exported, tmp_path_factory):
    """family → (diffusers folder, export folder, store): the family's tiny pipeline exported and built by the real CLI
    as FAMILY_BUILDS says (assets included), once per session, shared by every test that reads it."""
    done: dict[str, tuple[Path, Path, Path]] = {}

    def build(family: str):
        if family in ADDED_BUILDS and family not in done:
            base, args = ADDED_BUILDS[family]
            source, out, store = build(base)
            run_cli(
                "build", str(out / "recipe.toml"), "--store", str(store), "--no-bench", "-j", "2", *args, check=True
            )
            done[family] = done[base]
        if family not in done:
            if family in CONTROLNET_BESIDE:  # the base pipeline and a ControlNet folder, exported with --controlnet
                base = family.removeprefix("controlnet-")
                source, export = tiny(base), exported(tiny(base), "--controlnet", str(tiny_controlnet(base)))
            else:
                source, export = tiny(family), exported(tiny(family))
            store = tmp_path_factory.mktemp(f"store-{family}")
            run_cli(
                "build",
                str(export.out / "recipe.toml"),
                "--store",
                str(store),
                "--no-bench",
                "-j",
                "2",
                *FAMILY_BUILDS[family],
                check=True,
            )
            done[family] = (source, export.out, store)
        return done[family]

    return build


@pytest.fixture
@builds
def fake_nvidia(monkeypatch, tmp_path):
    """An RTX 4090 with the fake SDKs installed (tests/fakes, tests/nvidia_fakes.py); the CLI subprocesses see them
    through PYTHONPATH."""
    yield nvidia_fakes.install_fakes(monkeypatch, tmp_path / "fake-nvidia-calls.jsonl")
    nvidia_fakes.forget_fakes()


@pytest.fixture
@builds
def real_rtx():
    """The real TensorRT-RTX module; every test that builds an RTX engine builds it with this."""
    return nvidia_fakes.require_real_rtx()
