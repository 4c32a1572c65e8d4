"""volt.hook_dispatch.read_step_signature_once: Lightning passes `training_step` the same arguments
as before, and reads its signature once a fit instead of at every step."""

import inspect
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import LambdaCallback
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from volt.hook_dispatch import read_step_signature_once

STEPS = 6


class WithBatchIndex(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.seen: list[int | None] = []

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        self.seen.append(batch_idx)
        return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class WithoutBatchIndex(WithBatchIndex):
    def training_step(self, batch: tuple[Tensor, Tensor]) -> Tensor:  # type: ignore[override]
        self.seen.append(None)
        return nn.functional.mse_loss(self.layer(batch[0]), batch[1])


def fit(
    module: WithBatchIndex,
    monkeypatch: pytest.MonkeyPatch,
    once: bool,
    callbacks: list[pl.Callback] | None = None,
) -> int:
    """Fits `module` for STEPS steps; the times the signature of its training_step was read."""
    reads = 0
    read = inspect.getfullargspec

    def counting(function: Any) -> inspect.FullArgSpec:
        nonlocal reads
        reads += getattr(function, "__name__", None) == "training_step"
        return read(function)

    monkeypatch.setattr(inspect, "getfullargspec", counting)
    data = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=STEPS, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, callbacks=callbacks,
    )  # fmt: skip
    if once:
        read_step_signature_once(trainer)
    trainer.fit(module, data)
    return reads


def test_the_signature_is_read_once_a_fit_and_batch_idx_passed_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    as_lightning, once = WithBatchIndex(), WithBatchIndex()
    reads_as_lightning = fit(as_lightning, monkeypatch, once=False)  # setup's reads, then a step's
    assert fit(once, monkeypatch, once=True) == reads_as_lightning - (STEPS - 1)
    assert once.seen == as_lightning.seen == [0, 1, 2, 3, 0, 1]  # 4 batches an epoch


def test_a_step_without_batch_idx_is_not_given_one(monkeypatch: pytest.MonkeyPatch) -> None:
    module = WithoutBatchIndex()
    fit(module, monkeypatch, once=True)
    assert module.seen == [None] * STEPS


def test_a_step_function_swapped_mid_fit_is_asked_about_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = WithBatchIndex()

    def without_batch_idx(batch: tuple[Tensor, Tensor]) -> Tensor:
        module.seen.append(None)
        return nn.functional.mse_loss(module.layer(batch[0]), batch[1])

    def swap(trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step == 3:
            module.training_step = without_batch_idx  # type: ignore[method-assign]

    fit(module, monkeypatch, once=True, callbacks=[LambdaCallback(on_train_batch_end=swap)])
    assert module.seen == [0, 1, 2, None, None, None]
