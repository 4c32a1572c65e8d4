"""benchmarks/log_cost.py runs its three cases on the CPU and prints a line for each."""

import re
import subprocess
import sys

import pytest

from volt.config import PROJECT_ROOT


@pytest.mark.slow  # three fresh interpreters importing torch and Lightning: ~15 s on 2 cores
def test_three_cases_each_print_microseconds_a_step() -> None:
    done = subprocess.run(
        [sys.executable, "benchmarks/log_cost.py", "--steps", "20", "--repeats", "1"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert [line.split(":")[0].strip() for line in lines] == [
        "none logged", "Lightning", "volt's trainers",
    ]  # fmt: skip
    for line in lines:
        assert re.search(r": +\d+ µs a step", line), line
    assert re.search(r"\d+ µs a logged value", lines[1]), lines[1]
