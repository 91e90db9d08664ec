"""bench/pipelines.py's options (the bench itself needs a second venv and minutes: it is run by hand, not here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_pipelines", ROOT / "bench" / "pipelines.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_is_a_small_run_and_the_full_one_is_the_issues_measurement():
    bench = _bench()
    quick = bench.parse_args(["--quick"])
    assert (quick.size, quick.steps, quick.rounds) == (128, 2, 1)
    assert quick.work.name == "bench-pipelines-quick"
    full = bench.parse_args(["--runtimes", "enginefarm,genai-static"])
    assert (full.size, full.steps, full.rounds) == (512, 4, 3)
    assert full.runtimes == ["enginefarm", "genai-static"]


@pytest.mark.parametrize(
    "argv",
    [["--runtimes", "enginefarm,vllm"], ["--runtimes", "genai,diffusers"], ["--size", "500"], ["--rounds", "0"]],
)
def test_options_it_cannot_run_are_refused_with_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        _bench().parse_args(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err
