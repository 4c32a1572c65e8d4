"""One process per run directory: a second `python train.py name=x` is refused with one line that
names the first and writes nothing; a holder that was killed never blocks the resume. Real
processes throughout: the lock is only worth something between processes."""

import errno
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from tests.in_process import RunHere
from tests.test_bad_inputs import snapshot
from volt.config import PROJECT_ROOT
from volt.runs.lock import LOCK_FILE, RunLockedError, lock_run_dir

# Takes the lock of argv[1] and holds it until its stdin closes, or says why it could not. The
# lock module is loaded from its file: the package's __init__ (volt.runs) imports Lightning for
# its TensorBoard records, which the lock does not use, and a holder would wait 6-14 s for it.
TRY_LOCK = """
import importlib.util
import sys
from pathlib import Path
import volt
where = Path(volt.__file__).parent / "runs" / "lock.py"
spec = importlib.util.spec_from_file_location("volt_runs_lock", where)
lock_module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock_module)
try:
    lock = lock_module.lock_run_dir(Path(sys.argv[1]))  # held while the object lives
except lock_module.RunLockedError as error:
    print(f"refused: {error}", flush=True)
    sys.exit(2)
print("held", flush=True)
sys.stdin.read()
"""

Locker = Callable[..., subprocess.Popen[str]]


@pytest.fixture
def start_locker() -> Iterator[Locker]:
    """start_locker(dir, **environment) -> a process running TRY_LOCK on dir; its first line says
    how it went."""
    started: list[subprocess.Popen[str]] = []

    def _start(directory: Path, **environment: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-c", TRY_LOCK, str(directory)],
            cwd=PROJECT_ROOT,
            env={**os.environ, **environment},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(process)
        return process

    yield _start
    for process in started:
        process.kill()
        process.wait()


def first_line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    return process.stdout.readline().strip()


def holder_details(pid: int) -> str:
    """The start of what a refusal says about the holder `pid` on this machine."""
    return f"pid {pid} on {socket.gethostname()} since "


def test_a_second_process_is_refused_and_told_who_holds_the_run(
    start_locker: Locker, tmp_path: Path
) -> None:
    run_dir = tmp_path / "runs" / "x"
    holder = start_locker(run_dir, SLURM_JOB_ID="4242")
    assert first_line(holder) == "held"
    before = snapshot(tmp_path)

    with pytest.raises(RunLockedError) as refused:
        lock_run_dir(run_dir)

    message = str(refused.value)
    assert holder_details(holder.pid) in message
    assert f"(-c {run_dir}, SLURM job 4242)" in message  # its command line and job
    assert "\n" not in message
    assert snapshot(tmp_path) == before


def test_processes_racing_for_a_new_run_leave_exactly_one_holder(
    start_locker: Locker, tmp_path: Path
) -> None:
    run_dir = tmp_path / "runs" / "x"  # made by whichever gets there first
    racers = [start_locker(run_dir) for _ in range(4)]
    lines = {racer.pid: first_line(racer) for racer in racers}

    (winner,) = [pid for pid, line in lines.items() if line == "held"]
    for pid, line in lines.items():
        if pid != winner:
            assert line.startswith("refused: "), line
            assert holder_details(winner) in line


def test_a_killed_holder_never_blocks_the_next_one(start_locker: Locker, tmp_path: Path) -> None:
    run_dir = tmp_path / "x"
    holder = start_locker(run_dir)
    assert first_line(holder) == "held"
    holder.kill()
    holder.wait()

    lock = lock_run_dir(run_dir)

    assert lock is not None
    assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert first_line(start_locker(run_dir)) == "held"


def test_a_released_lock_is_free_while_a_forked_child_lives_on(
    start_locker: Locker, tmp_path: Path
) -> None:
    """DataLoader workers are forked from the holder and share its open lock file."""
    lock = lock_run_dir(tmp_path / "x")
    assert lock is not None
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    try:
        lock.release()
        assert first_line(start_locker(tmp_path / "x")) == "held"
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def test_without_file_locks_the_run_goes_on_after_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    def refuse(*args: object) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr("volt.runs.lock.fcntl.flock", refuse)
    with caplog.at_level(logging.WARNING, logger="volt.runs.lock"):
        assert lock_run_dir(tmp_path / "x") is None
    assert "without file locks (No locks available): this run is not locked" in caplog.text


def volt_command(*args: str, outputs: Path) -> list[str]:
    return [sys.executable, "train.py", *args, f"paths.outputs_dir={outputs}"]


# -m name=grid with nothing to sweep is one job, in <sweep>/0_ (the name is left out of the
# job directory's name).
@pytest.mark.parametrize("held", ["grid", "grid/0_"], ids=["sweep", "job"])
def test_a_sweep_stops_at_a_directory_another_process_holds(
    held: str, start_locker: Locker, run_volt_here: RunHere, tmp_path: Path
) -> None:
    outputs = tmp_path / "outputs"
    held_dir = outputs / "train" / "multiruns" / held
    holder = start_locker(held_dir)
    assert first_line(holder) == "held"
    before = snapshot(outputs)

    result = run_volt_here(["-m", "name=grid"])  # in this process: the holder is another

    assert result.returncode == 2, result.stderr[-3000:]
    assert f"volt: error: {held_dir} is in use by {holder_details(holder.pid)}" in result.stderr
    assert json.loads((held_dir / LOCK_FILE).read_text())["pid"] == holder.pid
    if held == "grid":
        assert snapshot(outputs) == before
    else:
        # Hydra makes a job's directory, its .hydra/ and its log before any hook can lock it;
        # volt itself wrote nothing there.
        written = {Path(p).name for p in snapshot(outputs)}
        assert not written & {"metrics.json", "run.json", "summary.csv", "config_resolved.yaml"}
        assert all(p.stat().st_size == 0 for p in outputs.rglob("train.log"))


# Still training when the second command starts, however long that takes to start on a loaded
# machine (50 epochs once ended first: about 25 s of digits on 2 busy cores; no early stop); the
# test kills it, and the resume ends after a few steps (see trainer.max_steps below).
RUN = ["name=x", "trainer.max_epochs=100000", "callbacks.early_stopping=null", "test=false"]
RUN += ["callbacks.progress_bar=null", "callbacks.model_summary=null"]
# What the first process writes once, before training: the second must change none of it.
WRITTEN_AT_START = [".lock", ".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml"]
WRITTEN_AT_START += ["run.json", "config_resolved.yaml", "config_tree.txt", "packages.txt"]


def wait_for(path: Path, process: subprocess.Popen[bytes], console: Path) -> None:
    deadline = time.monotonic() + 180
    while not path.is_file():
        assert process.poll() is None, console.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no {path} after 180 s"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["cpu", "ddp"])
def test_a_second_run_is_refused_and_the_killed_first_resumes(trainer: str, tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    run_dir = outputs / "train" / "runs" / "x"
    command = volt_command(*RUN, f"trainer={trainer}", outputs=outputs)
    first_console = tmp_path / "first.txt"
    with first_console.open("wb") as console:
        # A session of its own, so that killing its process group takes its DDP rank too.
        first = subprocess.Popen(
            command,
            cwd=PROJECT_ROOT,
            stdout=console,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(run_dir / "checkpoints" / "last.ckpt", first, first_console)  # training
        assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == first.pid
        before = {k: v for k, v in snapshot(run_dir).items() if k in WRITTEN_AT_START}
        assert len(before) == len(WRITTEN_AT_START)
        log_before = (run_dir / "train.log").read_text()

        second = subprocess.run(
            command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120
        )

        # Refused at once, not after waiting for the lock: the first is still training.
        assert first.poll() is None, "the first run ended before the second was refused"
        assert second.returncode == 2, second.stderr[-3000:]
        assert second.stdout == ""
        (line,) = second.stderr.strip().splitlines()
        assert f"volt: error: {run_dir} is in use by {holder_details(first.pid)}" in line
        assert "train.py name=x" in line
        after = snapshot(run_dir)
        assert {k: v for k, v in after.items() if k in WRITTEN_AT_START} == before
        log_after = (run_dir / "train.log").read_text()
        assert log_after.startswith(log_before)
        assert log_after.count("float32 matmul precision") == 1  # one process started in it
        assert not [k for k in after if "-v1" in k]
        assert [p.name for p in run_dir.parent.iterdir()] == ["x"]
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()

    # A few steps past the last checkpoint, so that the resume trains and then ends.
    step = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    third = subprocess.run(
        [*command, f"trainer.max_steps={step + 3}"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert third.returncode == 0, third.stderr[-3000:]
    assert "resuming run x from" in third.stdout + third.stderr
    assert json.loads((run_dir / "metrics.json").read_text())["status"] == "completed"
    lock = lock_run_dir(run_dir)  # let go of at the end of the run
    assert lock is not None
    lock.release()
