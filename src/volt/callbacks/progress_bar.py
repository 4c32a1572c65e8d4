"""Lightning's rich progress bar, without a GPU sync on every training step."""

import time
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import RichProgressBar as LightningRichProgressBar
from typing_extensions import override


class RichProgressBar(LightningRichProgressBar):
    """Shows `step_metrics` (logged each step, e.g. the training loss) read at most every
    `metrics_every_s` seconds while training, besides the metrics logged with `prog_bar=True`.

    Turning a logged GPU tensor into a number (`.item()`) makes the CPU wait for the GPU to
    finish the step: the queue of kernels runs dry and the next step's launches are no longer
    hidden behind this one's work. Lightning does that after every batch for each metric logged
    with `prog_bar=True`, so volt logs per-step values without it and this bar reads them itself,
    twice a second by default: a loss half a second old costs nothing. The step counter still
    moves every batch, and metrics are read afresh at validation and epoch ends.
    """

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
        self._read_at = 0.0
        self._in_train_batch = False

    @override
    def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
        self._in_train_batch = True
        try:
            super().on_train_batch_end(*args, **kwargs)
        finally:
            self._in_train_batch = False

    @override
    def get_metrics(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule
    ) -> dict[str, int | str | float | dict[str, float]]:
        now = time.monotonic()
        fresh_enough = self._shown is not None and now - self._read_at < self.metrics_every_s
        if not (self._in_train_batch and fresh_enough):
            shown = super().get_metrics(trainer, pl_module)
            logged = trainer.callback_metrics  # tensors, still on the device
            shown.update({k: float(logged[k]) for k in self.step_metrics if k in logged})
            self._shown, self._read_at = shown, now
        assert self._shown is not None
        return self._shown
