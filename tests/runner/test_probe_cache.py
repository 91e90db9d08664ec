"""Device probes remembered per machine (`hardware/probe_cache.py`): read back while the machine's key holds, probed
again when any part of the key changes, and a corrupt or unwritable cache is as good as none."""

from __future__ import annotations

import json

import pytest

from enginefarm.hardware.probe_cache import FILE
from enginefarm.runner.detect import run_probes


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINEFARM_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("ENGINEFARM_PROBE_CACHE", "on")
    from enginefarm.hardware import device_info

    monkeypatch.setattr(device_info, "_remembered", None)  # what a remembered probe sets stays within the test
    return tmp_path / "home"


def _plant(home, name: str) -> None:
    """Rename the remembered CPU: a result that only the cache can give."""
    data = json.loads((home / FILE).read_text())
    data["probes"]["cpu"]["devices"][0]["name"] = data["probes"]["cpu"]["devices"][0]["info"]["name"] = name
    (home / FILE).write_text(json.dumps(data))


def test_probes_are_remembered_until_the_machine_key_changes(home, monkeypatch):
    probed = run_probes(("cpu",))
    assert (home / FILE).is_file()
    _plant(home, "remembered cpu")
    again = run_probes(("cpu",))
    assert again[0].devices[0].name == "remembered cpu"
    from enginefarm.hardware.device_info import cpu_description

    assert cpu_description()["name"] == "remembered cpu"  # the CPU's description comes from the cache too (no psutil)
    assert again[0].devices[0].targets == probed[0].devices[0].targets and {
        **again[0].devices[0].info,
        "name": "?",
    } == {**probed[0].devices[0].info, "name": "?"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # part of the key: what GPUs the process sees
    fresh = run_probes(("cpu",))
    assert fresh[0].devices[0].name == probed[0].devices[0].name
    assert run_probes(("cpu",), cached=False)[0].devices[0].name == probed[0].devices[0].name
    _plant(home, "remembered cpu")
    monkeypatch.setenv("ENGINEFARM_PROBE_CACHE", "off")
    assert run_probes(("cpu",))[0].devices[0].name == probed[0].devices[0].name


@pytest.mark.parametrize("garbage", ["{not json", "[]", '{"key": 1, "probes": []}', ""])
def test_a_corrupt_cache_is_probed_again_and_rewritten(home, garbage):
    home.mkdir(parents=True)
    (home / FILE).write_text(garbage)
    found = run_probes(("cpu",))
    assert found[0].devices and found[0].reason is None
    assert json.loads((home / FILE).read_text())["probes"]["cpu"]["devices"][0]["name"] == found[0].devices[0].name


def test_an_entry_of_another_shape_is_probed_again(home):
    run_probes(("cpu",))
    data = json.loads((home / FILE).read_text())
    data["probes"]["cpu"] = {"devices": "?"}
    (home / FILE).write_text(json.dumps(data))
    assert run_probes(("cpu",))[0].devices


@pytest.mark.parametrize(
    "damage",
    [
        ("targets", "onnxruntime:cpu"),  # a string: read as its characters, no device ran anything
        ("targets", [5]),
        ("info", []),
        ("kind", None),
    ],
    ids=["targets a string", "targets not text", "info a list", "no kind"],
)
def test_a_probe_entry_of_wrong_types_is_probed_again_and_rewritten(home, damage):
    probed = run_probes(("cpu",))
    data = json.loads((home / FILE).read_text())
    data["probes"]["cpu"]["devices"][0][damage[0]] = damage[1]
    (home / FILE).write_text(json.dumps(data))
    again = run_probes(("cpu",))
    assert again[0].devices[0].targets == probed[0].devices[0].targets and again[0].devices[0].kind == "cpu"
    assert json.loads((home / FILE).read_text())["probes"]["cpu"]["devices"][0]["targets"] == list(
        probed[0].devices[0].targets
    )


def test_an_unusable_home_probes_without_a_cache(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("ENGINEFARM_HOME", str(tmp_path / "afile" / "home"))  # under a file: nothing can be written
    found = run_probes(("cpu",))
    assert found[0].devices and not (tmp_path / "afile" / "home").exists()


def test_the_cache_lives_in_the_home_the_caller_gave(home, tmp_path):
    """`load(settings=...)` with its own home: the probes are remembered there, not in the environment's home."""
    from dataclasses import replace

    from enginefarm.runner.detect import detect
    from enginefarm.settings import load_settings

    own = replace(load_settings(), home=tmp_path / "app-home")
    assert detect("auto", ("cpu",), settings=own)
    assert (tmp_path / "app-home" / FILE).is_file() and not (home / FILE).exists()
    detect("auto", ("cpu",))
    assert (home / FILE).is_file()
