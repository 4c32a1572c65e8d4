"""EpochThroughput counts training time only: validation inside the epoch is left out."""

import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from tests.tiny_regression import TinyRegression
from volt.callbacks.throughput import EpochThroughput

VAL_BATCHES, VAL_SLEEP_S = 3, 0.3


class SlowValidation(TinyRegression):
    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        time.sleep(VAL_SLEEP_S)


def test_validation_time_is_not_training_time(tmp_path: Path) -> None:
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    meter = EpochThroughput()
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        val_check_interval=8,  # validation in the middle of the epoch and at its end
        limit_val_batches=VAL_BATCHES,
        num_sanity_val_steps=VAL_BATCHES,
        callbacks=[meter],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    started = time.perf_counter()
    trainer.fit(SlowValidation(), DataLoader(data, batch_size=4), DataLoader(data, batch_size=4))
    wall = time.perf_counter() - started

    validating = 3 * VAL_BATCHES * VAL_SLEEP_S  # sanity check, mid-epoch, epoch end
    assert wall > validating
    assert meter.samples == 64
    assert 0 < meter.seconds < wall - validating + 0.05
    rate = float(trainer.callback_metrics["perf/train_samples_per_s"])
    assert abs(rate - 64 / meter.seconds) < 1e-3 * rate
