"""Metric names as modules write them: `val/loss`, `val_loss`, `valid_loss` and `val/loss_epoch`
name one thing. Early stopping, the best checkpoint, metrics.json, a search's pruning and value
all find the watched metric (`task.watch`) among what a module logs through `find_watched`."""

import re
from collections.abc import Iterable, Mapping

_WORDS = {"valid": "val", "validation": "val", "accuracy": "acc"}


def _words(name: str) -> tuple[str, ...]:
    words = [_WORDS.get(w, w) for w in re.split(r"[/_\-. ]+", name.lower()) if w]
    # Lightning's `on_step=True, on_epoch=True` logs `<name>_epoch` beside `<name>_step`.
    return tuple(words[:-1] if words[-1:] == ["epoch"] else words)


def find_watched(logged: Iterable[str], watch: str) -> str | None:
    """`watch` itself if logged, else the one logged name that means the same, else None."""
    names = list(logged)
    if watch in names:
        return watch
    same = [name for name in names if _words(name) == _words(watch)]
    return same[0] if len(same) == 1 else None


def is_recorded(name: str) -> bool:
    """What metrics.json keeps of a fit: validation's metrics and the training loss."""
    words = _words(name)
    return words[:1] == ("val",) or (words[:1] == ("train",) and "loss" in words)


def followed(logged: Iterable[str], watch: str, mode: str) -> tuple[str, str] | None:
    """The metric and mode that early stopping, the best checkpoint and a sweep's summary follow
    for a module that logs `logged`: `watch` under the module's name for it, else its validation
    loss (`val_loss`, `val/loss`...; lower is better), else None."""
    names = list(logged)
    watched = find_watched(names, watch)
    if watched is not None:
        return watched, mode
    loss = find_watched(names, "val/loss")
    return None if loss is None else (loss, "min")


def watched_value(metrics: Mapping[str, float], watch: str) -> float | None:
    """What a sweep optimises: the best value of `watch` (`<name>_best`, where a checkpoint
    followed it), else its last, under the name the module logs it by; None where it logged
    neither. `metrics` as a fit ends (volt.training)."""
    name = find_watched(metrics, watch)
    if name is None:
        return None
    return metrics.get(f"{name}_best", metrics[name])
