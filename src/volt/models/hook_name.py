"""A LightningModule's `_current_fx_name` stored without torch's `Module.__setattr__` (issue #40).

Lightning (2.0 to 2.6.6, `trainer/call.py`) records which hook is running by setting
`pl_module._current_fx_name` before and after each hook it calls on the module, the callbacks and
the strategy: 44 assignments a training step in a bare Trainer. Each goes through
`nn.Module.__setattr__`, which first asks whether the value is a Parameter, a module or a buffer
(`isinstance` against `Parameter` runs its metaclass's `__instancecheck__` in Python). The name is a
str or None, never one of those, so it is stored as `object.__setattr__` stores it, as torch's own
`Module.__init__` stores its plain attributes (pytorch/pytorch#77098). Delete when Lightning stores
it without `Module.__setattr__`.
"""

from typing import Any

import lightning.pytorch as pl

_HOOK_NAME = "_current_fx_name"
_modules_setattr = pl.LightningModule.__setattr__  # torch's nn.Module.__setattr__ (2.11 to 2.14)


def store_hook_names_directly() -> None:
    """For the whole process, every LightningModule (a subclass's own `__setattr__` still runs
    first, and reaches this one through `super()`)."""
    pl.LightningModule.__setattr__ = _setattr  # type: ignore[method-assign,assignment]


def _setattr(module: pl.LightningModule, name: str, value: Any) -> None:
    if name == _HOOK_NAME and (value is None or type(value) is str):
        object.__setattr__(module, name, value)
    else:
        _modules_setattr(module, name, value)
