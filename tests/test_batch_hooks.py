"""volt.hook_dispatch.skip_inherited_batch_hooks: Lightning calls only the per-batch hooks a
callback defines, each as often as before; the empty ones inherited from Callback are not called."""

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback, LambdaCallback
from lightning.pytorch.trainer import call
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from volt.hook_dispatch import PER_BATCH_HOOKS, skip_inherited_batch_hooks


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class CountsBatchEnds(Callback):
    def __init__(self) -> None:
        self.ends = 0

    def on_train_batch_end(self, *args: object) -> None:
        self.ends += 1


def fit(callbacks: list[Callback]) -> None:
    data = DataLoader(TensorDataset(torch.randn(40, 4), torch.randn(40, 1)), batch_size=8)
    trainer = pl.Trainer(
        accelerator="cpu", max_epochs=2, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, callbacks=callbacks,
    )  # fmt: skip
    skip_inherited_batch_hooks(trainer.callbacks)  # type: ignore[attr-defined]
    trainer.fit(Regressor(), data)


def test_only_the_hooks_a_callback_defines_are_called(monkeypatch: pytest.MonkeyPatch) -> None:
    called: list[tuple[str, str]] = []
    lightning_calls = call._call_callback_hooks

    def spy(trainer: pl.Trainer, hook: str, *args: object, **kwargs: object) -> None:
        # Which callbacks Lightning's dispatch finds callable for this hook, as it decides it.
        for callback in trainer.callbacks:  # type: ignore[attr-defined]
            if hook in PER_BATCH_HOOKS and callable(getattr(callback, hook)):
                called.append((type(callback).__name__, hook))
        lightning_calls(trainer, hook, *args, **kwargs)

    monkeypatch.setattr(call, "_call_callback_hooks", spy)
    starts: list[int] = []
    counter = CountsBatchEnds()
    lam = LambdaCallback(on_train_batch_start=lambda *args: starts.append(1))
    fit([counter, lam, Callback()])
    assert counter.ends == 10 and len(starts) == 10  # 5 batches, 2 epochs: all still called
    # Each batch: one defined hook of each of the first two; nothing of the plain Callback.
    assert sorted(set(called)) == [
        ("CountsBatchEnds", "on_train_batch_end"),
        ("LambdaCallback", "on_train_batch_start"),
    ]
    assert len(called) == 20


def test_the_control_without_it_calls_every_inherited_hook() -> None:
    # What Lightning does by itself: every hook of every callback is callable and called.
    plain = Callback()
    assert all(callable(getattr(plain, hook)) for hook in PER_BATCH_HOOKS)
    skip_inherited_batch_hooks([plain])
    assert not any(callable(getattr(plain, hook)) for hook in PER_BATCH_HOOKS)
    assert callable(Callback().on_train_batch_end)  # the class is left as it was
