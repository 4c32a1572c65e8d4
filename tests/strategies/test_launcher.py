"""A DDP run in which one rank goes wrong ends on every rank within a bounded time, rank 0 says
what went wrong, the job exits non-zero, and no process of it is left: real runs of
`python train.py trainer=ddp` over two CPU processes (gloo), each in a session of its own so that
every process the run started can be found by its session id."""

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from volt.config import PROJECT_ROOT
from volt.strategies.launcher import CRASHED_RANK_EXIT_S, RANK_ZERO_GRACE_S

PROBES = "tests.strategies.rank_probes"
CPU_DDP = [
    "trainer=ddp",
    "trainer.devices=2",
    "trainer.accelerator=cpu",  # gloo on a GPU machine too
    "trainer.max_epochs=1",
    "trainer.num_sanity_val_steps=0",
    "callbacks.progress_bar=null",
    "callbacks.model_summary=null",
    "trusted_targets=[tests]",  # the probes below are the tests' own callbacks
]
# Synchronised BatchNorm statistics would carry one rank's NaN inputs into every rank's loss.
ONE_RANKS_LOSS = "trainer.sync_batchnorm=false"
# From the failure to the last process's exit: the launcher's own deadlines (rank 0 is killed
# RANK_ZERO_GRACE_S after another rank failed; the other ranks CRASHED_RANK_EXIT_S after rank 0
# raised), with room for a busy machine. A rank left waiting in a collective would take minutes.
AFTER_FAILURE_S = RANK_ZERO_GRACE_S + CRASHED_RANK_EXIT_S + 10
# The whole run: 20 s on 2 idle cores, mostly imports; over a minute on busy ones.
RUN_TIMEOUT_S = 240


@dataclass
class Ended:
    returncode: int
    seconds_after_failure: float
    stderr: str
    run_dir: Path
    left_behind: list[str]  # `pid command` of the run's processes alive after rank 0 exited


def state_and_session(pid: int | str) -> tuple[str, int] | None:
    """A process's state letter and session id, from /proc; None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The fields after the command name (which may hold spaces): state ppid pgrp session ...
    state, _, _, session = stat[stat.rindex(")") + 2 :].split()[:4]
    return state, int(session)


def is_alive(pid: int | str) -> bool:
    found = state_and_session(pid)
    return found is not None and found[0] != "Z"  # a zombie has exited, only not been reaped


def live_processes_in_session(session: int) -> list[str]:
    """`pid command` of each live process in `session`."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        state = state_and_session(proc.name)
        if state is None or state[1] != session or state[0] == "Z":
            continue
        try:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # ended while we looked
            command = "?"
        found.append(f"{proc.name} {command}")
    return found


def run_ddp(tmp_path: Path, *overrides: str) -> Ended:
    outputs = tmp_path / "outputs"
    stderr_file = tmp_path / "stderr.txt"
    with open(stderr_file, "w") as stderr:
        # Files, not pipes: a rank left behind would hold a pipe open and hang the reading.
        process = subprocess.Popen(
            [sys.executable, "train.py", *CPU_DDP, *overrides, f"paths.outputs_dir={outputs}"],
            cwd=PROJECT_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
        try:
            returncode = process.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            returncode = None
        ended_at = time.time()
        left_behind = live_processes_in_session(process.pid)
        if returncode is None or left_behind:
            os.killpg(process.pid, signal.SIGKILL)  # no strays for the tests after this one
            process.wait()
    stderr_text = stderr_file.read_text()
    assert returncode is not None, f"still running after {RUN_TIMEOUT_S} s:\n{stderr_text[-3000:]}"
    runs = list((outputs / "train" / "runs").iterdir())
    assert len(runs) == 1, runs
    failed_at = float((runs[0] / "failed_at.txt").read_text())  # written by the probe
    return Ended(returncode, ended_at - failed_at, stderr_text, runs[0], left_behind)


def assert_ended_cleanly(ended: Ended) -> None:
    assert ended.returncode != 0, ended.stderr[-3000:]
    assert ended.seconds_after_failure < AFTER_FAILURE_S
    assert not ended.left_behind
    # The rank volt started is gone, by the pid the launcher logged for it.
    started = re.search(r"Started rank 1 \(pid (\d+)\)", (ended.run_dir / "train.log").read_text())
    assert started is not None
    assert not is_alive(started[1])


def rank1_log(ended: Ended) -> str:
    return (ended.run_dir / "train_rank1.log").read_text()


def test_a_nan_loss_on_one_rank_stops_every_rank_at_its_step(tmp_path: Path) -> None:
    nan = f"+callbacks.nan={{_target_:{PROBES}.NaNInputOnRank,rank:1,step:3}}"
    ended = run_ddp(tmp_path, ONE_RANKS_LOSS, nan)

    assert_ended_cleanly(ended)
    # Rank 0's loss was finite: it stops on the verdict it pooled with rank 1, at the first
    # check after the bad step (FiniteGuard checks every 10 steps: at step 9).
    assert ended.returncode == 2  # volt's one-line error, not a traceback
    assert (
        "volt: error: non-finite loss (NaN or inf) on another rank at global step 3; seen at"
        " global step 9" in ended.stderr
    )
    assert "RankFailedError" not in ended.stderr  # rank 1 is not blamed for stopping with it
    # Rank 1 stopped by itself at the same step, on its own NaN loss: it was not killed.
    assert (
        "Rank 1 failed: non-finite loss (NaN or inf) at global step 3; seen at global step 9"
        in rank1_log(ended)
    )


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_an_exception_on_one_rank_ends_the_run_with_its_error(rank: int, tmp_path: Path) -> None:
    failure = f"+callbacks.fail={{_target_:{PROBES}.FailOnRank,rank:{rank},when:training}}"
    ended = run_ddp(tmp_path, failure)

    assert_ended_cleanly(ended)
    assert f"RuntimeError: injected failure on rank {rank} (training)" in ended.stderr
    if rank == 1:
        # Rank 0's collective broke when rank 1 exited; the report names the rank that failed.
        assert (
            "RankFailedError: rank 1 of 2 failed: RuntimeError: injected failure on rank 1"
            " (training) (its log: " in ended.stderr
        )
        assert "injected failure on rank 1" in rank1_log(ended)
    else:
        # Rank 1 waited for rank 0 in a collective and was stopped: nothing to blame it for.
        assert "RankFailedError" not in ended.stderr
