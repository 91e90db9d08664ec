"""`enginefarm build` writing to a log file or a pipe (no terminal, as in CI or `> build.log`): a line per stage and
job as it happens, each with the seconds since the build started, instead of bars that draw nothing there."""

from __future__ import annotations

import re


def test_build_without_a_terminal_prints_a_line_per_stage_and_job(cli, tiny_recipe):
    proc = cli("build", str(tiny_recipe(precisions=("fp32", "fp16"))), "--no-bench", check=True)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if re.match(r"\[\s*\d+ s\] ", line)]
    jobs = [line for line in lines if " built " in f" {line} "]
    assert len(jobs) == 2, proc.stdout + proc.stderr  # fp32 and fp16, each said once as it finished
    assert all("tiny-sd/decoder" in line for line in jobs)
    # each finished job says its measured peak beside what the plan counted for it, in the plan's unit
    for line in jobs:
        peak, planned = map(float, re.search(r"peak (\d+\.\d) GB of (\d+\.\d) planned", line).groups())
        assert 0 < peak < planned, line
    stages = {line.split("] ", 1)[1].split()[0] for line in lines} - {"built"}
    assert len(stages) >= 2, lines  # the stages each job went through, not only its end
    seconds = [int(line[1:].split()[0]) for line in lines]
    assert seconds == sorted(seconds)  # said as they happen
