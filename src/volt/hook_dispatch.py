"""What Lightning's calls of hooks cost the host, cut where volt builds its Trainer (issue #40).

Lightning (2.0 to 2.6.6) runs each hook of the module, the callbacks and the strategy through
`trainer/call.py`: a profiler context around each, the module's running hook recorded before and
after each, and every per-batch hook of every callback called, empty ones too. On a GPU whose step
the host bounds (small nets, CUDA graphs) each of these is paid at full price. Each piece below
names the defect and when to delete it.
"""

import contextlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature

# The hooks Lightning calls on every callback at every batch.
PER_BATCH_HOOKS = (
    *("on_train_batch_start", "on_train_batch_end", "on_before_backward", "on_after_backward"),
    *("on_before_optimizer_step", "on_before_zero_grad"),
    *(
        f"on_{stage}_batch_{edge}"
        for stage in ("validation", "test", "predict")
        for edge in ("start", "end")
    ),
)


def skip_inherited_batch_hooks(callbacks: Sequence[Callback]) -> None:
    """Lightning (2.0 to 2.6.6, `trainer/call.py: _call_callback_hooks`) calls every per-batch hook
    of every callback, the empty ones each callback inherits from `Callback` too, each inside a
    profiler context: about 2.5 us a callback and hook on a 2-core CPU, a dozen calls a step for
    each of volt's 15 callbacks (issue #40). It skips a hook that is not callable, so the inherited
    empty ones are set to None on each instance; the hooks a callback defines run as before. Delete
    when Lightning skips hooks that a callback does not override."""
    for callback in callbacks:
        for hook in PER_BATCH_HOOKS:
            # Compared as the bound method's function: LambdaCallback sets its own on the instance.
            if getattr(getattr(callback, hook), "__func__", None) is getattr(Callback, hook):
                setattr(callback, hook, None)


class NoProfiler(PassThroughProfiler):
    """Lightning's profiler when none is chosen, without its cost: Lightning (2.0 to 2.6.6) opens
    `trainer.profiler.profile(name)` around every hook it calls, 30 to 40 a training step, and
    the default PassThroughProfiler's is a generator-based context manager (`contextmanager`),
    about 1 us each on a 2-core CPU against 0.16 us for one shared `nullcontext` (torch 2.14,
    2026-11-29; issue #40). Delete when Lightning's default profiler stops building one per call."""

    _NOTHING = contextlib.nullcontext()

    def profile(self, action_name: str) -> contextlib.nullcontext[None]:  # type: ignore[override]
        return self._NOTHING


_HOOK_NAME = "_current_fx_name"
_modules_setattr = pl.LightningModule.__setattr__  # torch's nn.Module.__setattr__ (2.11 to 2.14)


def store_hook_names_directly() -> None:
    """Lightning (2.0 to 2.6.6, `trainer/call.py`) records which hook is running by setting
    `pl_module._current_fx_name` before and after each hook it calls on the module, the callbacks
    and the strategy: 44 assignments a training step in a bare Trainer. Each goes through
    `nn.Module.__setattr__`, which first asks whether the value is a Parameter, a module or a
    buffer (`isinstance` against `Parameter` runs its metaclass's `__instancecheck__` in Python).
    The name is a str or None, never one of those, so it is stored as `object.__setattr__` stores
    it, as torch's own `Module.__init__` stores its plain attributes (pytorch/pytorch#77098). For
    the whole process, every LightningModule (a subclass's own `__setattr__` still runs first, and
    reaches this one through `super()`). Delete when Lightning stores the name without
    `Module.__setattr__`."""
    pl.LightningModule.__setattr__ = _setattr  # type: ignore[method-assign,assignment]


def _setattr(module: pl.LightningModule, name: str, value: Any) -> None:
    if name == _HOOK_NAME and (value is None or type(value) is str):
        object.__setattr__(module, name, value)
    else:
        _modules_setattr(module, name, value)


def read_step_signature_once(trainer: pl.Trainer) -> None:
    """Lightning (2.0 to 2.6.6, `loops/training_epoch_loop.py: _build_kwargs`; no upstream issue
    found) reads the signature of the module's `training_step` with `inspect.getfullargspec` at
    every training step, to know whether to pass it `batch_idx`: 10 to 25 us a call on the 2-core
    CPU (torch 2.14), 0.14 ms a step under cProfile on an H200's host. This trainer asks again
    only when the step function is another than last time (a module swapped in, a method rebound)
    and passes the same arguments as Lightning. Delete when Lightning reads the signature once,
    or if its `_build_kwargs` starts passing anything else."""
    asked: Any = None  # the step function last asked about
    takes_batch_idx = False

    def build_kwargs(kwargs: OrderedDict, batch: Any, batch_idx: int) -> OrderedDict:
        nonlocal asked, takes_batch_idx
        kwargs["batch"] = batch
        step = trainer.lightning_module.training_step
        function = getattr(step, "__func__", step)  # a bound method's, the same every step
        if function is not asked:
            asked = function
            takes_batch_idx = is_param_in_hook_signature(step, "batch_idx", min_args=2)
        if takes_batch_idx:
            kwargs["batch_idx"] = batch_idx
        return kwargs

    trainer.fit_loop.epoch_loop._build_kwargs = build_kwargs  # type: ignore[method-assign]
