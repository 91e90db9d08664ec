"""OpenVINO's static shapes by default (sessions/openvino_static.py, sessions/openvino.py), on the tiny SD 1.x UNet
built by the real CLI and run by the real OpenVINO: a new shape is tried on the caller's own calls (no call made only
to time), through `run` and through a binding alike, whichever compile a call runs on it computes what the dynamic
one does, the verdict is kept for the next process, which makes no trial, and after a static verdict the session
holds one compile (the dynamic one let go, opened again for a shape that needs it).

Which compile wins is the device's to time; these tests set STATIC_MIN_GAIN so that the verdict they check the
mechanics of is known: static whatever the times (1e6), or dynamic whatever they are (0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("openvino")

from enginefarm.sessions import openvino as ov_session
from enginefarm.sessions import openvino_compiled, openvino_static

STATIC_WINS, DYNAMIC_WINS = 1e6, 0.0

# A later process: opens the UNet's artifact as a load does (the default: auto), makes one call, and says what ran.
_LATER = """
import json, sys
from pathlib import Path
import numpy as np
from enginefarm.backends.openvino import BACKEND
from enginefarm.cache.device_cache import DeviceCache
home, key, feeds_file = sys.argv[1:4]
cache = DeviceCache(Path(home))
session = BACKEND.load(cache.path_of(key), cache.manifest(key))
dynamic_at_static_compile = []
compile_static = session._static.compile
def compile(shapes, key):
    dynamic_at_static_compile.append(session._dynamic is not None)
    return compile_static(shapes, key)
session._static.compile = compile
result = session.run({k: v for k, v in np.load(feeds_file).items()})["out_sample"]
print(json.dumps({
    "dynamic_at_static_compile": dynamic_at_static_compile,
    "dynamic_held": session._dynamic is not None,
    "trials": len(session._trials),
    "static_shapes": session.static_shapes,
    "static_from_cache": [bool(v.compiled.get_property("LOADED_FROM_CACHE")) for v in session._variants.values()],
}))
np.save(feeds_file + ".out.npy", result)
"""


class _Counted:
    """A real infer request that notes each infer call (which compile ran it) before making it."""

    def __init__(self, request, label: str, calls: list[str]) -> None:
        self._request, self._label, self._calls = request, label, calls

    def infer(self, *args):
        self._calls.append(self._label)
        return self._request.infer(*args)

    def __getattr__(self, name):
        return getattr(self._request, name)


def _count_infers(monkeypatch) -> list[str]:
    """Every infer call any OpenVINO session makes from now on, as "dynamic" or "static" (the compile it ran on)."""
    calls: list[str] = []

    class Counting(ov_session._Variant):
        def __init__(self, compiled) -> None:
            super().__init__(compiled)
            self.label = "dynamic" if openvino_static.has_dynamic_inputs(compiled) else "static"
            self.request = _Counted(self.request, self.label, calls)

        def take(self) -> tuple:
            request, held = super().take()
            return (request if isinstance(request, _Counted) else _Counted(request, self.label, calls)), held

    monkeypatch.setattr(ov_session, "_Variant", Counting)
    return calls


def _name(out: Path) -> str:
    return tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]


def _feeds(width: int, count: int, batch: int = 2, side: int = 8) -> tuple[dict, list[dict]]:
    """The text states (bound once) and `count` different steps' sample and timestep."""
    rng = np.random.default_rng(0)
    fixed = {"encoder_hidden_states": rng.standard_normal((batch, 77, width)).astype(np.float32)}
    steps = [
        {
            "sample": rng.standard_normal((batch, 4, side, side)).astype(np.float32),
            "timestep": np.full((batch,), 900.0 - 100 * i, np.float32),
        }
        for i in range(count)
    ]
    return fixed, steps


def _load(built, monkeypatch, mode: str):
    import enginefarm

    _, out, store = built("sd1")
    monkeypatch.setattr(openvino_static, "STATIC", mode)
    return enginefarm.load(f"{_name(out)}/unet", store=str(store), precision="fp32", target="openvino:cpu")


def _dynamic_outputs(built, monkeypatch, fixed: dict, steps: list[dict]) -> list[np.ndarray]:
    with _load(built, monkeypatch, "never") as unet:
        return [unet.run({**fixed, **step})["out_sample"] for step in steps]


def _close(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for a, b in zip(got, want, strict=True):
        assert np.abs(a - b).max() <= 1e-4 * float(np.ptp(b))  # the pipeline tests' tolerance


def _tag(home: Path) -> Path:
    from enginefarm.cache.device_cache import COMPILED, DeviceCache

    artifact = next(e.path for e in DeviceCache(home).entries() if e.manifest.component == "unet")
    return next((artifact / COMPILED).glob("ov-*"))


def test_a_new_shape_is_tried_on_the_callers_calls_kept_and_run_static_in_the_next_process(
    built, monkeypatch, tmp_path
):
    home = Path(os.environ["ENGINEFARM_HOME"])
    with _load(built, monkeypatch, "never") as unet:
        width, key = unet.artifact.profile["encoder_hidden_states"]["min"][2], unet.artifact.build_key
    fixed, steps = _feeds(width, 5)
    other_fixed, other_steps = _feeds(width, 1, batch=1, side=16)
    want = _dynamic_outputs(built, monkeypatch, fixed, steps)
    want_other = _dynamic_outputs(built, monkeypatch, other_fixed, other_steps)

    calls = _count_infers(monkeypatch)
    monkeypatch.setattr(openvino_static, "STATIC_MIN_GAIN", STATIC_WINS)
    with _load(built, monkeypatch, "auto") as unet:
        inner = unet._session
        got = [unet.run({**fixed, **step})["out_sample"] for step in steps]
        # one infer per call: the dynamic compile's first (untimed) and second (timed), the static one's the same,
        # then the winner's
        assert calls == ["dynamic", "dynamic", "static", "static", "static"]
        assert inner._dynamic is None and len(inner.static_shapes) == 1  # one compile held after the verdict
        other = unet.run({**other_fixed, **other_steps[0]})["out_sample"]  # a shape that needs the dynamic one
        assert inner._dynamic is not None and calls[-1] == "dynamic"
    _close(got, want)
    _close([other], want_other)

    tag, shapes = _tag(home), {name: value.shape for name, value in {**fixed, **steps[0]}.items()}
    verdict = openvino_compiled.choices(tag)[openvino_compiled.shape_key(shapes)]
    assert verdict["pick"] == "static" and verdict["static_ms"] > 0 and verdict["dynamic_ms"] > 0
    folder = tag / f"static-{openvino_compiled.shape_key(shapes)}"
    ir = folder / openvino_compiled.STATIC_IR
    # its own IR file, inputs fixed, weights a link to the artifact's: OpenVINO keys its cache by the file
    assert 'name="sample" type="Parameter"' in ir.read_text() and ir.with_suffix(".bin").is_symlink()
    assert ir.with_suffix(".bin").resolve() == (tag.parent.parent / "model.bin").resolve()

    np.savez(tmp_path / "feeds.npz", **fixed, **steps[0])
    env = {**os.environ, "ENGINEFARM_OPENVINO_STATIC": ""}  # the default
    proc = subprocess.run(
        [sys.executable, "-c", _LATER, str(home), key, str(tmp_path / "feeds.npz")],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    later = json.loads(proc.stdout.strip().splitlines()[-1])
    # no trial: the static compile opened at once, after the dynamic one was let go (one compile at the peak)
    assert later["dynamic_at_static_compile"] == [False] and not later["dynamic_held"] and later["trials"] == 0
    assert [shape["sample"] for shape in later["static_shapes"]] == [list(shapes["sample"])]
    # read from its own IR file (weights linked, not copied), so OpenVINO finds its blob without hashing the weights
    assert later["static_from_cache"] == [True]
    _close([np.load(str(tmp_path / "feeds.npz") + ".out.npy")], want[:1])


@pytest.mark.parametrize("gain", [STATIC_WINS, DYNAMIC_WINS], ids=["static-wins", "dynamic-wins"])
def test_a_binding_switches_compiles_during_the_trial_and_computes_what_the_dynamic_one_does(built, monkeypatch, gain):
    with _load(built, monkeypatch, "never") as unet:
        width = unet.artifact.profile["encoder_hidden_states"]["min"][2]
    fixed, steps = _feeds(width, 5)
    want = _dynamic_outputs(built, monkeypatch, fixed, steps)

    calls = _count_infers(monkeypatch)
    monkeypatch.setattr(openvino_static, "STATIC_MIN_GAIN", gain)
    winner = "static" if gain == STATIC_WINS else "dynamic"
    with _load(built, monkeypatch, "auto") as unet:
        inner = unet._session
        with unet.bind(fixed) as binding:
            got = [binding.run(step)["out_sample"] for step in steps[:4]]
            # the trial ended at the 4th call: the loser's request went back, and a static winner let the dynamic go
            assert (inner._dynamic is None) == (winner == "static")
            assert (inner.static_shapes != []) == (winner == "static")
            got.append(binding.run(steps[4])["out_sample"])
        assert calls == ["dynamic", "dynamic", "static", "static", winner]
    _close(got, want)


def test_a_shape_called_twice_per_process_finishes_its_trial_in_the_next(built, monkeypatch):
    """A VAE decoder at two images per process: the first times the dynamic compile, the next the static one."""
    home = Path(os.environ["ENGINEFARM_HOME"])
    with _load(built, monkeypatch, "never") as unet:
        width = unet.artifact.profile["encoder_hidden_states"]["min"][2]
    fixed, steps = _feeds(width, 2)
    calls = _count_infers(monkeypatch)
    monkeypatch.setattr(openvino_static, "STATIC_MIN_GAIN", STATIC_WINS)
    with _load(built, monkeypatch, "auto") as unet:
        for step in steps:
            unet.run({**fixed, **step})
        assert unet._session.static_shapes == []  # no static compile made, none held
    assert calls == ["dynamic", "dynamic"]
    (entry,) = openvino_compiled.choices(_tag(home)).values()
    assert "pick" not in entry and entry["dynamic_ms"] > 0
    with _load(built, monkeypatch, "auto") as unet:
        for step in steps:
            unet.run({**fixed, **step})
        assert unet._session._dynamic is None
    assert calls[2:] == ["static", "static"]
    (entry,) = openvino_compiled.choices(_tag(home)).values()
    assert entry["pick"] == "static"
