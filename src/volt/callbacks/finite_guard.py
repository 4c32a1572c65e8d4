"""Stop training at the first NaN or inf in a loss or gradient, with no host sync between checks."""

import math
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from torch.distributed.tensor import DTensor
from torch.nn import functional as F
from torch.optim import Optimizer

from volt.callbacks.intervals import FALLBACK_EVERY_N_STEPS, check_interval, steps_between_waits
from volt.collectives import all_reduce_queued
from volt.errors import VerdictOfAllRanksError

FIXES = (
    "lower model.optimizer.lr, use gradient clipping trainer.gradient_clip_val=1.0,"
    " or precision=bf16-mixed / 32-true"
)


class NonFiniteLossError(VerdictOfAllRanksError):
    """The loss or a gradient held NaN or inf; str(error) says at which step, where, what to try.

    Under DDP every rank raises it at the same step: the verdict is pooled over the ranks.
    """


@dataclass
class _Step:
    """What one optimizer step left on the device for the next check."""

    step: int
    # (1 + P,) on the device: the step's loss (summed over its micro-batches: NaN and inf survive
    # the sum), then the largest |element| of each gradient of `params`
    values: Tensor
    params: list[Tensor]


class FiniteGuard(Callback):
    """Raises `NonFiniteLossError` when a loss or gradient of a step was NaN or inf.

    Every optimizer step keeps, on the device, its loss and the largest |element| of each
    gradient (a few kernels, nothing read on the host). Every `check_every_n_steps` steps, at the
    end of each training epoch, before any checkpoint is written and when training ends, the
    steps kept since the last check are judged at once: one wait for the device. The first step
    with a non-finite value is named, with the parameters whose gradients were bad, and training
    stops. A bad step at the check's own step stops before its optimizer step changes anything;
    one before it has already changed the weights, as have the steps after it, and the error
    says so. No checkpoint ever holds them: every checkpoint is finite.

    Under DDP the ranks pool their verdicts at each check with one small all-reduce (two flags per
    step kept), so every rank stops at the same step: a rank that stopped alone would leave the
    others waiting for it in their next collective, under NCCL until its timeout. Between checks
    the ranks neither wait for their devices nor talk to each other.

    Under `precision=16-mixed` a GradScaler multiplies the loss before backward, so gradients
    overflow to inf from time to time by design; the scaler then skips that step and lowers its
    scale. There the gradients are the scaler's to judge and only the loss is checked. The loss
    this callback sees is the scaled one: scaling cannot make NaN out of a finite loss, and its
    overflow to inf would take loss x scale > 3e38, a scale the scaler does not reach in practice
    (it halves the scale whenever the fp16 gradients overflow, at 65504).

    Args:
        check_every_n_steps: judge the steps kept every this many optimizer steps, at the steps
            where `(global_step + 1) % N == 0`. None (volt's default): the trainer's
            `log_every_n_steps`, the very steps at which Lightning waits for the device to write
            the logs. Training stops at most N - 1 steps after a bad one; N=1 stops every bad
            step before it changes the weights, at one wait for the device per step.
    """

    def __init__(self, check_every_n_steps: int | None = None) -> None:
        self.every_n_steps = check_interval(
            "callbacks.finite_guard.check_every_n_steps", check_every_n_steps
        )
        self.check_every_n_steps = FALLBACK_EVERY_N_STEPS  # decided at fit start
        self._check_gradients = True
        self._loss: Tensor | None = None  # () the losses since the last optimizer step, summed
        self._steps: list[_Step] = []
        self._names: dict[int, str] = {}

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.check_every_n_steps = steps_between_waits(trainer, self.every_n_steps)
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        self._check_gradients = not isinstance(scaler, torch.amp.GradScaler)
        self._loss = None
        self._steps = []
        self._names = {id(p): name for name, p in pl_module.named_parameters()}

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Tensor
    ) -> None:
        loss = loss.detach().reshape(())  # backward needs a scalar loss
        self._loss = loss if self._loss is None else self._loss + loss

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Optimizer
    ) -> None:
        loss, self._loss = self._loss, None
        if loss is None:  # no backward through Lightning (manual optimization without it)
            loss = torch.zeros((), device=pl_module.device)
        params, grads = _gradients(optimizer) if self._check_gradients else ([], [])
        largest = _largest_magnitudes(grads)
        step = trainer.global_step
        self._steps.append(_Step(step, torch.stack([loss, *largest]), params))
        if (step + 1) % self.check_every_n_steps == 0:
            self._check(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._check(trainer)

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # Raising here, before the file is written, keeps every checkpoint finite.
        self._check(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._check(trainer)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._steps = []

    def _check(self, trainer: pl.Trainer) -> None:
        """Judges the steps kept since the last check; every rank calls it at the same step (they
        keep the same number of steps), so the all-reduce in it pairs up."""
        steps, self._steps = self._steps, []
        if not steps:
            return
        # Rows differ in length only when which parameters have gradients changes between steps.
        width = max(len(s.values) for s in steps)
        rows = [
            s.values if len(s.values) == width else F.pad(s.values, (0, width - len(s.values)))
            for s in steps
        ]
        bad = ~torch.stack(rows).isfinite()  # (n, 1 + P): the loss, then each gradient
        # Under DDP the gradients agree after their all-reduce but each rank has its own loss,
        # and FSDP shards the gradients: the ranks pool the verdict.
        anywhere = torch.stack([bad[:, 0], bad[:, 1:].any(1)], dim=1).int()  # (n, 2)
        all_reduce_queued(anywhere, op="sum")
        flags = torch.cat([anywhere, bad.int()], dim=1).tolist()  # the one wait for the device
        for step, (loss_anywhere, grads_anywhere, loss_here, *grads_here) in zip(
            steps, flags, strict=True
        ):
            if loss_anywhere or grads_anywhere:
                where = _where(loss_anywhere, loss_here, self._bad_names(step, grads_here))
                raise NonFiniteLossError(_message(where, step.step, trainer.global_step))

    def _bad_names(self, step: _Step, grads_bad: list[int]) -> list[str]:
        grads_bad = grads_bad[: len(step.params)]  # the rest: padding, for shorter rows
        return [
            self._names.get(id(p), "?")
            for p, bad in zip(step.params, grads_bad, strict=True)
            if bad
        ]


def _gradients(optimizer: Optimizer) -> tuple[list[Tensor], list[Tensor]]:
    """The parameters with gradients and those gradients (this rank's part): `.grad` is read once
    per parameter, as each read costs about 2 us of CPU (torch 2.11; a ResNet's 47 took 0.1 ms)."""
    params, grads = [], []
    for group in optimizer.param_groups:
        for p in group["params"]:
            grad = p.grad
            if grad is None:
                continue
            # trainer=fsdp's gradients are DTensors: each rank judges its shard, the ranks pool
            # the verdicts; a rank may hold no element of a small parameter's gradient.
            local = grad.to_local() if isinstance(grad, DTensor) else grad
            if local.numel():
                params.append(p)
                grads.append(local)
    return params, grads


def _largest_magnitudes(grads: list[Tensor]) -> list[Tensor]:
    """Each gradient's largest |element|, () each: finite exactly when every element is (NaN
    propagates; no sum of squares to overflow in fp16)."""
    if not grads:
        return []
    if grads[0].is_cuda:
        return list(torch._foreach_norm(grads, ord=math.inf))
    # torch 2.14's CPU inf-norm is ~6x slower than |x| then max (digits' MLP: 320 vs 55 us a
    # step). Delete this branch when torch's CPU `_foreach_norm(ord=inf)` catches up.
    return list(torch._foreach_max(torch._foreach_abs(grads)))


def _where(loss_anywhere: int, loss_here: int, bad_names: list[str]) -> str:
    if loss_anywhere:
        return "non-finite loss (NaN or inf)" + ("" if loss_here else " on another rank")
    if not bad_names:
        return "non-finite gradient (NaN or inf) on another rank"
    others = ""
    if len(bad_names) > 1:
        listed = ", ".join(bad_names[1:4]) + (", ..." if len(bad_names) > 4 else "")
        others = f" (and of {len(bad_names) - 1} more: {listed})"
    return f"non-finite gradient (NaN or inf) of parameter {bad_names[0]}{others}"


def _message(where: str, bad_step: int, step_now: int) -> str:
    if step_now == bad_step:
        after = "training stopped before this step changed the weights (they, and every"
        after += " checkpoint written so far, are finite)."
    else:
        after = (
            f"seen at global step {step_now}, so the weights in memory are spoiled; every"
            " checkpoint written so far is finite, resume from the newest."
        )
    return f"{where} at global step {bad_step}; {after} Try: {FIXES}"
