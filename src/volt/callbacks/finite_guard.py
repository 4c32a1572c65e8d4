"""Stop training at the first NaN or inf in a loss or gradient, without a host sync every step."""

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from torch.optim import Optimizer

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
class _Verdict:
    """What one optimizer step found, copied to the host while the GPU works on."""

    step: int
    # (3 + P,) int on the host: [loss bad on any rank, gradients bad on any rank,
    #  loss bad on this rank, then one flag per parameter of `names`, bad on this rank]
    flags: Tensor
    ready: torch.cuda.Event | None  # None on the CPU, where the copy is already done
    params: list[Tensor]  # the parameters the per-parameter flags are about, in order


class FiniteGuard(Callback):
    """Raises `NonFiniteLossError` when a loss or gradient of a step was NaN or inf.

    The loss is checked before each backward pass, every gradient before each optimizer step, on
    the device. Reading that verdict on the host would stall the GPU's queue of kernels every step
    (the CPU waits for backward to end before it can queue more work), so the verdict is copied
    to pinned memory without blocking and read once the GPU has got there, usually one step
    later. So on a GPU the bad step, and perhaps the next, have already changed the weights when
    training stops; on the CPU the copy is immediate and the step that raises changed nothing.
    Checkpoints are never spoiled: before any checkpoint is written, and at the end of each
    epoch, every outstanding verdict is waited for (one sync, seldom).

    Under DDP all ranks must stop at the same step: a rank that stopped alone would leave the
    others waiting for it in their next collective, under NCCL until its timeout (30 minutes by
    default) wherever no launcher kills them. Whether a GPU has got there yet differs from rank
    to rank, so there each rank reads the verdict of a step at the next optimizer step, waiting
    for it if need be (by then the GPU is almost always done with it). On the CPU the verdict is
    on the host at once, on every rank alike, and is read at once.

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
        self._pending: deque[_Verdict] = deque()
        self._names: dict[int, str] = {}

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        self._check_gradients = not isinstance(scaler, torch.amp.GradScaler)
        self._loss_finite = None
        self._pending.clear()
        self._names = {id(p): name for name, p in pl_module.named_parameters()}

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Tensor
    ) -> None:
        finite = torch.isfinite(loss.detach()).all()
        self._loss_finite = finite if self._loss_finite is None else self._loss_finite & finite

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Optimizer
    ) -> None:
        device = pl_module.device
        loss_finite, self._loss_finite = self._loss_finite, None
        loss_bad = torch.zeros(1, dtype=torch.int32, device=device)
        if loss_finite is not None:
            loss_bad[0] = ~loss_finite
        params = _params_with_gradients(optimizer) if self._check_gradients else []
        params_bad = torch.zeros(0, dtype=torch.int32, device=device)
        if params:
            # The largest |element| of each gradient, in a few fused kernels: finite exactly when
            # every element is (NaN propagates; no sum of squares to overflow in fp16).
            norms = torch._foreach_norm([p.grad for p in params], ord=math.inf)  # type: ignore[misc]
            params_bad = (~torch.stack(norms).isfinite()).int()  # (P,)
        # Under DDP the gradients agree after their all-reduce but each rank has its own loss,
        # and FSDP shards the gradients: all ranks must stop together, so they pool the verdict.
        grads_bad = params_bad.amax(0, keepdim=True) if params else torch.zeros_like(loss_bad)
        anywhere = all_reduce_queued(torch.cat([loss_bad, grads_bad]), op="sum")
        flags = torch.cat([anywhere.int(), loss_bad, params_bad])
        self._pending.append(_Verdict(trainer.global_step, *_to_host(flags), params))
        if trainer.world_size > 1:
            self._read_verdicts_before(trainer, trainer.global_step)
        else:
            self._read_landed_verdicts(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._read_verdicts_before(trainer, math.inf)

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # Raising here, before the file is written, keeps every checkpoint finite.
        self._read_verdicts_before(trainer, math.inf)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._read_verdicts_before(trainer, math.inf)

    def _read_landed_verdicts(self, trainer: pl.Trainer) -> None:
        """Reads, oldest first, the verdicts already on the host; waits for none."""
        while self._pending and _landed(self._pending[0]):
            self._read(trainer, self._pending.popleft())

    def _read_verdicts_before(self, trainer: pl.Trainer, step: float) -> None:
        """Reads the verdicts of the steps before `step`, waiting for the GPU where it is not
        there yet, and any verdict that was on the host from the start (computed on the CPU)."""
        while self._pending and (self._pending[0].step < step or self._pending[0].ready is None):
            self._read(trainer, self._pending.popleft())

    def _read(self, trainer: pl.Trainer, verdict: _Verdict) -> None:
        if verdict.ready is not None:
            verdict.ready.synchronize()
        flags = verdict.flags.tolist()
        if flags[0] or flags[1]:
            self._pending.clear()
            names = [self._names.get(id(p), "?") for p in verdict.params]
            raise NonFiniteLossError(_message(verdict, names, flags, trainer.global_step))


def _landed(verdict: _Verdict) -> bool:
    return verdict.ready is None or verdict.ready.query()


def _to_host(flags: Tensor) -> tuple[Tensor, torch.cuda.Event | None]:
    """Starts copying `flags` to the host; the event says when the copy has landed."""
    if not flags.is_cuda:
        return flags, None
    host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=True)
    host.copy_(flags, non_blocking=True)  # from pinned memory: queued, the CPU does not wait
    ready = torch.cuda.Event()
    ready.record()
    return host, ready


def _params_with_gradients(optimizer: Optimizer) -> list[Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def _message(verdict: _Verdict, names: list[str], flags: list[int], step_now: int) -> str:
    loss_bad_anywhere, _, loss_bad_here, *params_bad = flags
    if loss_bad_anywhere:
        where = "non-finite loss (NaN or inf)" + ("" if loss_bad_here else " on another rank")
    else:
        bad_names = [n for n, bad in zip(names, params_bad, strict=True) if bad]
        where = _describe_gradients(bad_names)
    if step_now == verdict.step:
        after = "training stopped before this step changed the weights (they, and every"
        after += " checkpoint written so far, are finite)."
    else:
        after = (
            f"seen at global step {step_now}, so the weights in memory are spoiled; every"
            " checkpoint written so far is finite, resume from the newest."
        )
    return f"{where} at global step {verdict.step}; {after} Try: {FIXES}"


def _describe_gradients(names: list[str]) -> str:
    if not names:
        return "non-finite gradient (NaN or inf) on another rank"
    others = ""
    if len(names) > 1:
        listed = ", ".join(names[1:4]) + (", ..." if len(names) > 4 else "")
        others = f" (and of {len(names) - 1} more: {listed})"
    return f"non-finite gradient (NaN or inf) of parameter {names[0]}{others}"
