"""`-v` where users type it: before the subcommand (`enginefarm -v build`) or after it (`enginefarm build -v`), in a
group's subcommands too, the counts adding up (`enginefarm -v build -v` is -vv)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# The root logger's level once the command has parsed its options (enginefarm.cli sets it; nothing logs here).
LEVEL_AFTER = (
    "import logging, sys\n"
    "from enginefarm.cli import main\n"
    "main(sys.argv[1:], standalone_mode=False)\n"
    "print(logging.getLevelName(logging.getLogger().level))\n"
)


@pytest.mark.slow  # the command's start-up in a subprocess, four times
@pytest.mark.parametrize(
    "args, level",
    [
        (("ls",), "WARNING"),
        (("ls", "-v"), "INFO"),
        (("-v", "ls", "-v"), "DEBUG"),
        (("cache", "ls", "-vv"), "DEBUG"),
    ],
)
def test_v_after_the_subcommand_counts_as_before_it(args, level):
    proc = subprocess.run([sys.executable, "-c", LEVEL_AFTER, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == level, proc.stdout


def test_every_command_lists_v_in_its_help(cli):
    assert "-v, --verbose" in cli("build", "--help", check=True).stdout
