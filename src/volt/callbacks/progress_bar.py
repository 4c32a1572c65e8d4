"""Lightning's rich progress bar, without a GPU sync on every training step."""

import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import RichProgressBar as LightningRichProgressBar
from typing_extensions import override


class RichProgressBar(LightningRichProgressBar):
    """Reads the metrics it shows at most every `metrics_every_s` seconds while training.

    Lightning's bar asks for the progress-bar metrics after every training batch, and turning the
    logged loss into a number (`.item()`) makes the CPU wait for the GPU to finish that step: the
    queue of kernels runs dry and the next step's launches are no longer hidden behind this one's
    work. Half a second of staleness in the displayed loss costs nothing; the step counter still
    moves every batch, and metrics are read afresh at validation and epoch ends.
    """

    def __init__(self, metrics_every_s: float = 0.5, **kwargs: Any) -> None:
        super().__init__(**kwargs)
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
            self._shown = super().get_metrics(trainer, pl_module)
            self._read_at = now
        assert self._shown is not None
        return self._shown
