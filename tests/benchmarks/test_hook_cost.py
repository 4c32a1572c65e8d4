"""benchmarks/hook_cost.py times each callback hook of volt's default run on the CPU."""

import re
import subprocess
import sys

import pytest

from volt.config import PROJECT_ROOT


@pytest.mark.slow  # a fresh interpreter importing torch and Lightning, a 30-step fit: ~20 s
def test_each_hook_of_the_default_run_gets_its_microseconds_a_step() -> None:
    command = ["benchmarks/hook_cost.py", "--steps", "30", "--warmup", "5", "--every-step"]
    done = subprocess.run(
        [sys.executable, *command], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert re.search(r"the fit: [\d,]+ µs a step over 30 steps after 5", done.stdout), done.stdout
    timed = {m[3]: (float(m[1]), float(m[2])) for m in map(LINE.match, lines) if m}
    # the callbacks' per-step hooks, the module's step and the logger's writes, each once a step
    for name in (
        "FiniteGuard.on_before_optimizer_step",
        "GradNorm.on_before_optimizer_step",
        "module.training_step (every side has it)",
        "TensorBoardLogger.log_metrics",
    ):
        assert name in timed, (name, lines)
        assert timed[name][0] > 0
    # once a timed step: the 5 warm-up steps' calls are not counted (35 / 30 if they were)
    assert timed["FiniteGuard.on_before_optimizer_step"][1] == pytest.approx(1.0)
    assert timed["TensorBoardLogger.log_metrics"][1] >= 1.0  # --every-step: each step logs
    # the empty hooks callbacks inherit from Lightning's Callback are not listed
    assert not any(name.startswith("RestoredPathsCheck.on_train_epoch") for name in timed)


LINE = re.compile(r"\s*([\d.]+) µs a step\s+([\d.]+) calls a step\s+(.+)$")


@pytest.mark.slow  # a fresh interpreter and a fit stopped after a second: ~15 s
def test_a_fit_that_stops_before_its_timed_steps_are_done_is_refused() -> None:
    # a second of training cannot reach 100,000 digits steps (a step takes a millisecond or more)
    command = ["benchmarks/hook_cost.py", "--steps", "100000", "--warmup", "5"]
    done = subprocess.run(
        [sys.executable, *command, "+trainer.max_time=00:00:00:01"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode != 0
    assert "of --warmup 5 + --steps 100000" in done.stderr, done.stderr[-2000:]
    assert "µs a step" not in done.stdout
