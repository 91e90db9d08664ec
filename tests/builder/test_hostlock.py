"""Benchmarks never overlap builds or each other on one host: real processes holding the real file locks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

HOLDER = """
import sys, time
from pathlib import Path
from enginefarm.builder.hostlock import alone, building

kind, name, log, release = sys.argv[1:5]

def note(text):
    with open(log, "a") as handle:
        handle.write(text + "\\n")

note(f"{name} trying")
if kind == "build":
    with building():
        note(f"{name} in")
        while not Path(release).exists():
            time.sleep(0.02)
else:
    with alone(float(sys.argv[5])) as host:
        note(f"{name} in alone={host['alone']}")
        while not Path(release).exists():
            time.sleep(0.02)
"""


class Holders:
    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        self.log = tmp_path / "log.txt"
        self.log.touch()
        self.procs: list[subprocess.Popen] = []

    def start(self, kind: str, name: str, timeout: float = 60.0) -> None:
        self.procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    HOLDER,
                    kind,
                    name,
                    str(self.log),
                    str(self.dir / f"release-{name}"),
                    str(timeout),
                ]
            )
        )

    def release(self, name: str) -> None:
        (self.dir / f"release-{name}").touch()

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines()

    def wait_for(self, line: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(x.startswith(line) for x in self.lines()):
            assert time.monotonic() < deadline, f"never saw {line!r}: {self.lines()}"
            time.sleep(0.02)

    def finish(self) -> None:
        for name in ("b1", "b2", "b3", "t1", "t2", "t3"):
            self.release(name)
        for proc in self.procs:
            proc.wait(timeout=60)


@pytest.fixture
def holders(tmp_path):
    h = Holders(tmp_path)
    yield h
    h.finish()


@pytest.mark.slow  # over a second of the quick loop's time (make test-fast)
def test_builds_share_the_host_and_a_benchmark_waits_for_them(holders):
    holders.start("build", "b1")
    holders.start("build", "b2")
    holders.wait_for("b1 in")
    holders.wait_for("b2 in")  # both inside at once: builds share
    holders.start("alone", "t1", timeout=0.5)
    holders.wait_for("t1 in")
    assert "t1 in alone=False" in holders.lines(), "a benchmark must not get the host while builds hold it"
    holders.release("b1")
    holders.release("b2")
    holders.start("alone", "t2")
    holders.wait_for("t2 in")
    assert "t2 in alone=True" in holders.lines()


@pytest.mark.slow  # over a second of the quick loop's time (make test-fast)
def test_benchmarks_exclude_each_other(holders):
    holders.start("alone", "t1")
    holders.wait_for("t1 in")
    holders.start("alone", "t2", timeout=0.5)
    holders.wait_for("t2 in")
    assert holders.lines()[-1] == "t2 in alone=False"


@pytest.mark.slow  # over a second of the quick loop's time (make test-fast)
def test_a_waiting_benchmark_is_not_starved_by_builds_that_keep_starting(holders):
    """While a benchmark waits for the running build, a build that starts later waits behind the benchmark."""
    import fcntl
    import os

    from enginefarm.builder.hostlock import lock_dir

    holders.start("build", "b1")
    holders.wait_for("b1 in")
    holders.start("alone", "t1")
    turnstile = os.open(lock_dir() / "turnstile.lock", os.O_RDONLY)
    try:  # the benchmark holds the turnstile once it waits
        deadline = time.monotonic() + 60
        while True:
            try:
                fcntl.flock(turnstile, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(turnstile, fcntl.LOCK_UN)
            except BlockingIOError:
                break
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        os.close(turnstile)
    holders.start("build", "b2")
    holders.wait_for("b2 trying")
    time.sleep(0.5)  # time enough for b2 to slip in beside b1, were the benchmark not queued before it
    holders.release("b1")
    holders.wait_for("t1 in")
    holders.release("t1")
    holders.wait_for("b2 in")
    order = [x for x in holders.lines() if " in" in x]
    assert order == ["b1 in", "t1 in alone=True", "b2 in"]


def test_parallel_builds_record_benchmarks_measured_alone(tiny_recipe, cli, tmp_path):
    cli("build", str(tiny_recipe(precisions=("fp32", "fp16"))), "-j", "2", check=True)
    records = [json.loads(p.read_text())["benchmarks"][0] for p in (tmp_path / "store" / "manifests").glob("*.json")]
    assert len(records) == 2
    for record in records:
        assert record["alone"] is True and record["waited_s"] >= 0
        assert record["runs"] >= 5 and record["stopped"] in ("spread", "time cap", "max runs")
        assert record["spread"] >= 0 and record["iqr_ms"] >= 0 and 0 < record["p50_ms"] <= record["p90_ms"]
        assert record["load_avg_1m"] >= 0 and 1 <= record["attempts"] <= 3
        if record["cpu_share"] is not None:  # measured over at least a second
            assert 0 < record["cpu_share"] <= 1.2 and 0 <= record["others_share"] <= 1.2
    assert {p.name for p in (tmp_path / "host-locks").iterdir()} == {"host.lock", "turnstile.lock"}


def test_a_build_waiting_for_a_benchmark_says_whose_it_is(holders, caplog):
    """`build` waiting for the host lock printed nothing for minutes: it names the benchmark holding it now."""
    import logging
    import threading

    from enginefarm.builder.hostlock import building

    holders.start("alone", "t1")
    holders.wait_for("t1 in")
    entered = threading.Event()

    said: list[str] = []

    def build():
        with building(say=said.append):  # a build job's progress line
            entered.set()

    with caplog.at_level(logging.WARNING, logger="enginefarm.builder.hostlock"):
        thread = threading.Thread(target=build)
        thread.start()
        deadline = time.monotonic() + 30
        while "waiting for the host lock" not in caplog.text:
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.05)
        assert not entered.is_set()
        holders.release("t1")
        thread.join(60)
    assert entered.is_set()
    pid = holders.procs[-1].pid
    assert f"waiting for the host lock held by pid {pid} (a benchmark)" in caplog.text
    assert said == [f"waiting for the host lock held by pid {pid} (a benchmark)"]
