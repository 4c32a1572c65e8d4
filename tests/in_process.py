"""Volt's entry points in the test's own process: the config a job gets (compose_in) and what
`python train.py ...` or `python -m volt.eval ...` runs (run_here, conftest's run_volt_here).
A fresh interpreter pays the torch and Lightning import first, 6-14 s on a 2-core machine: a
test that needs a run's result (its files, what it said, its exit status) rather than a process
of its own (signals, kills, DDP ranks, a terminal's console) runs it here."""

import gc
import logging
import os
import signal
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from volt.config import CONF_DIR, PROJECT_ROOT
from volt.config.composition import VERSION_BASE

# Overrides that keep a test run small and quiet: few epochs, no progress-bar redraws.
FAST = ["trainer.max_epochs=2", "callbacks.progress_bar=null", "callbacks.model_summary=null"]

RunHere = Callable[..., subprocess.CompletedProcess[str]]


def compose_in(folder: Path, config_name: str, overrides: list[str]) -> DictConfig:
    """The config a job would get, its outputs and run dir in `folder`."""
    GlobalHydra.instance().clear()  # left initialised: the caller clears it when done
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose(
            config_name,
            overrides=[f"paths.outputs_dir={folder / 'outputs'}", *overrides],
            return_hydra_config=True,
        )
    run_dir = folder / "run"
    run_dir.mkdir(exist_ok=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(run_dir)
        cfg.hydra.job.name = config_name
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


class ProcessState:
    """What a run changes in its process and an interpreter's exit would drop: the environment,
    the loggers Hydra and volt configure, signal handlers, torch's global switches."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)

    def __init__(self) -> None:
        import torch

        self.environ = dict(os.environ)
        self.loggers = {
            name: (lg.level, list(lg.handlers), list(lg.filters), lg.propagate, lg.disabled)
            for name, lg in self._loggers().items()
        }
        self.signals = {signum: signal.getsignal(signum) for signum in self.SIGNALS}
        self.torch = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.get_float32_matmul_precision(),
            torch.get_num_threads(),
        )

    @staticmethod
    def _loggers() -> dict[str, logging.Logger]:
        known = logging.Logger.manager.loggerDict.items()
        return {
            "": logging.getLogger(),
            **{name: lg for name, lg in known if isinstance(lg, logging.Logger)},
        }

    def restore(self) -> None:
        import torch

        os.environ.clear()
        os.environ.update(self.environ)
        for name, logger in self._loggers().items():
            level, handlers, filters, propagate, disabled = self.loggers.get(
                name, (logging.NOTSET, [], [], True, False)
            )
            for handler in logger.handlers:
                if handler not in handlers:
                    handler.close()  # the run's train.log, for one
            logger.handlers[:] = handlers
            logger.filters[:] = filters
            logger.setLevel(level)
            logger.propagate, logger.disabled = propagate, disabled
        for signum, handler in self.signals.items():
            signal.signal(signum, handler)
        deterministic, warn_only, matmul, threads = self.torch
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        torch.set_float32_matmul_precision(matmul)
        torch.set_num_threads(threads)
        gc.unfreeze()  # volt's entry freezes what lives until exit: here the worker lives on


def fresh_warning_filters() -> None:
    """A fresh interpreter's warning filters (Python 3.11, no -W option): pytest's, pyproject's
    ignores among them, would keep from a run's stderr what a process of its own shows."""
    warnings.resetwarnings()
    warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
    for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
        warnings.filterwarnings("ignore", category=category, append=True)


def run_here(
    args: list[str],
    module: str | None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    cwd: Path = PROJECT_ROOT,
) -> subprocess.CompletedProcess[str]:
    """`python train.py ARGS` (module="volt.eval": `python -m volt.eval ARGS`), run in this
    process from `cwd` (the project's folder): its exit status, stdout, and stderr with the
    warnings the run raised at its end, as a process prints them. What it changed here is put
    back."""
    from volt import eval as volt_eval
    from volt import train as volt_train

    entry = {None: volt_train.main, "volt.eval": volt_eval.main}[module]
    argv = [module or "train.py", *args]
    state = ProcessState()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", argv)
    GlobalHydra.instance().clear()
    capsys.readouterr()  # what the test printed before is not the run's
    code: int | str | None = 0
    try:
        with warnings.catch_warnings(record=True) as raised:
            fresh_warning_filters()
            entry()
    except SystemExit as exit:
        code = exit.code
    finally:
        GlobalHydra.instance().clear()
        state.restore()
    said = capsys.readouterr()
    shown = "".join(
        warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in raised
    )
    returncode = code if isinstance(code, int) else 1
    return subprocess.CompletedProcess(argv, returncode, said.out, said.err + shown)
