"""Stop training at the first NaN or inf in a loss or gradient, before it reaches the weights."""

import math

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from torch.optim import Optimizer

FIXES = (
    "lower model.optimizer.lr, use gradient clipping trainer.gradient_clip_val=1.0,"
    " or precision=bf16-mixed / 32-true"
)


class NonFiniteLossError(RuntimeError):
    """The loss or a gradient held NaN or inf; str(error) says at which step, where, what to try."""


class FiniteGuard(Callback):
    """Raises `NonFiniteLossError` before an optimizer step that a NaN or inf would spoil.

    The loss is checked before each backward pass, every gradient before each optimizer step: the
    step that raises updated nothing, and no checkpoint is written for it (Lightning runs its
    checkpoint callbacks after all others and saves on an exception only when asked to, with
    `ModelCheckpoint(save_on_exception=True)` or `OnExceptionCheckpoint`).

    Under `precision=16-mixed` a GradScaler multiplies the loss before backward, so gradients
    overflow to inf from time to time by design; the scaler then skips that step and lowers its
    scale. There the gradients are the scaler's to judge and only the loss is checked. The loss
    this callback sees is the scaled one: scaling cannot make NaN out of a finite loss, and its
    overflow to inf would take loss x scale > 3e38, a scale the scaler does not reach in practice
    (it halves the scale whenever the fp16 gradients overflow, at 65504).
    """

    def __init__(self) -> None:
        self._check_gradients = True
        # () bool on the model's device: every loss since the last optimizer step was finite.
        # Kept on the device so that gradient accumulation adds no host sync per micro-batch.
        self._loss_finite: Tensor | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        self._check_gradients = not isinstance(scaler, torch.amp.GradScaler)
        self._loss_finite = None

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Tensor
    ) -> None:
        finite = torch.isfinite(loss.detach()).all()
        self._loss_finite = finite if self._loss_finite is None else self._loss_finite & finite

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Optimizer
    ) -> None:
        loss_finite, self._loss_finite = self._loss_finite, None
        finite = torch.ones(2, dtype=torch.bool, device=pl_module.device)  # (loss, gradients)
        if loss_finite is not None:
            finite[0] = loss_finite
        grads = _gradients(optimizer) if self._check_gradients else []
        if grads:
            # The largest |element| of each gradient, in a few fused kernels: finite exactly when
            # every element is (NaN propagates; no sum of squares to overflow in fp16).
            finite[1] = torch.stack(torch._foreach_norm(grads, ord=math.inf)).isfinite().all()
        # Under DDP the gradients agree after their all-reduce but each rank has its own loss,
        # and FSDP shards the gradients: all ranks must stop together, so they pool the verdict.
        bad = trainer.strategy.reduce((~finite).int(), reduce_op="sum")  # (2,)
        # The one host sync per step: the CPU waits here for backward to finish on the GPU, so
        # the optimizer's kernels are queued only then (a bubble of their launch latency, tens
        # of microseconds). The norms read every gradient once: memory-bound, roughly 1 ms per
        # 3 GB of gradients on an H100.
        loss_bad, grads_bad = bad.tolist()
        if loss_bad or grads_bad:
            where = _describe_loss(loss_finite) if loss_bad else _describe_gradients(pl_module)
            raise NonFiniteLossError(
                f"{where} at global step {trainer.global_step}; training stopped before this step"
                f" changed the weights (they, and every checkpoint written so far, are finite)."
                f" Try: {FIXES}"
            )


def _gradients(optimizer: Optimizer) -> list[Tensor]:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return [p.grad for p in params if p.grad is not None]


def _describe_loss(local_finite: Tensor | None) -> str:
    if local_finite is not None and not local_finite.item():
        return "non-finite loss (NaN or inf)"
    return "non-finite loss (NaN or inf) on another rank"


def _describe_gradients(pl_module: pl.LightningModule) -> str:
    # Only on the way to raising, so one sync per parameter costs nothing that matters.
    names = [
        name
        for name, p in pl_module.named_parameters()
        if p.grad is not None and not torch.isfinite(p.grad).all()
    ]
    if not names:
        return "non-finite gradient (NaN or inf) on another rank"
    others = ""
    if len(names) > 1:
        listed = ", ".join(names[1:4]) + (", ..." if len(names) > 4 else "")
        others = f" (and of {len(names) - 1} more: {listed})"
    return f"non-finite gradient (NaN or inf) of parameter {names[0]}{others}"
