"""Learning-rate schedules that torch does not ship as one scheduler."""

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def warmup_cosine(
    optimizer: Optimizer, warmup_steps: int, max_steps: int, min_lr_ratio: float = 0.1
) -> LambdaLR:
    """Linear warmup to the optimiser's learning rate over warmup_steps, then a cosine decay to
    min_lr_ratio times it at max_steps, held there after. Step it once per optimiser step.
    max_steps=-1 (a run with no step limit, Lightning's convention): no decay after warmup."""
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps={warmup_steps} must be 0 or more")
    if max_steps != -1 and max_steps <= warmup_steps:
        raise ValueError(
            f"max_steps={max_steps} leaves no steps after warmup_steps={warmup_steps}: "
            f"use a larger max_steps or fewer warmup steps, e.g. warmup_steps={max_steps // 10}"
        )
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio={min_lr_ratio} must be in [0, 1], e.g. 0.1")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps  # the first step already moves the weights a little
        if max_steps == -1:
            return 1.0
        progress = min(1.0, (step - warmup_steps) / (max_steps - warmup_steps))
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)
