"""volt's progress bar reads the logged metrics (a GPU sync each time) at most every N seconds."""

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import RichProgressBar as LightningRichProgressBar
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from tests.tiny_regression import TinyRegression
from volt.callbacks.progress_bar import RichProgressBar

STEPS = 12


class Regression(TinyRegression):
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("train/loss", loss)  # not prog_bar: the bar reads it
        return loss


def reads_during_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, metrics_every_s: float
) -> tuple[int, dict]:
    bar = RichProgressBar(metrics_every_s=metrics_every_s)
    reads = []
    parent = LightningRichProgressBar.get_metrics

    def counted(self: LightningRichProgressBar, *args: object) -> dict:
        reads.append(self._in_train_batch)  # type: ignore[attr-defined]
        return parent(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(LightningRichProgressBar, "get_metrics", counted)
    data = TensorDataset(torch.randn(STEPS * 4, 4), torch.randn(STEPS * 4, 1))
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        callbacks=[bar],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(Regression(), DataLoader(data, batch_size=4))
    assert trainer.global_step == STEPS
    return sum(reads), bar.get_metrics(trainer, trainer.lightning_module)


def test_metrics_are_read_once_per_interval_not_every_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads, shown = reads_during_training(tmp_path, monkeypatch, metrics_every_s=3600)
    assert reads == 1  # the first batch; the next hour's batches reuse it
    assert "train/loss" in shown


def test_an_interval_of_zero_reads_every_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads, _ = reads_during_training(tmp_path, monkeypatch, metrics_every_s=0)
    assert reads == STEPS
