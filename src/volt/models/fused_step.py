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
from torch.optim import Optimizer

OptimizerFactory = Callable[..., Optimizer]
FUSED_ON_CUDA = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)


def _built(factory: OptimizerFactory) -> Callable[..., Optimizer]:
    return factory.func if isinstance(factory, functools.partial) else factory


def takes_fused(factory: OptimizerFactory) -> bool:
    """Whether the optimiser the factory builds has torch's `fused` switch."""
    return "fused" in inspect.signature(_built(factory)).parameters


def check_fused_choice(factory: OptimizerFactory, fused_optimizer: bool | None) -> None:
    """Refuse, in one line, a `fused` the model would override or an optimiser without one."""
    if isinstance(factory, functools.partial) and "fused" in factory.keywords:
        value = factory.keywords["fused"]
        raise ValueError(
            f"model.optimizer.fused={value} would be overridden: the model chooses it from "
            f"model.fused_optimizer; set model.fused_optimizer={value} and remove "
            "model.optimizer.fused"
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
    return {"fused": on_cuda and not (scaler and clips)}
