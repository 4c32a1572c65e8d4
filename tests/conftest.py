"""Shared fixtures: compose volt's real configs the way `python train.py` does, into a temp dir."""

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from tests.in_process import FAST, RunHere, compose_in, run_here
from volt.config import PROJECT_ROOT

# Test modules that import an optional extra's package, left out where it is not installed: a GPU
# machine with only torch and Lightning still collects the rest (`pytest -m gpu`). CI installs
# `.[dev]`, which holds them all.
_EXTRAS_TESTS = {
    "mlflow": ["loggers/test_mlflow.py"],
    "optuna": ["sweeps/test_search.py", "sweeps/test_search_runs.py", "sweeps/test_summary.py"],
}
collect_ignore = [
    path
    for package, paths in _EXTRAS_TESTS.items()
    if importlib.util.find_spec(package) is None
    for path in paths
]

# Each `gpu` test's limit unless it sets its own (2 x H100, 4 workers: the slowest, a signalled
# DDP run resumed, took 110 s). It is above run_volt's own timeout, so that a test running volt in a
# subprocess stops that first: the test fails with the run's output, every process of the run
# goes, the session goes on. In-process tests end at this limit, pytest with them (thread method).
GPU_TEST_TIMEOUT_S = 300


# `pytest -m gpu`: the GPU suite's tests are few but each runs real processes for 5-100 s, mostly
# on the host (imports, rank start-up, NCCL, compile), while the GPUs sit nearly idle. So, where
# pytest-xdist is installed and no -n was given, they run in this many worker processes per GPU
# (at most one per 4 CPU cores), all sharing every GPU (the tests' models take under 1 GiB each).
# VOLT_GPU_WORKERS=N sets the number of workers; 0 runs them one by one in this process.
GPU_WORKERS_PER_GPU = 3
GPU_WORKERS_MAX = 8
CPU_CORES_PER_GPU_WORKER = 4


def pytest_cmdline_main(config: pytest.Config) -> None:
    if config.option.markexpr.strip() != "gpu" or not config.pluginmanager.hasplugin("xdist"):
        return
    if config.option.numprocesses is not None or hasattr(config, "workerinput"):
        return  # the caller's -n, or a worker (xdist runs this hook in each worker too)
    import torch  # only for the GPU suite; the CPU suite never needs to ask

    wanted = os.environ.get("VOLT_GPU_WORKERS")
    workers = (
        int(wanted)
        if wanted is not None
        else min(
            GPU_WORKERS_MAX,
            GPU_WORKERS_PER_GPU * torch.cuda.device_count(),
            (os.cpu_count() or 1) // CPU_CORES_PER_GPU_WORKER,
        )
    )
    if workers > 1:  # what `-n N --dist worksteal` sets (xdist's own hook has run already)
        config.option.numprocesses = workers
        config.option.tx = ["popen"] * workers
        config.option.dist = "worksteal"  # a worker that ends early takes over others' tests


# SIGTERM ends the session (exit status 143) once the test in flight ends, as a scheduler or
# `timeout` expects. Without this pytest would go on: a fit installs Lightning's SIGTERM handler or
# volt's GracefulShutdown, the signal stops only that fit (one failed test), and the next test
# starts (seen on 2 x H200, issue #23). The signal is seen whoever handles it: Python writes the
# number of every signal it handles to the wakeup fd, read after each test. Tests marked
# `signals_itself` send SIGTERM to this process on purpose and keep the default handler.
_SIGTERM_BYTE = bytes([signal.SIGTERM])
_wakeup: tuple[int, int] | None = None  # the pipe's (read, write) ends


# pytest prints its summary (failures, --durations) only for its own exit codes: the session
# stops as INTERRUPTED, and the process exits 128 + the signal after it (pytest_unconfigure).
_session: pytest.Session | None = None
_stopped_by: int | None = None


def _stop_session(signum: int, frame: object) -> None:
    global _stopped_by
    _stopped_by = signum
    _signal_workers(signum)
    pytest.exit(f"stopped by {signal.Signals(signum).name}", returncode=pytest.ExitCode.INTERRUPTED)


def _signal_workers(signum: int) -> None:
    """Under xdist, the controller passes the signal on to its workers (its only children): they
    would otherwise go on starting tests after it is gone. Each stops as this process does."""
    if _session is None or not _session.config.pluginmanager.hasplugin("dsession"):
        return
    me = os.getpid()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == me:
                os.kill(int(stat.parent.name), signum)


def pytest_sessionstart(session: pytest.Session) -> None:
    global _session
    _session = session


def pytest_unconfigure(config: pytest.Config) -> None:
    if _stopped_by is not None and _session is not None:
        _session.exitstatus = 128 + _stopped_by


def pytest_configure(config: pytest.Config) -> None:
    global _wakeup
    config.addinivalue_line("markers", "signals_itself: the test sends SIGTERM to this process")
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return  # someone else's handler (xdist, an IDE): theirs to honour
    _wakeup = os.pipe()
    for end in _wakeup:
        os.set_blocking(end, False)
    signal.signal(signal.SIGTERM, _stop_session)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    if _wakeup is None:
        yield
        return
    own = item.get_closest_marker("signals_itself") is not None
    signal.signal(signal.SIGTERM, signal.SIG_DFL if own else _stop_session)
    signal.set_wakeup_fd(_wakeup[1])  # again: asyncio, for one, takes it and sets none back
    yield
    received = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(_wakeup[0], 512):
            received += chunk
    signal.signal(signal.SIGTERM, _stop_session)
    if _SIGTERM_BYTE in received and not own:
        global _stopped_by
        _stopped_by = signal.SIGTERM
        message = f"stopped by SIGTERM during {item.nodeid}"
        pytest.exit(message, returncode=pytest.ExitCode.INTERRUPTED)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("timeout"):
        return  # pytest-timeout (the dev extra) not installed: no limits to set
    for item in items:
        if item.get_closest_marker("gpu") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(GPU_TEST_TIMEOUT_S))


@pytest.fixture
def fast() -> list[str]:
    """Overrides that keep a test run small and quiet: few epochs, no progress-bar redraws."""
    return list(FAST)


@pytest.fixture
def compose_config(tmp_path: Path) -> Callable[..., DictConfig]:
    """compose_config("train", ["model=cnn"]) -> the config a job would get, run dir in tmp_path."""

    def _compose(config_name: str = "train", overrides: list[str] | None = None) -> DictConfig:
        return compose_in(tmp_path, config_name, overrides or [])

    yield _compose
    GlobalHydra.instance().clear()


@pytest.fixture
def run_volt(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """run_volt(["model=cnn"]) runs `python train.py ...` as a user would, outputs in tmp_path;
    module="volt.eval" runs `python -m volt.eval ...` instead."""

    def _run(
        args: list[str], module: str | None = None, timeout: float = 240
    ) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", module] if module else [sys.executable, "train.py"]
        command += [*args, f"paths.outputs_dir={tmp_path / 'outputs'}"]
        # In a session of its own, so that a timeout (or Ctrl+C) ends every process of the run,
        # the DDP ranks it started too, and not only the one started here.
        with subprocess.Popen(
            command,
            cwd=PROJECT_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        ) as process:
            try:
                stdout, stderr = process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                stdout, stderr = process.communicate()  # what it said before it hung
                pytest.fail(
                    f"still running after {timeout:.0f} s: {' '.join(command)}\n"
                    f"--- stdout (end)\n{stdout[-3000:]}\n--- stderr (end)\n{stderr[-5000:]}"
                )
            except BaseException:
                with contextlib.suppress(ProcessLookupError):  # all gone already
                    os.killpg(process.pid, signal.SIGKILL)
                raise
        return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)

    return _run


@pytest.fixture
def run_volt_here(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> RunHere:
    """run_volt_here(["name=x"]) runs what run_volt(["name=x"]) runs, outputs in tmp_path too,
    in this process (tests/in_process.py): for a test that needs a run's result, not a process
    of its own; it saves a fresh interpreter's torch and Lightning import."""

    def _run(
        args: list[str], module: str | None = None, cwd: Path = PROJECT_ROOT
    ) -> subprocess.CompletedProcess[str]:
        outputs = f"paths.outputs_dir={tmp_path / 'outputs'}"
        return run_here([*args, outputs], module, capsys, monkeypatch, cwd)

    return _run
