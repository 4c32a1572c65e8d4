"""A signal outside the training loop stops the run at once, with one line saying where
(volt.runs.stop_signals): in-process, and a real DDP run over two gloo ranks signalled while its
ranks start, the case that left a silent log on 4 GPUs."""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from volt.config import PROJECT_ROOT
from volt.errors import TrainingInterrupted
from volt.runs import stop_signals
from volt.runs.stop_signals import stop_on_signals


@pytest.mark.signals_itself
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_raises_where_the_run_is(
    signum: int, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    before = signal.getsignal(signum)
    with pytest.raises(TrainingInterrupted) as stopped, stop_on_signals(tmp_path, True) as stop:
        stop.at("building the model and the data")
        os.kill(os.getpid(), signum)
        time.sleep(5)  # the handler runs here
    assert stopped.value.code == 128 + signum
    assert stopped.value.where == "building the model and the data"
    (line,) = [r.getMessage() for r in caplog.records if r.name == "volt.runs.stop_signals"]
    name = signal.Signals(signum).name
    assert line == (
        f"Stopped on {name} while building the model and the data: no checkpoint yet: the same"
        " command starts the run again"
    )
    assert signal.getsignal(signum) == before


def test_the_line_says_what_the_same_command_does(tmp_path: Path) -> None:
    with stop_on_signals(tmp_path, named=False) as stop:
        assert stop.next_time().startswith("nothing to resume")
    with stop_on_signals(tmp_path, named=True) as stop:
        (tmp_path / "last.ckpt").write_bytes(b"")
        assert stop.next_time() == "the same command resumes the run from its newest checkpoint"


def test_a_watcher_that_left_first_does_not_break_the_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a loaded machine the watcher can read a signal's byte only after the handler ran and
    the block began to leave, see the stop flag and leave before it is woken (CI, a ddp rank
    signalled during setup: BrokenPipeError from the wake-up write). Made certain here: the
    watcher sets the flag itself and leaves before the block ends, which then closes the pipe."""
    real_watch = stop_signals._watch
    left = threading.Event()
    read_ends: list[int] = []

    def watch_then_leave(*args: Any) -> None:
        read_ends.append(args[1])
        args[-1].set()  # the stop flag, as the leaving block sets it
        real_watch(*args)
        left.set()

    monkeypatch.setattr(stop_signals, "_watch", watch_then_leave)
    with stop_on_signals(tmp_path, named=True):
        assert left.wait(5)
    with pytest.raises(OSError):  # the block closed the read end after the watcher left
        os.fstat(read_ends[0])


def test_sigterm_while_ddp_ranks_start_ends_every_rank(tmp_path: Path) -> None:
    """SIGTERM to rank 0 right after it started rank 1: rank 0 then waits in the rendezvous (in
    C, where no Python handler runs) for a rank still importing torch."""
    outputs = tmp_path / "outputs"
    command = [
        sys.executable,
        "train.py",
        "trainer=ddp",
        "trainer.devices=2",
        "logger=none",
        "callbacks.progress_bar=null",
        "name=signalled",
        f"paths.outputs_dir={outputs}",
    ]
    log = outputs / "train" / "runs" / "signalled" / "train.log"
    with subprocess.Popen(
        command, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as rank_0:
        deadline = time.monotonic() + 180
        while not (log.is_file() and "Started rank 1" in log.read_text()):
            assert rank_0.poll() is None and time.monotonic() < deadline, "no rank started"
            time.sleep(0.1)
        rank_0.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        output, _ = rank_0.communicate(timeout=60)
    assert time.monotonic() - signalled < 30, output[-3000:]
    assert rank_0.returncode == 143, output[-3000:]
    text = log.read_text()
    assert re.search(r"Stopped on SIGTERM while starting the fit .*: no checkpoint yet", text)
    (rank_1,) = re.findall(r"Started rank 1 \(pid (\d+)\)", text)
    with pytest.raises(ProcessLookupError):
        os.kill(int(rank_1), 0)
