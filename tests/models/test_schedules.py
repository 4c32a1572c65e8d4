import itertools

import pytest
import torch

from volt.models.schedules import WarmupCosine


def learning_rates(steps: int, **schedule: float) -> list[float]:
    """The learning rate each of `steps` optimiser steps runs with (base rate 1.0)."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = WarmupCosine(optimizer, **schedule)  # type: ignore[arg-type]
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


def test_warms_up_linearly_then_decays_along_a_cosine_to_the_floor() -> None:
    rates = learning_rates(120, warmup_steps=10, max_steps=110, min_lr_ratio=0.1)
    assert rates[:10] == pytest.approx([(i + 1) / 10 for i in range(10)])
    assert rates[10] == pytest.approx(1.0)  # the peak, where the decay starts
    assert rates[60] == pytest.approx(0.55)  # halfway: the middle of 1.0 and the floor
    assert all(a >= b for a, b in itertools.pairwise(rates[10:]))
    assert rates[110:] == pytest.approx([0.1] * 10)  # held at the floor after max_steps


def test_without_warmup_the_first_step_runs_at_the_full_rate() -> None:
    assert learning_rates(2, warmup_steps=0, max_steps=100, min_lr_ratio=0.0)[0] == 1.0


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        (dict(warmup_steps=-1, max_steps=10), "warmup_steps=-1 must be 0 or more"),
        (dict(warmup_steps=10, max_steps=10), "max_steps=10 leaves no steps after warmup"),
        (dict(warmup_steps=0, max_steps=10, min_lr_ratio=1.5), "min_lr_ratio=1.5 must be in"),
    ],
)
def test_bad_settings_are_refused(schedule: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        learning_rates(1, **schedule)
