"""torch's fused optimiser step as a model's choice (`model.fused_optimizer`), for every task.

A fused step updates all parameters in one kernel instead of several per tensor: on a GPU-bound
step that is a little; on a step bound by host work (small nets, CUDA graphs) it is most of the
optimiser's cost. None (the default) uses it for Adam, AdamW and SGD where the parameters are on
CUDA; true asks any optimiser that has the switch (Adagrad's fused step is CPU-only, torch's docs
say).
"""

import functools
import inspect
from collections.abc import Callable

import lightning.pytorch as pl
import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

OptimizerFactory = Callable[..., Optimizer]
FUSED_ON_CUDA = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)
SPARSE = (nn.Embedding, nn.EmbeddingBag)  # layers whose `sparse=True` makes sparse gradients


def _built(factory: OptimizerFactory) -> Callable[..., Optimizer]:
    return factory.func if isinstance(factory, functools.partial) else factory


def _asked(factory: OptimizerFactory, keyword: str) -> object:
    """What the config gave the optimiser for `keyword` (None if nothing)."""
    return factory.keywords.get(keyword) if isinstance(factory, functools.partial) else None


def takes_fused(factory: OptimizerFactory) -> bool:
    """Whether the optimiser the factory builds has torch's `fused` switch."""
    return "fused" in inspect.signature(_built(factory)).parameters


def check_fused_choice(factory: OptimizerFactory, fused_optimizer: bool | None) -> None:
    """Refuse, in one line, a `fused` the model would override or an optimiser without one."""
    if (value := _asked(factory, "fused")) is not None:
        raise ValueError(
            f"model.optimizer.fused={value} would be overridden: the model chooses it from "
            f"model.fused_optimizer; set model.fused_optimizer={value} and remove "
            "model.optimizer.fused"
        )
    if fused_optimizer and _asked(factory, "foreach"):
        raise ValueError(
            "model.fused_optimizer=true and model.optimizer.foreach=true: torch takes one of"
            " the two; drop model.optimizer.foreach (a fused step is one kernel already)"
        )
    if fused_optimizer and not takes_fused(factory):
        raise ValueError(
            f"model.fused_optimizer=true, but {_built(factory)} has no fused step: use one "
            "that has (torch.optim.AdamW, Adam, SGD) or model.fused_optimizer=null"
        )


def fused_options(
    module: pl.LightningModule, factory: OptimizerFactory, fused_optimizer: bool | None
) -> dict[str, bool]:
    """The `fused=` keyword for `factory`, from `configure_optimizers` (Lightning calls it once
    the parameters are on their device); empty for optimisers without the switch."""
    if not takes_fused(factory):
        return {}
    if fused_optimizer is not None:
        return {"fused": fused_optimizer}
    # With a grad scaler (16-mixed) a fused step unscales inside itself, after Lightning would
    # have clipped still-scaled gradients, so Lightning refuses that pair: unfused there.
    trainer = module._trainer
    scaler = getattr(trainer.precision_plugin, "scaler", None) if trainer else None
    clips = trainer is not None and bool(trainer.gradient_clip_val)
    on_cuda = module.device.type == "cuda" and _built(factory) in FUSED_ON_CUDA
    return {"fused": on_cuda and not (scaler and clips) and not _unfusable(module, factory)}


def _unfusable(module: nn.Module, factory: OptimizerFactory) -> bool:
    """Where torch's fused step fails (torch 2.11-2.14): with `foreach=True` asked, with sparse
    gradients (a sparse nn.Embedding), and SGD's over FSDP2's DTensor parameters (its fused
    kernel has no sharding rule: NotImplementedError at the first step; AdamW's has one). volt's
    trainer=fsdp steps SGD on the local shards, where fused would run, but an optimiser with step
    hooks goes back to the DTensors (`volt.strategies.fsdp.step_on_shards`): kept unfused."""
    if _asked(factory, "foreach"):
        return True
    if any(getattr(m, "sparse", False) for m in module.modules() if isinstance(m, SPARSE)):
        return True
    sharded = any(isinstance(p, DTensor) for p in module.parameters())
    return sharded and _built(factory) is torch.optim.SGD
