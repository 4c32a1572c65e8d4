"""The watched metric found among the names a module logs it by, and the value a sweep optimises."""

import pytest

from volt.metric_names import find_watched, watched_value


@pytest.mark.parametrize(
    ("logged", "found"),
    [
        (["val/loss", "val_loss"], "val/loss"),  # the name itself first
        (["train_loss", "val_loss"], "val_loss"),
        (["valid_loss"], "valid_loss"),
        (["val/loss_epoch", "val/loss_step"], "val/loss_epoch"),
        (["val_loss", "val/loss_epoch"], None),  # two that mean it: neither is guessed
        (["val/acc", "train_loss"], None),
    ],
)
def test_the_watched_metric_is_found_under_the_modules_name(
    logged: list[str], found: str | None
) -> None:
    assert find_watched(logged, "val/loss") == found


def test_a_sweep_optimises_the_best_value_else_the_last() -> None:
    fit = {"val_loss": 0.3, "val_loss_best": 0.2, "train_loss": 0.1}
    assert watched_value(fit, "val/loss") == 0.2
    assert watched_value({"val_loss": 0.3}, "val/loss") == 0.3
    # A module that logs the validation loss, not the accuracy the task watches: no value. The
    # loss the checkpoint fell back to is not the study's metric (nor its direction).
    assert watched_value(fit, "val/acc") is None
    assert watched_value({"train/loss": 0.1}, "val/loss") is None
