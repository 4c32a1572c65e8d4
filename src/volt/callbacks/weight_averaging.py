"""`ema=<decay>`: an exponential moving average of the weights, evaluated instead of them.

With a fixed decay the average of a short run still holds its first steps' weights: after n
updates the weights it started from keep a share of about decay ** n (0.999 ** 380 = 0.68 at the
end of the default digits run, whose test accuracy fell from 0.98 to 0.90). So by default
(`ema_warmup=true`) the decay rises with the number n of updates done so far, as
`min(decay, (1 + n) / (10 + n))` (TensorFlow's `ExponentialMovingAverage` with `num_updates`):
0.18 at the second update, 0.9 at the 81st, 0.999 from the 8,991st on. The first update copies
the weights, as torch's `AveragedModel` does. The count is in checkpoints, so a resumed fit goes
on with the decay an unbroken one would take.

Lightning's `EMAWeightAveraging` keeps the average (a copy of the module updated after every
optimizer step), puts it in the module for validation, and writes it into checkpoints as
`state_dict`, with the trained weights beside it as `current_model_state`. So the best checkpoint
is chosen by the average's validation metric, and whatever reads `state_dict` (test after fit,
`volt.eval`, `load_trained_module`) gets the average; a resumed fit continues the trained weights.

`ExponentialMovingAverage` replaces the parts of it that are wrong in Lightning 2.6.6 (checked
against `lightning/pytorch/callbacks/weight_averaging.py` of that release). Delete each override
when a Lightning release fixes its defect; delete the class (and build `EMAWeightAveraging` in
`volt.build`) when all are:

1. `trainer.test(ckpt_path=...)` after a fit loads `current_model_state` into the module: the
   callback's `on_load_checkpoint` runs in every stage and still holds the fit's average, so test
   ran on the trained weights, not the average (`on_load_checkpoint`).
2. The average is copied in `setup`, before the strategy moves the module to its device and
   converts it to its precision: it stays on the CPU while the module trains on a GPU (every
   update and swap crosses the bus), and in float32 under 64-true, where the validation swap then
   rounds the trained float64 weights to float32 (`on_fit_start`).
3. The validation swap exchanges the tensors of the module and the average, so an average kept
   wider than the module (float32 for bf16-true weights: a bf16 average would not move, 0.999 * w
   rounds back to w) comes back rounded to the module's dtype (`on_validation_start`).
4. The average catches up with a step only at that step's `on_train_batch_end`: a callback that
   saves a checkpoint earlier in the same hook (volt's GracefulShutdown) writes an average one
   update behind the weights, and the resumed run differs from an unbroken one
   (`on_save_checkpoint`). Its copy into the module at `on_train_end` likewise comes before such a
   callback's save there (`on_fit_end`).

5. torch's `AveragedModel.update_parameters` (torch 2.11 to 2.14), which Lightning calls, reads its
   update count on the host (`n_averaged == 0`, `n_averaged > 0`), so on a GPU every optimizer
   step waited for the device. The update here keeps that count on the device and knows on the
   host whether it is the first (`_update`).
"""

import functools
import itertools
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import EMAWeightAveraging
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel

log = logging.getLogger(__name__)

# What a checkpoint holds besides the rest of a fit's state: the average as `state_dict`, its update
# count as `averaging_state`, the trained weights as `current_model_state` (Lightning's names).
AVERAGE_KEYS = ("state_dict", "averaging_state", "current_model_state")


class ExponentialMovingAverage(EMAWeightAveraging):
    """`average = decay * average + (1 - decay) * weights` after every optimizer step, held on the
    module's device in float32 at least (float64 under 64-true); the module holds the average from
    `on_validation_start` to `on_validation_end` (Lightning's ModelCheckpoint, always the last
    callback, saves after that) and from the end of the fit on.

    Args:
        decay: the weight of the average so far, in (0, 1): 0.999 averages over about the last
            1 / (1 - 0.999) = 1000 steps. Checked by volt's config rules (key `ema`).
        warmup: take `min(decay, (1 + n) / (10 + n))` after n updates instead of `decay`, so that
            the first steps' weights fade from the average within a short run (key `ema_warmup`).
    """

    def __init__(self, decay: float, warmup: bool = True) -> None:
        super().__init__(decay=decay)
        self.decay = decay
        self.warmup = warmup
        # A resumed fit's average and trained weights, kept from `on_load_checkpoint` (before the
        # strategy moves and converts the module) until `on_fit_start` (after).
        self._restored: dict[str, Any] | None = None
        # The trained weights while the module holds the average for validation.
        self._trained: list[Tensor] | None = None
        # No update yet since the average was made (not restored): the next one copies.
        self._fresh = True

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if trainer.state.fn != TrainerFn.FITTING:
            return  # Lightning has loaded `state_dict`: the average, which test and predict use
        if "averaging_state" not in checkpoint:
            log.warning("the checkpoint holds no average: the average starts from its weights")
            return
        self._restored = {key: checkpoint[key] for key in AVERAGE_KEYS}

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        average = self._average()
        _widen_onto(average, pl_module)
        restored, self._restored = self._restored, None
        self._fresh = restored is None
        if restored is None:
            # A fresh fit, or one resumed from a checkpoint without an average: the module's
            # weights now (the ones Lightning restored) are where the average starts.
            _copy(_tensors(pl_module), _tensors(average.module))
            return
        state = {f"module.{name}": value for name, value in restored["state_dict"].items()}
        average.load_state_dict(state | restored["averaging_state"])
        # Loaded only now that the module has its precision: under 64-true, Lightning's restore
        # before the conversion has rounded the trained weights to float32.
        pl_module.load_state_dict(restored["current_model_state"])

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self._catch_up(trainer, pl_module)

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            self._catch_up(trainer, pl_module)  # a save earlier in this step's batch-end hooks
        super().on_save_checkpoint(trainer, pl_module, checkpoint)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn != TrainerFn.FITTING or self._average_model is None:
            return  # trainer.validate() evaluates the module's weights as they are
        weights = list(_tensors(pl_module))
        self._trained = [w.detach().clone() for w in weights]
        _copy(_tensors(self._average_model.module), weights)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        trained, self._trained = self._trained, None
        if trained is not None:
            _copy(trained, _tensors(pl_module))

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Lightning swaps here; volt puts the average in at `on_validation_start` instead."""

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Lightning swaps back here; volt takes the average out at `on_validation_end`."""

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Lightning copies the average into the module here; volt does at `on_fit_end`."""

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # What fit leaves in the module is the average: a test with no checkpoint evaluates it.
        _copy(_tensors(self._average().module), _tensors(pl_module))

    def _catch_up(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The update after the newest optimizer step, unless it is done or not due."""
        step = trainer.global_step
        if step > self._latest_update_step and self.should_update(step_idx=step - 1):
            self._update(self._average(), pl_module)
            self._latest_update_step = step

    def _update(self, average: AveragedModel, pl_module: pl.LightningModule) -> None:
        """What `average.update_parameters(pl_module)` does with an EMA, without reading the
        update count on the host: the first update of a fresh average copies the weights, later
        ones take `decay * average + (1 - decay) * weights` (torch's `get_ema_avg_fn`, which
        Lightning uses, one tensor at a time; the decay warmed up by `_factors`); non-floating
        buffers are copied."""
        kept, weights = list(_tensors(average.module)), list(_tensors(pl_module))
        if self._fresh:  # n_averaged == 0, known without asking the device
            _copy(weights, kept)
            self._fresh = False
        else:
            pairs = list(zip(kept, weights, strict=True))
            floating = [(k, w) for k, w in pairs if k.is_floating_point()]
            others = [(k, w) for k, w in pairs if not k.is_floating_point()]
            if floating:  # decay * average + (1 - decay) * weights, rounded as torch's EMA
                targets = [k.detach() for k, _ in floating]
                keep, take = self._factors(average.n_averaged, targets)
                torch._foreach_mul_(targets, keep)
                torch._foreach_add_(
                    targets, torch._foreach_mul([w.detach() for _, w in floating], take)
                )
            _copy([w for _, w in others], [k for k, _ in others])
        average.n_averaged += 1  # queued on the device; checkpoints keep it as torch does

    def _factors(
        self, count: Tensor, targets: list[Tensor]
    ) -> tuple[Tensor | float, Tensor | float]:
        """This update's `(decay, 1 - decay)` after `count` updates. Under warm-up, 0-dim tensors
        computed from the count where it lies, on the device (reading it on the host would make
        every step wait), in the average's widest dtype (float64 under 64-true). Each has its own
        formula, so that once the warm-up is over they round exactly as the fixed decay's."""
        if not self.warmup:
            return self.decay, 1.0 - self.decay
        n = count.to(functools.reduce(torch.promote_types, (t.dtype for t in targets)))
        keep = ((1 + n) / (10 + n)).clamp(max=self.decay)
        take = (9 / (10 + n)).clamp(min=1.0 - self.decay)
        return keep, take

    def _average(self) -> AveragedModel:
        if self._average_model is None:
            raise RuntimeError("ExponentialMovingAverage: no average outside a fit")
        return self._average_model


def _tensors(module: nn.Module) -> Iterator[Tensor]:
    """Parameters, then buffers, in the order Lightning's and torch's averaging pair them."""
    return itertools.chain(module.parameters(), module.buffers())


def _copy(sources: Iterable[Tensor], targets: Iterable[Tensor]) -> None:
    for source, target in zip(sources, targets, strict=True):
        target.detach().copy_(source)


def _widen_onto(average: AveragedModel, module: nn.Module) -> None:
    """Each tensor of `average` on its counterpart's device, floating ones in float32 at least."""
    for kept, model in zip(_tensors(average.module), _tensors(module), strict=True):
        dtype = model.dtype
        if dtype.is_floating_point:
            dtype = torch.promote_types(dtype, torch.float32)
        kept.data = kept.data.to(model.device, dtype)
    average.n_averaged = average.n_averaged.to(next(_tensors(module)).device)
