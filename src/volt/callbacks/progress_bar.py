"""Lightning's rich progress bar, without a GPU sync on every training step, and without a rate
of 0.00it/s where rich has measured none yet."""

import math
import time
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import RichProgressBar as LightningRichProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import ProcessingSpeedColumn
from rich.progress import ProgressColumn, Task
from rich.text import Text
from typing_extensions import override


class RichProgressBar(LightningRichProgressBar):
    """Shows `step_metrics` (logged each step, e.g. the training loss) as of the last batch after
    which Lightning wrote the logs, read at most every `metrics_every_s` seconds, besides the
    metrics logged with `prog_bar=True`.

    Turning a logged GPU tensor into a number (`.item()`) makes the CPU wait for the GPU to
    finish the step: the queue of kernels runs dry and the next step's launches are no longer
    hidden behind this one's work. Lightning does that after every batch for each metric logged
    with `prog_bar=True`, so volt logs per-step values without it and this bar reads them itself,
    only after the batches at which Lightning turns the logged values into numbers for the
    loggers (every `trainer.log_every_n_steps`), waiting for the GPU anyway. Metrics are read
    afresh at validation and epoch ends.

    The bar is drawn `refresh_rate` times a second (once by default) by a thread of rich's own, so
    its step counter is moved at most every `MOVE_EVERY_S` (and before validation and at each
    epoch's end): moving it after every batch of a fast loop cost tens of microseconds a step
    that no drawing showed.
    """

    MOVE_EVERY_S = 0.1

    def __init__(
        self,
        step_metrics: Sequence[str] = ("train/loss",),
        metrics_every_s: float = 0.5,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.step_metrics = tuple(step_metrics)
        self.metrics_every_s = metrics_every_s
        self._shown: dict[str, int | str | float | dict[str, float]] | None = None
        # Clocks start at "never": time.monotonic() counts from boot, so a start of 0.0 would hold
        # the first draw back on a machine up for less than an interval.
        self._read_at = -math.inf
        self._in_train_batch = False
        self._logs_after_batch = False
        self._moved_at = -math.inf
        self._batches_done = 0  # in this epoch, as far as this bar was told

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self._batches_done = batch_idx + 1
        # Lightning 2.6's own test, before it writes the logs at the end of this batch.
        self._logs_after_batch = trainer._logger_connector.should_update_logs
        now = time.monotonic()
        read_due = self._logs_after_batch and now - self._read_at >= self.metrics_every_s
        if now - self._moved_at < self.MOVE_EVERY_S and not read_due:
            return
        self._moved_at = now
        self._in_train_batch = True
        try:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        finally:
            self._in_train_batch = False

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._move_to_batches_done()
        super().on_validation_start(trainer, pl_module)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._move_to_batches_done()
        super().on_train_epoch_end(trainer, pl_module)

    @override
    def configure_columns(self, trainer: pl.Trainer) -> list[ProgressColumn]:
        return [
            BatchRateColumn(self.theme.processing_speed)
            if isinstance(column, ProcessingSpeedColumn)
            else column
            for column in super().configure_columns(trainer)
        ]

    @override
    def _get_train_description(self, current_epoch: int) -> str:
        # Lightning 2.6.6 shows "Epoch 3/-2" when max_epochs=-1 (no epoch limit: a run that ends
        # at max_steps, as the GPT experiments do). Its issue #21925, fixed by PR #21924 after
        # 2.6.6: delete this once volt requires a Lightning with that fix.
        if self.trainer.max_epochs is not None and self.trainer.max_epochs < 0:
            return f"{f'Epoch {current_epoch}':{len(self.validation_description)}}"
        return super()._get_train_description(current_epoch)

    def _move_to_batches_done(self) -> None:
        """Shows the batches that `on_train_batch_end` left off the counter."""
        self._update(self.train_progress_bar_id, self._batches_done)

    @override
    def get_metrics(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule
    ) -> dict[str, int | str | float | dict[str, float]]:
        now = time.monotonic()
        due = self._logs_after_batch and now - self._read_at >= self.metrics_every_s
        if self._in_train_batch and self._shown is not None and not due:
            return self._shown
        shown = super().get_metrics(trainer, pl_module)
        logged = trainer.callback_metrics  # tensors, still on the device
        shown.update({k: float(logged[k]) for k in self.step_metrics if k in logged})
        self._shown, self._read_at = shown, now
        return shown


class BatchRateColumn(ProcessingSpeedColumn):
    """Batches a second. Rich measures a rate between two moves of the counter in its last 30 s;
    Lightning 2.6.6's column shows 0.00it/s until then: at each epoch's and each validation's
    start, all through a one-batch epoch, in an epoch's first MOVE_EVERY_S (the bar's counter
    moves at most that often), and where steps take over 30 s. There this column shows the
    batches done over the time since the epoch began, or `-.--` before the first one (as the
    time column beside it shows `-:--:--`). Delete it once Lightning's column shows no rate
    where rich has none."""

    @override
    def render(self, task: Task) -> Text:
        rate = task.speed
        if rate is None and task.completed and task.elapsed:
            rate = task.completed / task.elapsed
        return Text(f"{'-.--' if rate is None else f'{rate:.2f}'}it/s", style=self.style)
