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


def validation_loss(logged: Iterable[str]) -> str | None:
    """The validation loss a module logs (`val_loss`, `val/loss`...), if it logs one."""
    return find_watched(logged, "val/loss")


def watched_value(metrics: Mapping[str, float], watch: str) -> float | None:
    """What a sweep optimises: the best value of `watch` (`<name>_best`, where a checkpoint
    followed it), else its last, under the name the module logs it by; None where it logged
    neither. `metrics` as a fit ends (volt.training)."""
    name = find_watched(metrics, watch)
    if name is None:
        return None
    return metrics.get(f"{name}_best", metrics[name])
