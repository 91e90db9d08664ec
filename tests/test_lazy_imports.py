"""`import enginefarm`, `enginefarm.runner` and `enginefarm.cache` load no vendor SDK, no onnx and no boto3; the runtime
needs no CLI module (click, rich: the `cli` extra), and the command names that extra when it is missing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = [
    "openvino",
    "onnxruntime",
    "onnx",
    "boto3",
    "botocore",
    "tensorrt",
    "tensorrt_rtx",
    "coremltools",
    "torch",
    "migraphx",
    "onnxsim",
    "tuf",
    "securesystemslib",
    "cryptography",
]


@pytest.mark.parametrize(
    "module",
    [
        "enginefarm",
        "enginefarm.runner",
        "enginefarm.cache",
        "enginefarm.cli",
        "enginefarm.backends",
        "enginefarm.cache.trust",
        "enginefarm.runner.release",
        "enginefarm.cli_release",
        "enginefarm.families",
        "enginefarm.hardware.devices",
        "enginefarm.export",
        "enginefarm.cli_export",
        "enginefarm.weights.single_file",
        "enginefarm.weights.routing",
    ],
)
def test_import_loads_no_heavy_module(module):
    code = f"import sys, json, {module}; print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_the_check_itself_would_catch_a_heavy_import():
    code = f"import sys, json, enginefarm, onnx; print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "onnx" in json.loads(out.stdout)


BUILD_TIME = ("enginefarm.builder", "onnx", "onnxsim")  # what an app that only fetches and runs never needs
# What a warm load + first run of a built-in backend's artifact does without (OpenVINO imports the first two itself).
# The download side of the cache (remote stores' resumable reads, codecs, resuming) too: a warm load finds its
# artifact verified in the cache. ONNX Runtime imports neither tempfile nor secrets itself: a warm load only reads.
FETCH_ONLY = (
    "enginefarm.cache.artifacts",
    "enginefarm.cache.stores.ranged",
    "enginefarm.cache.blob_codecs",
    "enginefarm.cache.resume",
)
WARM_UNNEEDED = {
    "onnxruntime:cpu": ("importlib.metadata", "subprocess", "tempfile", "secrets", *FETCH_ONLY),
    "openvino:cpu": ("enginefarm.backends.openvino_ir", "xml.etree.ElementTree", *FETCH_ONLY),
}
CLI_ONLY = ("click", "rich", "pygments")  # the `cli` extra: only the `enginefarm` command needs it


def _loaded(code: str, env: dict | None = None) -> list[str]:
    import os

    probe = (
        f"{code}\nimport sys, json; print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('onnx', "
        f"'onnxsim', *{CLI_ONLY!r}) "
        "or m.startswith(('enginefarm.builder', 'enginefarm.cli')))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env={**os.environ, **(env or {})}
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "module",
    [
        "enginefarm",
        "enginefarm.runner",
        "enginefarm.runner.load",
        "enginefarm.runner.resolve",
        "enginefarm.runner.measure",
        "enginefarm.runner.golden_check",
        "enginefarm.backends.openvino",
        "enginefarm.backends.onnxruntime",
        "enginefarm.backends.tensorrt_rtx",
        "enginefarm.cache.device_cache",
        "enginefarm.cache.progress",
        "enginefarm.runner.release",
    ],
)
def test_the_runtime_imports_no_builder_module_no_onnx_and_no_cli_module(module):
    assert _loaded(f"import {module}") == []


def test_the_guard_would_catch_a_builder_import():
    assert "enginefarm.builder.planner" in _loaded("import enginefarm.runner, enginefarm.builder.planner")


def test_the_guard_would_catch_a_cli_import():
    assert {"click", "rich"} <= set(_loaded("import enginefarm.runner, click, rich"))


def _hide(folder, modules=CLI_ONLY) -> dict:
    """Shim packages that raise ModuleNotFoundError on import, first on PYTHONPATH: as if `modules` were not
    installed."""
    for module in modules:
        (folder / module).mkdir(parents=True, exist_ok=True)
        (folder / module / "__init__.py").write_text(
            f"raise ModuleNotFoundError('hidden for this test', name='{module}')\n"
        )
    return {"PYTHONPATH": str(folder)}


@pytest.mark.parametrize("hidden", [CLI_ONLY, ("rich", "pygments")], ids=["no click or rich", "click without rich"])
def test_the_command_without_its_extra_names_the_extra_in_one_line(tmp_path, hidden):
    import os

    env = {**os.environ, **_hide(tmp_path / "shims", hidden)}
    for args in (["--help"], ["doctor"]):
        proc = subprocess.run(
            [sys.executable, "-c", "from enginefarm.cli_entry import main; main()", *args],
            capture_output=True,
            text=True,
            env=env,
        )
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.splitlines() == [
            "error: the enginefarm command needs its CLI extra",
            "hint: pip install 'enginefarm[cli]'",
        ]
    with_cli = subprocess.run(
        [sys.executable, "-c", "from enginefarm.cli_entry import main; main()", "--help"],
        capture_output=True,
        text=True,
    )
    assert with_cli.returncode == 0 and "Usage:" in with_cli.stdout, with_cli.stderr


def test_the_console_script_is_the_entry_that_checks_for_the_extra():
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["enginefarm"] == "enginefarm.cli_entry:main"
    core = " ".join(project["dependencies"])
    assert not any(name in core for name in CLI_ONLY)
    extras = project["optional-dependencies"]
    assert {d.split(">")[0] for d in extras["cli"]} == {"click", "rich"}
    assert all(any("cli" in d and d.startswith("enginefarm[") for d in extras[name]) for name in ("all", "test"))


@pytest.mark.parametrize("target", ["openvino:cpu", "onnxruntime:cpu"])
def test_fetching_loading_and_running_an_artifact_needs_no_builder_module(tiny_recipe, cli, tmp_path, target):
    """What an app does (load, run) with the builder and the CLI out of the picture: a `pip install
    'enginefarm[openvino]'` app, with click and rich not even importable."""
    import os

    store, home = tmp_path / "store", tmp_path / "home"
    cli("build", str(tiny_recipe(targets=(target,))), "--store", str(store), "--no-bench", check=True)
    code = (
        "import numpy as np, enginefarm\n"
        f"s = enginefarm.load('tiny-sd/decoder', device='cpu', target={target!r})\n"
        "out = s.run({'latent': np.zeros((1, 4, 8, 8), np.float32)})\n"
        "assert all(np.isfinite(v).all() for v in out.values())"
    )
    env = {"ENGINEFARM_STORE": str(store), "ENGINEFARM_HOME": str(home), **_hide(tmp_path / "shims")}
    assert _loaded(code, env) == []
    # A warm load (the device probes remembered by an earlier one) asks for built-in backends only: no scan of the
    # installed distributions' entry points, which cost 50-100 ms of the first inference; it runs no tool, and reads
    # no IR as XML (that is for custom weights only).
    warm_env = {**os.environ, **env, "ENGINEFARM_PROBE_CACHE": "on"}  # the suite turns the cache off
    subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, env=warm_env)
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys; print(*[m in sys.modules for m in {WARM_UNNEEDED[target]!r}])"],
        capture_output=True,
        text=True,
        check=True,
        env=warm_env,
    )
    assert out.stdout.split() == ["False"] * len(WARM_UNNEEDED[target]), out.stderr


def test_the_public_face_names_its_parameters_and_stays_lazy():
    """`enginefarm.load` shows every parameter (no **kwargs hiding them); Session and Pipeline come when named."""
    import inspect

    code = (
        "import sys, json, inspect, enginefarm; before = 'enginefarm.diffusion' in sys.modules; "
        "p = enginefarm.Pipeline; print(json.dumps([before, 'enginefarm.diffusion' in sys.modules, "
        "enginefarm.Session.__name__]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [False, True, "Session"]
    import enginefarm

    kinds = {p.kind for p in inspect.signature(enginefarm.load).parameters.values()}
    assert inspect.Parameter.VAR_KEYWORD not in kinds and "version" in inspect.signature(enginefarm.load).parameters
    assert "memory_budget" in inspect.signature(enginefarm.Pipeline.load).parameters
    with pytest.raises(AttributeError):
        enginefarm.NoSuchThing  # noqa: B018
