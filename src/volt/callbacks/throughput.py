import logging
import time

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn

log = logging.getLogger("volt")


class TrainingClock(Callback):
    """Training time, without validation (nor the sampling and checkpointing inside it): the GPU
    is synchronised only where the clock starts and stops, so the steps between run unsynced.
    `seconds` sums the time the clock has run since a subclass last reset it."""

    def __init__(self) -> None:
        self.start = 0.0
        self.seconds = 0.0
        self.running = False

    def _sync(self, trainer: pl.Trainer) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)

    def _start_clock(self, trainer: pl.Trainer) -> None:
        self._sync(trainer)
        self.start = time.perf_counter()
        self.running = True

    def _stop_clock(self, trainer: pl.Trainer) -> None:
        if self.running:
            self._sync(trainer)
            self.seconds += time.perf_counter() - self.start
            self.running = False

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop_clock(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Validation during fit (not the sanity check before it): training goes on after it.
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            self._start_clock(trainer)


class EpochThroughput(TrainingClock):
    """Training samples per second over each epoch (all processes together), logged as
    `perf/train_samples_per_s` and written to the log file. Validation inside the epoch is not
    counted; the GPU is synchronised only where the clock starts and stops (epoch and validation
    boundaries).

    Why not Lightning's `ThroughputMonitor` (Lightning 2.4-2.6.6): it calls
    `torch.cuda.synchronize()` after every training batch so that its per-step clock is right,
    which stops the CPU from queueing the next step while the GPU works (the host sync volt's
    step path is kept free of), and it needs a `batch_size_fn` per task. Delete this class in
    favour of it if it gains an epoch-level mode without per-step synchronisation.
    """

    def __init__(self) -> None:
        super().__init__()
        self.samples = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # A run resumed mid-epoch gets no on_train_epoch_start for that epoch.
        self.on_train_epoch_start(trainer, pl_module)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.samples = 0
        self.seconds = 0.0
        self._start_clock(trainer)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: object,
        batch: object,
        batch_idx: int,
    ) -> None:
        # (B, ...) inputs on this process; every process runs the same number of batches
        self.samples += len(batch[0]) * trainer.world_size  # type: ignore[index]

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop_clock(trainer)
        seconds = self.seconds
        rate = self.samples / seconds if seconds > 0 else 0.0
        pl_module.log("perf/train_samples_per_s", rate, rank_zero_only=True)
        if trainer.is_global_zero:
            # The log file's (conf/hydra/job_logging): a line an epoch would fill the console.
            log.debug(
                "epoch %d: %.0f training samples/s (%.1f s)", trainer.current_epoch, rate, seconds
            )
