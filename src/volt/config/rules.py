"""Value rules: a key, what it may hold, and an example to type instead. Pure data, read by
`volt.config.validation`; the Trainer's and the data loaders' rules say what Lightning and torch
would refuse only once the run has started (a training step, a data loader)."""

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rule:
    key: str
    check: Callable[[Any], bool]
    allowed: str
    example: str


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def one_of(*values: Any) -> Callable[[Any], bool]:
    # By type too: YAML's 1 is not true, and `v in (True, False)` would take it.
    return lambda v: any(type(v) is type(x) and v == x for x in values)


def int_from(low: int, *, or_null: bool = False) -> Callable[[Any], bool]:
    return lambda v: (or_null and v is None) or (is_int(v) and v >= low)


def _batch_limit(v: Any) -> bool:
    return v is None or (is_int(v) and v >= 0) or (isinstance(v, float) and 0 <= v <= 1)


# A directory name: no '/', not '.' or '..', nothing a shell would need quoted.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def path_part(key: str, example: str) -> Rule:
    return Rule(
        key,
        lambda v: v is None or (isinstance(v, str) and NAME.fullmatch(v) is not None),
        "null or letters, digits, '.', '_' and '-' (it becomes a directory name)",
        example,
    )


def _batches(key: str, example: str) -> Rule:
    return Rule(
        key, _batch_limit, "null, a number of batches, or a fraction between 0.0 and 1.0", example
    )


TRAINER_RULES = (
    Rule(
        "trainer.max_steps",
        int_from(-1),
        "an integer >= 1 (or -1: no limit)",
        "trainer.max_steps=1000",
    ),
    Rule(
        "trainer.min_epochs",
        int_from(0, or_null=True),
        "null or an integer >= 0",
        "trainer.min_epochs=1",
    ),
    Rule(
        "trainer.accumulate_grad_batches",
        int_from(1),
        "a positive integer",
        "trainer.accumulate_grad_batches=4",
    ),
    Rule(
        "trainer.check_val_every_n_epoch",
        int_from(1, or_null=True),
        "null or a positive integer",
        "trainer.check_val_every_n_epoch=1",
    ),
    Rule(
        "trainer.log_every_n_steps",
        int_from(0, or_null=True),
        "null or an integer >= 0",
        "trainer.log_every_n_steps=50",
    ),
    Rule(
        "trainer.num_sanity_val_steps",
        int_from(-1),
        "an integer >= 0 (or -1: all)",
        "trainer.num_sanity_val_steps=2",
    ),
    _batches("trainer.limit_train_batches", "trainer.limit_train_batches=0.25"),
    _batches("trainer.limit_val_batches", "trainer.limit_val_batches=10"),
    _batches("trainer.limit_test_batches", "trainer.limit_test_batches=10"),
    _batches("trainer.limit_predict_batches", "trainer.limit_predict_batches=10"),
    _batches("trainer.overfit_batches", "trainer.overfit_batches=3"),
    Rule(
        "trainer.fast_dev_run",
        lambda v: isinstance(v, bool) or (is_int(v) and v >= 0),
        "true, false or a number of batches",
        "trainer.fast_dev_run=true",
    ),
    Rule(
        "trainer.gradient_clip_val",
        lambda v: v is None or (is_number(v) and v >= 0),
        "null or a number >= 0",
        "trainer.gradient_clip_val=1.0",
    ),
    Rule(
        "trainer.gradient_clip_algorithm",
        one_of(None, "norm", "value"),
        "null, norm or value",
        "trainer.gradient_clip_algorithm=norm",
    ),
    Rule(
        "trainer.deterministic",
        one_of(None, True, False, "warn"),
        "null, true, false or warn",
        "trainer.deterministic=true",
    ),
    Rule(
        "trainer.benchmark",
        one_of(None, True, False),
        "null, true or false",
        "trainer.benchmark=true",
    ),
    Rule(
        "trainer.sync_batchnorm",
        one_of(True, False),
        "true or false",
        "trainer.sync_batchnorm=true",
    ),
)


def _count(key: str, low: int, allowed: str, example: str, or_null: bool = False) -> Rule:
    return Rule(key, int_from(low, or_null=or_null), allowed, example)


# Counts of conf/callbacks/ that a callback would take without complaint and act on wrongly
# (a negative patience stops at the first validation, a negative count draws nothing).
CALLBACK_RULES = (
    _count(
        "callbacks.early_stopping.patience",
        0,
        "an integer >= 0",
        "callbacks.early_stopping.patience=10",
    ),
    Rule(
        "callbacks.early_stopping.min_delta",
        lambda v: is_number(v) and v >= 0,
        "a number >= 0 (task.mode says which way is better)",
        "callbacks.early_stopping.min_delta=0.001",
    ),
    _count(
        "callbacks.model_checkpoint.save_top_k",
        -1,
        "an integer >= 0 (or -1: every one)",
        "callbacks.model_checkpoint.save_top_k=3",
    ),
    _count(
        "callbacks.last_checkpoint.every_n_train_steps",
        1,
        "null or a positive integer",
        "callbacks.last_checkpoint.every_n_train_steps=500",
        or_null=True,
    ),
    _count(
        "callbacks.model_summary.max_depth",
        -1,
        "an integer >= 0 (or -1: every layer)",
        "callbacks.model_summary.max_depth=2",
    ),
    _count(
        "callbacks.classification_images.num_samples",
        1,
        "a positive integer",
        "callbacks.classification_images.num_samples=16",
    ),
    _count(
        "callbacks.classification_images.every_n_validations",
        1,
        "null or a positive integer",
        "callbacks.classification_images.every_n_validations=5",
        or_null=True,
    ),
    _count(
        "callbacks.garbage_collection.every_n_steps",
        1,
        "null or a positive integer",
        "callbacks.garbage_collection.every_n_steps=50",
        or_null=True,
    ),
    _count(
        "callbacks.gpu_memory.log_every_n_steps",
        1,
        "null or a positive integer",
        "callbacks.gpu_memory.log_every_n_steps=50",
        or_null=True,
    ),
    _count(
        "callbacks.text_samples.num_samples",
        1,
        "a positive integer",
        "callbacks.text_samples.num_samples=2",
    ),
    _count(
        "callbacks.text_samples.max_new_tokens",
        1,
        "a positive integer",
        "callbacks.text_samples.max_new_tokens=128",
    ),
)

LOADER_RULES = (
    Rule(
        "data.on_device",
        one_of("auto", True, False),
        "auto, true or false",
        "data.on_device=auto",
    ),
    Rule(
        "data.pin_memory",
        one_of(None, True, False),
        "null (auto), true or false",
        "data.pin_memory=true",
    ),
    Rule(
        "data.persistent_workers",
        one_of(True, False),
        "true or false",
        "data.persistent_workers=true",
    ),
    Rule(
        "data.prefetch_factor",
        int_from(1, or_null=True),
        "null or a positive integer",
        "data.prefetch_factor=2",
    ),
    Rule("data.split_seed", int_from(0), "an integer >= 0", "data.split_seed=1234"),
    Rule("data.drop_last", one_of(True, False), "true or false", "data.drop_last=true"),
    Rule("data.download", one_of(True, False), "true or false", "data.download=false"),
)

# Loggers whose package is an optional extra: the `_target_` class's name -> the module it needs.
# Lightning's own and volt's (volt.loggers) alike.
LOGGER_PACKAGES = {
    "MLFlowLogger": "mlflow",
    "MLflowRunLogger": "mlflow",
    "WandbLogger": "wandb",
    "WandbRunLogger": "wandb",
}
LOGGERS_EXTRA = "pip install -e '.[loggers]'"  # in the clone: volt is not on PyPI
