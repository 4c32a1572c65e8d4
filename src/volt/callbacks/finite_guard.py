"""Stop training at the first NaN or inf in a loss or gradient, with no host sync between checks."""

import math
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

from volt.callbacks.intervals import FALLBACK_EVERY_N_STEPS, check_interval, steps_between_waits
from volt.collectives import all_reduce_queued
from volt.errors import VerdictOfAllRanksError

FIXES = (
    "lower model.optimizer.lr, use gradient clipping trainer.gradient_clip_val=1.0,"
    " or precision=bf16-mixed / 32-true"
)


FLAGS_AT_ONCE = 1024  # the most steps' flags one buffer holds (4 KiB)


class NonFiniteLossError(VerdictOfAllRanksError):
    """The loss or a gradient held NaN or inf; str(error) says at which step, where, what to try.

    Under DDP every rank raises it at the same step: the verdict is pooled over the ranks.
    """


@dataclass
class _Step:
    """What one optimizer step left on the device for the next check."""

    step: int
    loss: Tensor  # () the step's loss, summed over its micro-batches: NaN and inf survive the sum
    # (1,) float32: 1.0 where a gradient of this rank held NaN or inf; None where the gradients
    # are not checked (a GradScaler's)
    found: Tensor | None


class FiniteGuard(Callback):
    """Raises `NonFiniteLossError` when a loss or gradient of a step was NaN or inf.

    Every optimizer step keeps, on the device, its loss and one flag saying whether any gradient
    element was NaN or inf (one fused kernel, nothing read on the host). Every
    `check_every_n_steps` steps, at the end of each training epoch, before any checkpoint is
    written and when training ends, the steps kept since the last check are judged at once: one
    wait for the device. The first step with a non-finite value is named, with the parameters
    whose gradients were bad (for a step before the check's own, whose gradients are gone: the
    parameters whose weights it made non-finite), and training stops. A bad step at the check's
    own step stops before its optimizer step changes anything; one before it has already changed
    the weights, as have the steps after it, and the error says so. No checkpoint ever holds
    them: every checkpoint is finite.

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
        self._params: list[tuple[str, Tensor]] = []
        self._ones: dict[torch.device, Tensor] = {}
        self._flags: Tensor | None = None  # (check_every_n_steps,) this interval's steps' flags
        self._kinds: dict[int, _Kinds] = {}  # id(optimizer): its parameters by kind

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.check_every_n_steps = steps_between_waits(trainer, self.every_n_steps)
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        self._check_gradients = not isinstance(scaler, torch.amp.GradScaler)
        self._loss = None
        self._steps = []
        self._params = list(pl_module.named_parameters())
        self._kinds = {}

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Tensor
    ) -> None:
        loss = loss.detach().reshape(())  # backward needs a scalar loss
        self._loss = loss if self._loss is None else self._loss + loss

    # Autograd off: under trainer=fsdp DTensor.to_local then hands back the shard itself, where
    # with autograd on it goes through an autograd Function: 18 µs a gradient under cProfile,
    # 1.4 ms of this hook's 1.8 a step for the 85M GPT's 75 (one H200's host, a world of one,
    # torch 2.11, 2026-11-29).
    @torch.no_grad()
    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Optimizer
    ) -> None:
        loss, self._loss = self._loss, None
        if loss is None:  # no backward through Lightning (manual optimization without it)
            loss = torch.zeros((), device=pl_module.device)
        found = None
        if self._check_gradients:
            found = self._zeroed_flag(loss.device)
            for (device, dtype), grads in self._gradients_by_kind(optimizer).items():
                here = found if device == found.device else torch.zeros_like(found, device=device)
                _flag_non_finite(grads, device, dtype, here, self._one(device))
                if here is not found:  # gradients offloaded to another device than the loss
                    found += here.to(found.device)
        step = trainer.global_step
        self._steps.append(_Step(step, loss, found))
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

    def _gradients_by_kind(
        self, optimizer: Optimizer
    ) -> dict[tuple[torch.device, torch.dtype], list[Tensor]]:
        """This rank's part of each gradient the optimizer will apply, by device and dtype (one
        kind, unless gradients are offloaded or of mixed dtypes). Which parameter is of which kind
        is worked out once per optimizer (again if its number of parameters changes): sorting 47
        gradients afresh each step took 0.26 ms a step under cProfile on an H200's host (torch
        2.11), reading 60 of them alone 5 us on a 2-core CPU."""
        count = sum(len(group["params"]) for group in optimizer.param_groups)
        kinds = self._kinds.get(id(optimizer))
        if kinds is None or kinds.optimizer is not optimizer or kinds.count != count:
            kinds = self._kinds[id(optimizer)] = _Kinds.of(optimizer, count)
        grads: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
        for kind, params in kinds.params.items():
            present = [g for p in params if (g := p.grad) is not None]
            if present:
                grads[kind] = [_local(g) for g in present] if kinds.sharded else present
        return grads

    def _zeroed_flag(self, device: torch.device) -> Tensor:
        """A (1,) float32 zero for this step's flag: the next element of a buffer made zeroed
        once per check interval. A fresh zero tensor a step was three ops (empty, zero_, fill_)
        and a kernel; on digits' host-bound GPU step FiniteGuard's part of the step was mostly
        host time (torch.profiler, one H200, torch 2.11, 2026-11-29). At most FLAGS_AT_ONCE
        elements: a long interval (check_every_n_steps=10**9) takes a new buffer when one fills."""
        size = min(self.check_every_n_steps, FLAGS_AT_ONCE)
        slot = len(self._steps) % size
        if slot == 0 or self._flags is None or self._flags.device != device:
            # float32 whatever the default dtype (precision=64-true sets float64 around the
            # training step, where a manual optimizer step reaches this): the kernel wants float
            self._flags = torch.zeros(size, dtype=torch.float32, device=device)
        return self._flags[slot : slot + 1]

    def _one(self, device: torch.device) -> Tensor:
        if device not in self._ones:
            self._ones[device] = torch.ones(1, dtype=torch.float32, device=device)
        return self._ones[device]

    def _check(self, trainer: pl.Trainer) -> None:
        """Judges the steps kept since the last check; every rank calls it at the same step (they
        keep the same number of steps), so the all-reduce in it pairs up."""
        steps, self._steps = self._steps, []
        if not steps:
            return
        losses = torch.stack([s.loss for s in steps])  # (n,)
        found = [s.found if s.found is not None else torch.zeros_like(losses[:1]) for s in steps]
        here = torch.stack([~losses.isfinite(), torch.cat(found).to(losses.device) > 0], 1).int()
        # (n, 2): the loss, then any gradient. Under DDP the gradients agree after their
        # all-reduce but each rank has its own loss, and FSDP shards the gradients: the ranks
        # pool the verdict.
        anywhere = here.clone()
        all_reduce_queued(anywhere, op="sum")
        flags = torch.cat([anywhere, here], dim=1).tolist()  # the one wait for the device
        for step, (loss_anywhere, grads_anywhere, loss_here, grads_here) in zip(
            steps, flags, strict=True
        ):
            if loss_anywhere or grads_anywhere:
                seen_at = trainer.global_step
                names = self._bad_names(step.step == seen_at) if grads_here else None
                where = _where(loss_anywhere, loss_here, names, step.step == seen_at)
                raise NonFiniteLossError(_message(where, step.step, seen_at))

    def _bad_names(self, gradients_at_hand: bool) -> list[str]:
        """The parameters whose gradients hold NaN or inf, when the bad step is the one being
        checked; else (its gradients are gone) those whose weights its update made non-finite.
        Read once training stops, in one more wait for the device."""
        if gradients_at_hand:
            named = [(n, _local(p.grad)) for n, p in self._params if p.grad is not None]
        else:
            named = [(n, _local(p.detach())) for n, p in self._params]
        named = [(n, t) for n, t in named if t.numel()]
        if not named:
            return []
        finite = torch.stack([t.isfinite().all().to(named[0][1].device) for _, t in named])
        return [n for (n, _), ok in zip(named, finite.tolist(), strict=True) if not ok]


def _local(tensor: Tensor) -> Tensor:
    # trainer=fsdp's parameters and gradients are DTensors: each rank judges its shard, the ranks
    # pool the verdicts; a rank may hold no element of a small parameter.
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


@dataclass(frozen=True)
class _Kinds:
    """An optimizer's parameters whose gradients are checked, by the device and dtype of this
    rank's part (gradients share their parameter's), and whether they are DTensors (FSDP)."""

    optimizer: Optimizer  # (an id alone could be a later optimizer's)
    count: int  # parameters in the optimizer's groups when this was made
    params: dict[tuple[torch.device, torch.dtype], list[Tensor]]
    sharded: bool

    @staticmethod
    def of(optimizer: Optimizer, count: int) -> "_Kinds":
        params: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
        sharded = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                sharded |= isinstance(p, DTensor)
                local = _local(p)
                # The kernels below take floating-point tensors; a complex gradient goes
                # unchecked, as does a parameter of which this rank holds no element.
                if local.numel() and local.is_floating_point():
                    params.setdefault((local.device, local.dtype), []).append(p)
        return _Kinds(optimizer, count, params, sharded)


def _flag_non_finite(
    grads: list[Tensor], device: torch.device, dtype: torch.dtype, found: Tensor, one: Tensor
) -> None:
    """Sets `found` (1,) where an element of `grads` (one device and dtype) is NaN or inf."""
    if device.type == "cpu" or (device.type == "cuda" and dtype is not torch.bfloat16):
        # torch's GradScaler kernel at a scale of 1 (x * 1.0 is x, NaN and inf too): one fused
        # pass that sets `found` where an element is not finite. It replaced an inf-norm of each
        # gradient and a stack of the results, which cost about 0.5 ms of CPU a step on the
        # CUDA-graphs ResNet (torch.profiler, one H200, torch 2.11); 200 us against 16 us for 62
        # small tensors on a 2-core CPU (torch 2.14).
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, one)
        return
    # Its CUDA kernel has no bfloat16 (torch 2.11: "not implemented for 'BFloat16'"; precision=
    # bf16-true), and other devices may lack it: an inf-norm of each, finite where they all are.
    largest = torch.stack(torch._foreach_norm(grads, ord=math.inf))
    found += (~largest.isfinite()).any()


def _where(loss_anywhere: int, loss_here: int, names: list[str] | None, at_hand: bool) -> str:
    if loss_anywhere:
        return "non-finite loss (NaN or inf)" + ("" if loss_here else " on another rank")
    if names is None:
        return "non-finite gradient (NaN or inf) on another rank"
    if not names:  # gone from the gradients, and the weights are finite
        return "non-finite gradient (NaN or inf)"
    others = ""
    if len(names) > 1:
        listed = ", ".join(names[1:4]) + (", ..." if len(names) > 4 else "")
        others = f" (and of {len(names) - 1} more: {listed})"
    if at_hand:
        return f"non-finite gradient (NaN or inf) of parameter {names[0]}{others}"
    made = f"{names[0]}{others}"
    return f"non-finite gradient (NaN or inf), which made the weights of {made} non-finite,"


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
