"""volt.hook_dispatch.store_hook_names_directly: Lightning's record of the running hook is stored
without torch's Module.__setattr__; every other attribute of a module still goes through it."""

from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import LambdaCallback
from torch import nn

from tests.lightning_docs_task import LineDataModule, LitRegressor
from volt import hook_dispatch
from volt.hook_dispatch import store_hook_names_directly


def fit_counting_module_setattrs(monkeypatch: pytest.MonkeyPatch) -> tuple[int, list[str | None]]:
    """(assignments of `_current_fx_name` that went through Module.__setattr__ in a fit of 10
    steps, the hook names a callback saw)."""
    through_module: list[str] = []
    inner = hook_dispatch._modules_setattr

    def counting(module: nn.Module, name: str, value: Any) -> None:
        through_module.append(name)
        inner(module, name, value)

    monkeypatch.setattr(hook_dispatch, "_modules_setattr", counting)
    if pl.LightningModule.__setattr__ is not hook_dispatch._setattr:  # the control: as Lightning is
        monkeypatch.setattr(pl.LightningModule, "__setattr__", counting)
    seen: list[str | None] = []
    names = LambdaCallback(
        on_train_batch_end=lambda _, module, *a: seen.append(module._current_fx_name)
    )
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=10, limit_val_batches=0, logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        callbacks=[names],
    )  # fmt: skip
    trainer.fit(LitRegressor(), datamodule=LineDataModule())
    return through_module.count("_current_fx_name"), seen


def test_hook_names_skip_module_setattr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pl.LightningModule, "__setattr__", pl.LightningModule.__setattr__)
    store_hook_names_directly()
    through_module, seen = fit_counting_module_setattrs(monkeypatch)
    assert through_module == 0
    assert seen == ["on_train_batch_end"] * 10  # what Lightning records, as before


def test_without_it_lightning_sets_the_name_through_module_setattr_at_every_hook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pl.LightningModule, "__setattr__", hook_dispatch._modules_setattr)
    through_module, seen = fit_counting_module_setattrs(monkeypatch)
    assert through_module > 10 * 20  # dozens a step (44 in a bare Trainer, Lightning 2.6.6)
    assert seen == ["on_train_batch_end"] * 10


def test_parameters_modules_and_buffers_are_still_registered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pl.LightningModule, "__setattr__", pl.LightningModule.__setattr__)
    store_hook_names_directly()
    module = LitRegressor()
    module.scale = nn.Parameter(torch.ones(1))
    module.head = nn.Linear(1, 1)
    module.register_buffer("count", torch.zeros(1))
    module.count = torch.ones(1)  # a buffer replaced by assignment, as torch allows
    module._current_fx_name = "training_step"
    assert "scale" in dict(module.named_parameters())
    assert "head" in dict(module.named_children())
    assert torch.equal(dict(module.named_buffers())["count"], torch.ones(1))
    assert module._current_fx_name == "training_step"
    with pytest.raises(TypeError, match="cannot assign"):  # torch's own check still runs
        module.model = torch.ones(1)  # type: ignore[assignment]
