"""Counts, step by step and rank by rank, what in a training step makes the host wait for the
device and which collectives Python code starts, each put down to the code that asked for it.

Add it to a run with `+callbacks.sync_counter={_target_:tests.sync_counter.SyncCounter,...}`
(and `trusted_targets=[tests]`); each rank builds its own and writes its own file.

What counts as a wait ("sync"): reading a tensor's value into Python (`.item()`, `bool()`,
`float()`, `int()`, formatting: `aten._local_scalar_dense`; `.tolist()`, `.numpy()`), ops whose
output size depends on the values, so that CUDA must finish them before the host can go on
(`nonzero`, `masked_select`, the `unique`s, `repeat_interleave` without `output_size`,
`bincount`, `equal`, indexing with a boolean mask), copies from the device to host memory
that are not queued (and blocking copies to the device), and `torch.cuda.synchronize()`,
`Event.synchronize()`, `Stream.synchronize()`. On a CUDA run only tensors on the device count;
on a CPU run every tensor stands for one that a GPU run would hold on the GPU, so the count is
stricter than what a GPU would need (a value that a GPU run keeps on the host counts too).

What counts as a collective: a call of `torch.distributed`'s Python functions (`all_reduce`,
`all_gather`, `broadcast`, `barrier`, `reduce_scatter`, the `*_object` ones, point-to-point,
and `_broadcast_coalesced`, by which DDP broadcasts buffers), and torch's functional collectives
(`torch.ops._c10d_functional`'s all-reduce, all-gather and the like, as volt's SyncBatchNorm
starts them), seen at dispatch. One that calls another (as `all_gather_object` calls
`all_gather`) counts once. DDP's gradient all-reduce is not counted: its Reducer calls the
process group from C++ during backward, never through these functions.

Who asked: the innermost frame on the stack that is volt's own code (`volt/<file>:<line>`), or
code that is neither a library nor Lightning (`other:<file>:<line>`: a test's callback, a
script), unless Lightning's loops or hook calls lie between that frame and the op: then the frame
only started Lightning (`trainer.fit`, volt's launcher) and the op is Lightning's own work
(`lightning`). A volt callback that calls Lightning's API (`trainer.strategy.all_gather`,
`trainer.save_checkpoint`) is named for it. With no such frame: `lightning` if Lightning's code is
on the stack, else `torch`.
"""

import functools
import json
import sys
import sysconfig
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import lightning
import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

import volt

aten = torch.ops.aten

_VOLT = Path(volt.__file__).resolve().parent
_LIBRARIES = (Path(torch.__file__).resolve().parent.parent, Path(sysconfig.get_paths()["stdlib"]))
_LIGHTNING = Path(lightning.__file__).resolve().parent
# Lightning's loops and the module that calls hooks: code under them is Lightning's own work.
_LIGHTNING_DRIVERS = (
    _LIGHTNING / "pytorch" / "loops",
    _LIGHTNING / "pytorch" / "trainer" / "call.py",
)

# Ops that on CUDA cannot return before the device has computed their input.
_VALUE_READS = {aten._local_scalar_dense.default, aten.equal.default}
_DATA_DEPENDENT_SIZE = {
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.unique_dim_consecutive.default,
    aten.bincount.default,
}
_BOOLEAN_INDEXING = {
    aten.index.Tensor,
    aten.index_put.default,
    aten.index_put_.default,
    aten._index_put_impl_.default,
}

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
    "_broadcast_coalesced",
)
# torch.ops._c10d_functional's collectives (its others wait for or wrap their results)
_FUNCTIONAL_COLLECTIVES = {
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced",
    "all_to_all_single",
    "broadcast",
}
_CUDA_WAITS: list[tuple[Any, str]] = [
    (torch.cuda, "synchronize"),
    (torch.cuda.Event, "synchronize"),
    (torch.cuda.Stream, "synchronize"),
]
_TENSOR_READS = ("tolist", "numpy")
# The counter's own functions, whose frames are not who asked.
_OWN_FUNCTIONS = {"who_asked", "add", "counted_call", "__torch_dispatch__", "counted", "<lambda>"}


class Tally:
    """Counts per step: {"syncs": {"<who> <what>": n}, "collectives": {...}}."""

    def __init__(self, counts_host_tensors: bool) -> None:
        self.counts_host_tensors = counts_host_tensors
        self.steps: list[dict[str, Any]] = []
        self._inside = threading.local()  # depth of counted calls in this thread

    def start_step(self, step: int) -> None:
        self.steps.append({"step": step, "syncs": Counter(), "collectives": Counter()})

    def waits_for(self, tensor: Any) -> bool:
        return isinstance(tensor, Tensor) and (
            tensor.device.type != "cpu" or self.counts_host_tensors
        )

    def add(self, kind: str, what: str) -> None:
        if self.steps and not getattr(self._inside, "depth", 0):
            self.steps[-1][kind][f"{who_asked()} {what}"] += 1

    def counted_call(self, kind: str, what: str, call: Callable[[], Any]) -> Any:
        """Counts `call` once, and nothing that it does in turn."""
        self.add(kind, what)
        self._inside.depth = getattr(self._inside, "depth", 0) + 1
        try:
            return call()
        finally:
            self._inside.depth -= 1


class _SyncingOps(TorchDispatchMode):
    def __init__(self, tally: Tally) -> None:
        super().__init__()
        self.tally = tally

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        name = str(func.overloadpacket.__name__)
        if self._waits(func, args, kwargs):
            self.tally.add("syncs", name)
        if func.namespace == "_c10d_functional" and name in _FUNCTIONAL_COLLECTIVES:
            self.tally.add("collectives", name)
        return func(*args, **kwargs)

    def _waits(self, func: Any, args: tuple[Any, ...], kwargs: dict) -> bool:
        tally = self.tally
        if func in _VALUE_READS or func in _DATA_DEPENDENT_SIZE:
            return tally.waits_for(args[0])
        if func is aten.repeat_interleave.Tensor:
            return kwargs.get("output_size") is None and tally.waits_for(args[0])
        if func in _BOOLEAN_INDEXING:
            masks = [i for i in args[1] if i is not None and i.dtype in (torch.bool, torch.uint8)]
            return bool(masks) and tally.waits_for(args[0])
        if func is aten._to_copy.default:
            source = args[0]
            target = torch.device(kwargs.get("device") or source.device)
            # Queued when non_blocking: to the device, or to the host into pinned memory, which
            # `_to_copy` then allocates.
            return _crosses(source.device, target) and not kwargs.get("non_blocking", False)
        if func is aten.copy_.default:
            target, source = args[0], args[1]
            if not _crosses(source.device, target.device):
                return False
            non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
            # Queued when non_blocking: to the device, or to the host into pinned memory only.
            return not (non_blocking and (target.is_cuda or target.is_pinned()))
        return False


def _crosses(source: torch.device, target: torch.device) -> bool:
    """A copy between host and CUDA memory."""
    return {source.type, target.type} == {"cpu", "cuda"}


def who_asked() -> str:
    """`volt/<file>:<line>`, `lightning`, `other:<file>:<line>` or `torch`: see the module's
    docstring."""
    lightning_ran_hooks = False
    seen_lightning = False
    for frame in _frames_outward(sys._getframe(1)):
        kind = _kind(frame.f_code)
        if kind == "lightning":
            seen_lightning = True
            lightning_ran_hooks |= _runs_hooks(frame.f_code)
        elif kind in ("volt", "other"):
            if lightning_ran_hooks:
                return "lightning"  # this frame only started Lightning's loops (trainer.fit)
            path = Path(frame.f_code.co_filename).resolve()
            where = path.relative_to(_VOLT.parent) if kind == "volt" else path
            return f"{'other:' if kind == 'other' else ''}{where}:{frame.f_lineno}"
    return "lightning" if seen_lightning else "torch"


def _frames_outward(frame: FrameType | None) -> Iterator[FrameType]:
    """The stack from `frame` out, less the counter's own frames."""
    while frame is not None:
        code = frame.f_code
        if code.co_filename != __file__ or code.co_name not in _OWN_FUNCTIONS:
            yield frame
        frame = frame.f_back


@functools.cache
def _runs_hooks(code: CodeType) -> bool:
    path = Path(code.co_filename).resolve()
    return any(path == driver or path.is_relative_to(driver) for driver in _LIGHTNING_DRIVERS)


@functools.cache
def _kind(code: CodeType) -> str:
    path = Path(code.co_filename).resolve()
    if path.is_relative_to(_VOLT):
        return "volt"
    if path.is_relative_to(_LIGHTNING):
        return "lightning"
    if any(path.is_relative_to(root) for root in _LIBRARIES) or not path.is_absolute():
        return "library"  # torch, the other installed packages, Python's own, <frozen ...>
    return "other"


class SyncCounter(Callback):
    """Counts syncs and collectives in global steps `start_step` .. `start_step + steps - 1`
    (each from its `on_train_batch_start` to the next one's) and writes them to `path`, with
    `.rank<N>` before its suffix: {"rank", "world_size", "steps": [{"step", "syncs",
    "collectives"}, ...], "complete"}."""

    def __init__(self, path: str, start_step: int = 5, steps: int = 20) -> None:
        self.path = Path(path)
        self.start_step = start_step
        self.steps = steps
        self._tally: Tally | None = None
        self._mode: _SyncingOps | None = None
        self._undo: list[Callable[[], None]] = []

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step == self.start_step and self._tally is None:
            self._start(trainer)
        if self._tally is None:
            return
        if step == self.start_step + self.steps:
            self._stop(trainer, complete=True)
        else:
            self._tally.start_step(step)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop(trainer, complete=False)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._stop(trainer, complete=False)

    def _start(self, trainer: pl.Trainer) -> None:
        self._tally = Tally(counts_host_tensors=trainer.strategy.root_device.type == "cpu")
        self._undo = [_patch(self._tally, owner, name, "syncs") for owner, name in _CUDA_WAITS]
        self._undo += [_patch_tensor_read(self._tally, name) for name in _TENSOR_READS]
        self._undo += [_patch(self._tally, dist, name, "collectives") for name in COLLECTIVES]
        self._mode = _SyncingOps(self._tally)
        self._mode.__enter__()

    def _stop(self, trainer: pl.Trainer, complete: bool) -> None:
        if self._tally is None or self._mode is None:
            return
        self._mode.__exit__(None, None, None)
        for undo in reversed(self._undo):
            undo()
        record = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "steps": self._tally.steps,
            "complete": complete,
        }
        rank_path = self.path.with_suffix(f".rank{trainer.global_rank}{self.path.suffix}")
        rank_path.write_text(json.dumps(record, indent=1))
        self._tally = self._mode = None
        self._undo = []


def _patch(tally: Tally, owner: Any, name: str, kind: str) -> Callable[[], None]:
    """Counts each call of `owner.name`; returns what puts it back."""
    original = getattr(owner, name, None)
    if original is None:
        return lambda: None

    @functools.wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        return tally.counted_call(kind, name, lambda: original(*args, **kwargs))

    setattr(owner, name, counted)
    return lambda: setattr(owner, name, original)


def _patch_tensor_read(tally: Tally, name: str) -> Callable[[], None]:
    """`Tensor.tolist()` and `.numpy()` read memory directly on the CPU, out of the dispatcher's
    sight: counted where they are called."""
    original = getattr(torch.Tensor, name)
    own = name in vars(torch.Tensor)  # else inherited from torch._C.TensorBase

    @functools.wraps(original)
    def counted(tensor: Tensor, *args: Any, **kwargs: Any) -> Any:
        if not tally.waits_for(tensor):
            return original(tensor, *args, **kwargs)
        return tally.counted_call("syncs", name, lambda: original(tensor, *args, **kwargs))

    setattr(torch.Tensor, name, counted)
    if own:
        return lambda: setattr(torch.Tensor, name, original)
    return lambda: delattr(torch.Tensor, name)


def per_step(record: dict[str, Any], kind: str, who: str) -> list[dict[str, int]]:
    """Each step's counts of `kind` ("syncs"/"collectives") asked for by `who` (a prefix:
    "volt/", "volt/callbacks/finite_guard.py", "lightning", "other"), by what was done."""
    steps = []
    for step in record["steps"]:
        done: Counter[str] = Counter()
        for key, count in step[kind].items():
            asker, what = key.rsplit(" ", 1)
            if asker.startswith(who):
                done[what] += count
        steps.append(dict(done))
    return steps


def read_counts(path: Path | str, rank: int) -> dict[str, Any]:
    """What `SyncCounter(path)` wrote on `rank`."""
    path = Path(path)
    return json.loads(path.with_suffix(f".rank{rank}{path.suffix}").read_text())


class InjectSyncs(Callback):
    """A control: makes every training step read its loss on the host (`.item()`) and, under
    several processes, all-reduce a copy of it; the counter must see both, as `other`."""

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Tensor
    ) -> None:
        loss.item()
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(loss.detach().clone())
