"""Learning-rate schedules that torch does not ship as one scheduler."""

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler


class WarmupCosine(LRScheduler):
    """Linear warmup to the optimiser's learning rate over warmup_steps, then a cosine decay to
    min_lr_ratio times it at max_steps, held there after. Step it once per optimiser step.
    max_steps=-1 (a run with no step limit, Lightning's convention): no decay after warmup.

    A class rather than a function returning a LambdaLR: a checkpoint's stored config may name
    scheduler classes only (`volt.config.stored`), and the settings land in its state_dict."""

    def __init__(
        self,
        optimizer: Optimizer,
        warmup_steps: int,
        max_steps: int,
        min_lr_ratio: float = 0.1,
        last_epoch: int = -1,
    ) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps={warmup_steps} must be 0 or more")
        if max_steps != -1 and max_steps <= warmup_steps:
            raise ValueError(
                f"max_steps={max_steps} leaves no steps after warmup_steps={warmup_steps}: "
                f"use a larger max_steps or fewer warmup steps, e.g. warmup_steps={max_steps // 10}"
            )
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio={min_lr_ratio} must be in [0, 1], e.g. 0.1")
        self.warmup_steps = warmup_steps
        self.max_steps = max_steps
        self.min_lr_ratio = min_lr_ratio
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        """The multiple of the base learning rate at optimiser step `step` (0-based)."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps  # the first step already moves the weights
        if self.max_steps == -1:
            return 1.0
        progress = min(1.0, (step - self.warmup_steps) / (self.max_steps - self.warmup_steps))
        ratio = self.min_lr_ratio
        return ratio + (1.0 - ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def get_lr(self) -> list[float]:  # type: ignore[override]
        return [float(base) * self.factor(self.last_epoch) for base in self.base_lrs]
