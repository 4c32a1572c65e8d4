"""A fit leaves SIGTERM and SIGINT handled as before it, however it ends: a handler left behind
only takes note of a signal, and the process (a test session, a sweep) no longer stops on it."""

import math
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from types import FrameType
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from volt.callbacks.finite_guard import FiniteGuard, NonFiniteLossError
from volt.callbacks.graceful_shutdown import GracefulShutdown
from volt.config import PROJECT_ROOT
from volt.errors import TrainingInterrupted

pytestmark = pytest.mark.signals_itself  # SIGTERM to this process, in-process fits

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Regression(pl.LightningModule):
    def __init__(self, nan_loss_at: int | None = None) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.nan_loss_at = nan_loss_at

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        return loss * math.nan if self.global_step == self.nan_loss_at else loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.training_step(batch, batch_idx)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class AtStep(Callback):
    """At the start of global step `step`: send this process `signals`, or raise `error`."""

    def __init__(
        self, step: int, signals: tuple[int, ...] = (), error: Exception | None = None
    ) -> None:
        self.step = step
        self.signals = signals
        self.error = error

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step != self.step:
            return
        for signum in self.signals:
            os.kill(os.getpid(), signum)  # the handler runs before kill returns to Python
        if self.error is not None:
            raise self.error


def batches() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)


def fit(callbacks: list[Callback], model: Regression | None = None, **trainer_args: Any) -> None:
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=callbacks,
        **trainer_args,
    )
    trainer.fit(model or Regression(), batches(), batches())


# How a fit can end, and what it raises then. Each runs GracefulShutdown (whose handlers are the
# ones at stake) and Lightning's own (which it installs for every fit).
ENDINGS: dict[str, tuple[Any, ...]] = {
    "trained": (lambda d: fit([GracefulShutdown(d)]), None),
    "nothing to train": (lambda d: fit([GracefulShutdown(d)], limit_train_batches=0), None),
    "raised": (
        lambda d: fit([GracefulShutdown(d), AtStep(2, error=RuntimeError("boom"))]),
        RuntimeError,
    ),
    "non-finite loss": (
        lambda d: fit([FiniteGuard(), GracefulShutdown(d)], Regression(nan_loss_at=2)),
        NonFiniteLossError,
    ),
    "SIGTERM": (
        lambda d: fit([GracefulShutdown(d), AtStep(2, (signal.SIGTERM,))]),
        TrainingInterrupted,
    ),
    "Ctrl+C twice": (  # the second stops at once: Lightning's KeyboardInterrupt path, exit 1
        lambda d: fit([GracefulShutdown(d), AtStep(2, (signal.SIGINT, signal.SIGINT))]),
        SystemExit,
    ),
}


def _sentinel(signum: int, frame: FrameType | None) -> None:
    raise AssertionError(f"the sentinel handler got {signal.Signals(signum).name}")


@pytest.fixture
def sentinel_handlers() -> Iterator[None]:
    """Handlers of the test's own for SIGTERM and SIGINT, so that a fit that puts back anything
    else (its own, or Python's defaults) is seen."""
    before = {signum: signal.signal(signum, _sentinel) for signum in SIGNALS}
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


@pytest.mark.usefixtures("sentinel_handlers")
@pytest.mark.parametrize("ending", ENDINGS)
def test_a_fit_leaves_the_signal_handlers_as_it_found_them(ending: str, tmp_path: Any) -> None:
    run, raises = ENDINGS[ending]
    if raises is None:
        run(tmp_path)
    else:
        with pytest.raises(raises):
            run(tmp_path)
    assert {signum: signal.getsignal(signum) for signum in SIGNALS} == dict.fromkeys(
        SIGNALS, _sentinel
    )


@pytest.mark.usefixtures("sentinel_handlers")
def test_the_callback_guards_the_next_fit_after_one_with_nothing_to_train(tmp_path: Any) -> None:
    # The sanity check installs the handlers; with no training after it, only the end of the
    # fit can take them down, or the next fit finds them "already installed" and goes unguarded.
    shutdown = GracefulShutdown(tmp_path)
    fit([shutdown], limit_train_batches=0)
    with pytest.raises(TrainingInterrupted):
        fit([shutdown, AtStep(2, (signal.SIGTERM,))])
    assert (tmp_path / "last.ckpt").is_file()


# The same in a process of its own, as pytest runs the GPU tests: after fits that ended in every
# way above, SIGTERM still ends it.
SCRIPT = """
import signal, time
from tests.callbacks.test_signal_handlers import ENDINGS
for run, raises in ENDINGS.values():
    try:
        run({run_dir!r})
    except BaseException as error:
        assert raises is not None and isinstance(error, raises), repr(error)
print("fits done", flush=True)
signal.raise_signal(signal.SIGTERM)
time.sleep(30)
"""


def test_sigterm_still_ends_the_process_after_its_fits(tmp_path: Any) -> None:
    script = SCRIPT.format(run_dir=str(tmp_path))
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "fits done" in result.stdout, result.stderr[-3000:]
    assert result.returncode == -signal.SIGTERM, result.stderr[-3000:]
