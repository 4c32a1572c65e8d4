"""SIGTERM or Ctrl+C where volt.callbacks.graceful_shutdown does not act: while the run prepares,
builds, starts its ranks and sets up (compile, the data), and during test. There is nothing to
save at those moments, so the run stops at once: one line saying where it stopped and what the
same command will do next, then `TrainingInterrupted` (exit 143 for SIGTERM, 130 for Ctrl+C);
the DDP ranks it started are stopped with it. Without this, a SIGTERM before training killed the
process mid-start-up with no word (its log ended at "Initializing distributed"), and Ctrl+C ended
as Lightning's exit 1.

Python runs a signal handler only between bytecodes of the main thread, and the main thread can
wait in C for long at start-up: in the rendezvous of `init_process_group` for ranks that are
gone, in a collective. So the signal also wakes a watcher thread (`signal.set_wakeup_fd`): when
the handler has not run within MAIN_THREAD_GRACE_S, the watcher says where the run stopped,
stops this process's children (the ranks it started) and exits the process itself.

GracefulShutdown installs its own handlers for the fit's training loop and puts these back when
training ends; the watcher leaves a signal alone while they (or Lightning's, which call them)
are not these. A second signal while stopping is the default one: it kills at once.
"""

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import FrameType
from typing import Any

from volt.errors import TrainingInterrupted
from volt.runs.records import end_open_records

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# How long the main thread has to run its handler before the watcher ends the process itself.
MAIN_THREAD_GRACE_S = 3.0
# How long the children (the ranks) have to exit on SIGTERM before they are killed.
CHILDREN_EXIT_S = 5.0


class RunStopper:
    """Knows where the run is (`at`), and stops it there on a signal."""

    def __init__(self, checkpoints: Path | None, named: bool) -> None:
        self.checkpoints = checkpoints
        self.named = named
        self.where = "preparing the run"
        self.handled = threading.Event()  # the main thread's handler ran

    def at(self, where: str) -> None:
        self.where = where

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.handled.set()
        for each in SIGNALS:  # a second signal kills at once
            signal.signal(each, signal.SIG_DFL)
        self.say(signum)
        raise TrainingInterrupted(signum, None, self.where)

    def say(self, signum: int, how: str = "") -> None:
        name = signal.Signals(signum).name
        log.warning("Stopped on %s while %s%s: %s", name, self.where, how, self.next_time())

    def next_time(self) -> str:
        if self.checkpoints is None:  # eval: it saves nothing
            return "the same command starts it again"
        if not self.named:
            return "nothing to resume (an unnamed run starts anew; name=... makes runs resumable)"
        if any(self.checkpoints.glob("*.ckpt")):
            return "the same command resumes the run from its newest checkpoint"
        return "no checkpoint yet: the same command starts the run again"

    def is_installed(self, signum: int) -> bool:
        """This stopper answers `signum` now, alone or through Lightning's handler, which calls
        the one it found (lightning/pytorch/trainer/connectors/signal_connector.py, 2.6.6)."""
        handler: Any = signal.getsignal(signum)
        return handler == self.on_signal or self.on_signal in getattr(
            handler, "signal_handlers", ()
        )


@contextmanager
def stop_on_signals(checkpoints: Path | None, named: bool) -> Iterator[RunStopper]:
    """SIGTERM and SIGINT stop the run where it is (see the module docstring), in this block;
    `checkpoints`: where the run saves them, None for one that saves none (eval);
    the handlers before it come back after. Only the main thread can install handlers: in
    another (a test's worker thread) this does nothing."""
    stopper = RunStopper(checkpoints, named)
    if threading.current_thread() is not threading.main_thread():
        yield stopper
        return
    before = {signum: signal.signal(signum, stopper.on_signal) for signum in SIGNALS}
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    previous_fd = signal.set_wakeup_fd(write_end)
    stop_watching = threading.Event()
    watcher = threading.Thread(
        target=_watch,
        args=(stopper, read_end, previous_fd, stop_watching),
        name="volt-stop-signals",
        daemon=True,
    )
    watcher.start()
    try:
        yield stopper
    finally:
        signal.set_wakeup_fd(previous_fd)
        stop_watching.set()
        # Wakes the watcher to leave. This thread owns the read end too, so the write always finds
        # a reader: a watcher that saw `stop_watching` first (it read a signal's byte only after
        # the handler had run and this block began to leave) has left without waiting, and used
        # to close the read end, which made this write a BrokenPipeError on a loaded machine.
        os.write(write_end, b"\0")
        # It leaves at once, or after _unless_handled: its wait for the handler, or the process's
        # end. Joined for that long, so the read end is closed after it in all but that end.
        watcher.join(timeout=MAIN_THREAD_GRACE_S + CHILDREN_EXIT_S + 1)
        os.close(write_end)
        if not watcher.is_alive():
            os.close(read_end)
        for signum, handler in before.items():
            if handler is not None:
                signal.signal(signum, handler)


def _watch(stopper: RunStopper, read_end: int, previous_fd: int, stop: threading.Event) -> None:
    while not stop.is_set():
        received = os.read(read_end, 64)
        if previous_fd != -1:  # whoever watched before (pytest's conftest) sees them too
            with suppress(OSError):
                os.write(previous_fd, received)
        for signum in received:
            if signum in SIGNALS and stopper.is_installed(signum) and not stop.is_set():
                _unless_handled(stopper, signum)


def _unless_handled(stopper: RunStopper, signum: int) -> None:
    """The main thread waits in C: end the process from here (see the module docstring)."""
    if stopper.handled.wait(MAIN_THREAD_GRACE_S):
        return
    stopper.say(signum, " (waiting outside Python: in the rendezvous, a collective or I/O)")
    end_open_records("interrupted", signal=signal.Signals(signum).name)
    children = _children()
    for pid in children:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + CHILDREN_EXIT_S
    while time.monotonic() < deadline and any(_alive(pid) for pid in children):
        time.sleep(0.1)
    for pid in children:
        _signal(pid, signal.SIGKILL)
    logging.shutdown()
    os._exit(128 + signum)


def _children() -> list[int]:
    """This process's children (Linux' /proc): the ranks it started, data-loader workers."""
    me, found = os.getpid(), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == me:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
        os.kill(pid, 0)
    except (ChildProcessError, ProcessLookupError):
        return False
    return True


def _signal(pid: int, signum: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, signum)
