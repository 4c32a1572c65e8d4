"""benchmarks/ddp_scaling.py on the CPU: its plain loop under DDP over two gloo ranks, and volt's
trainer=ddp over two CPU processes, each against itself on one."""

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from volt.config import PROJECT_ROOT


@pytest.mark.slow  # six fresh interpreters training a ResNet on the CPU, about a minute
def test_plain_and_volt_sides_run_on_one_and_two_cpu_processes(
    tmp_path: Path, load_benchmark: Callable[[str], ModuleType]
) -> None:
    load_benchmark("fake_cifar10").write(tmp_path / "data", per_file=32)
    command = [sys.executable, "benchmarks/ddp_scaling.py", "--root", str(tmp_path / "data")]
    command += ["--runs", "plain:off", "volt:off", "--gpus", "2", "--epochs", "1"]
    command += ["--workers", "0", "--batch-per-gpu", "16", "--outputs", str(tmp_path / "out")]
    command += ["--json", str(tmp_path / "scaling.json")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # two ranks share a 2-core machine
    done = subprocess.run(
        command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "scaling.json").read_text())
    assert result["device"] == "CPU"
    runs = [(r["side"], r["gpus"]) for r in result["rows"]]
    assert runs == [("plain", 1), ("plain", 2), ("volt", 1), ("volt", 2)], done.stdout
    assert all(len(r["samples_per_s"]) == 1 and r["samples_per_s"][0] > 0 for r in result["rows"])
    table = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert table[0] == "| side | compile | 1 GPU | 2 GPUs | scaling | of synthetic on 2 |"
    assert table[2].startswith("| plain DDP loop | off | ") and table[3].startswith("| volt `")
