"""DataParallel for Lightning 2, which removed `strategy="dp"`.

One process drives several GPUs. Inside each step, every call to the LightningModule's `forward` is
split along the batch dimension, run on one replica per GPU, and gathered back onto the root device
(the first one). The rest of the step runs once, on the root, over the whole batch, just as it does
on one device: the loss on the gathered outputs, `self.log`, torchmetrics updates, the backward pass
and the optimiser step.

Why only `forward` is split: Lightning 1.x ran whole steps inside the replicas. Replicas are shallow
copies that are thrown away after the call, so a metric updated inside one loses its update, and
`self.log` called from several threads races on the trainer's results. Users therefore had to move
logging and metric updates into `training_step_end`, a hook Lightning 2 removed. Splitting only
`forward` lets an ordinary LightningModule run unchanged. The checkpoint holds the LightningModule's
own state_dict (no `module.` prefix), identical to a single-device run's.

Limits (torch.nn.DataParallel's, plus one of this design):
- A step must call the net through `self(...)` or `self.forward(...)`. A step that calls
  `self.net(...)` directly runs on the root device alone (warned once per kind of step).
- `forward` must not log, update metrics or set attributes: its replicas are discarded after the
  call. In-place buffer updates survive only from the root's replica. So BatchNorm keeps the running
  statistics of the first chunk and normalises each chunk with that chunk's own batch statistics.
  `sync_batchnorm` is refused.
- Every tensor argument of `forward` is split along dim 0 with `torch.chunk` semantics: the last
  replica may get fewer samples, and a batch smaller than the device count uses fewer devices.
  Other arguments reach every replica whole.
- Weights are broadcast to every device on each forward call, Python threads drive the replicas, and
  all outputs land on the root device. So dp is slower and less balanced than DDP: prefer DDP
  wherever one process per GPU is possible.
- `torch.compile` is refused: a compiled module is bound to the root's copy, so a replica would run
  the root's weights on another device's inputs.
"""

import logging
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.fabric.utilities.device_dtype_mixin import _update_properties
from lightning.fabric.utilities.distributed import ReduceOp
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import Tensor
from torch._dynamo.eval_frame import OptimizedModule
from torch.nn import Module
from torch.nn.parallel import parallel_apply, replicate
from torch.nn.parallel.parallel_apply import get_a_var
from torch.nn.parallel.scatter_gather import scatter_kwargs
from typing_extensions import override

log = logging.getLogger(__name__)


class DataParallelStrategy(ParallelStrategy):
    """Splits each step's forward over the GPUs of one process; the module docstring says how."""

    def __init__(
        self,
        parallel_devices: list[torch.device] | None = None,
        accelerator: Accelerator | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
    ) -> None:
        # With no `parallel_devices`, the Trainer fills them in from its `accelerator=`/`devices=`.
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        self._steps_warned_unsplit: set[str] = set()
        self._single_device_said = False

    @property
    def _devices(self) -> list[torch.device]:
        if not self.parallel_devices:
            raise RuntimeError(
                "DataParallelStrategy has no devices yet: pass it to a Trainer, which assigns them"
                " from `devices=`, or construct it with `parallel_devices=`."
            )
        return self.parallel_devices

    @property
    def _splits_batches(self) -> bool:
        # setup_environment leaves a single device whenever the devices cannot be split across.
        return len(self._devices) > 1

    @property
    @override
    def root_device(self) -> torch.device:
        return self._devices[0]

    @override
    def setup_environment(self) -> None:
        devices = self._devices
        if len(devices) < 2 or any(device.type != "cuda" for device in devices):
            names = ", ".join(str(device) for device in devices)
            # A line of the run's log, not a UserWarning with its source line; once, though test
            # and predict set the strategy up again.
            if not self._single_device_said:
                log.warning(
                    "DataParallelStrategy needs two or more CUDA devices but got [%s]; training"
                    " on %s alone, as a single-device run.",
                    names,
                    devices[0],
                )
            self._single_device_said = True
            self.parallel_devices = devices[:1]
        elif self._layer_sync is not None:
            raise ValueError(
                "Trainer(sync_batchnorm=True) needs one process per GPU, but DataParallelStrategy"
                " runs one process for all of them. Set sync_batchnorm=False (each replica then"
                " normalises its own chunk), or use DDP."
            )
        super().setup_environment()

    @override
    def setup(self, trainer: Trainer) -> None:
        # Checked here rather than at construction: configure_model may compile, and runs before.
        if self._splits_batches:
            assert self.lightning_module is not None
            _refuse_compiled(self.lightning_module)
        super().setup(trainer)

    @override
    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)

    @property
    @override
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        # One process reads every batch whole; the split happens later, inside forward.
        return {"num_replicas": 1, "rank": 0}

    # One process computes every logged value over the whole batch: there is nothing to exchange.

    @override
    def reduce(
        self, tensor: Any, group: Any | None = None, reduce_op: ReduceOp | str | None = "mean"
    ) -> Any:
        return tensor

    @override
    def all_gather(
        self, tensor: Tensor, group: Any | None = None, sync_grads: bool = False
    ) -> Tensor:
        return tensor

    @override
    def barrier(self, name: str | None = None) -> None:
        return None

    @override
    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        with self._forward_split_across_devices("training_step"):
            return super().training_step(*args, **kwargs)

    @override
    def validation_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        with self._forward_split_across_devices("validation_step"):
            return super().validation_step(*args, **kwargs)

    @override
    def test_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        with self._forward_split_across_devices("test_step"):
            return super().test_step(*args, **kwargs)

    @override
    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        with self._forward_split_across_devices("predict_step"):
            return super().predict_step(*args, **kwargs)

    @contextmanager
    def _forward_split_across_devices(self, step: str) -> Iterator[None]:
        """While `step` runs, route the LightningModule's `forward` through the replicas."""
        module = self.lightning_module
        if module is None or not self._splits_batches:
            yield
            return
        calls = 0

        def forward(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            return self._data_parallel_forward(module, args, kwargs)

        # An instance attribute shadows the class's forward for `self(...)` and `self.forward(...)`
        # alike, and deleting it restores the class's. No other instance forward is lost that way:
        # Lightning sets one only for a torch.compile'd LightningModule, which it refuses to run
        # under strategies other than its own.
        module.forward = forward  # type: ignore[method-assign]
        try:
            yield
        finally:
            del module.forward
        if calls == 0 and step not in self._steps_warned_unsplit:
            self._steps_warned_unsplit.add(step)
            warnings.warn(
                f"{type(module).__name__}.{step} never called self(...) or self.forward(...), so"
                f" its batch ran on {self.root_device} alone: DataParallelStrategy splits only"
                " forward.",
                UserWarning,
                stacklevel=1,
            )

    def _data_parallel_forward(
        self, module: LightningModule, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if get_a_var((args, kwargs)) is None:
            # No tensor to split (e.g. sampling from a generator): every replica would compute the
            # same thing, so run once on the root.
            return type(module).forward(module, *args, **kwargs)
        inputs, replica_kwargs = scatter_kwargs(args, kwargs, self._devices)
        # A batch smaller than the device count comes back in fewer chunks.
        devices = self._devices[: len(inputs)]
        replicas = replicate(module, devices, detach=not torch.is_grad_enabled())
        # parallel_apply's worker threads inherit grad mode and whether autocast is on, but not
        # autocast's dtype or inference mode, which are thread-local as well: without passing them
        # on, replicas under bf16-mixed would silently compute in float16.
        autocast_dtype = (
            torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None
        )
        inference_mode = torch.is_inference_mode_enabled()
        replica_forwards = [
            _ReplicaForward(replica, device, autocast_dtype, inference_mode)
            for replica, device in zip(replicas, devices, strict=True)
        ]
        outputs = parallel_apply(replica_forwards, inputs, replica_kwargs, devices)
        chunk_sizes = [
            _chunk_size(chunk, chunk_kwargs)
            for chunk, chunk_kwargs in zip(inputs, replica_kwargs, strict=True)
        ]
        return gather_replica_outputs(outputs, chunk_sizes, self.root_device)


class _ReplicaForward(Module):
    """One replica's share of a forward call, run on a parallel_apply worker thread."""

    def __init__(
        self,
        replica: LightningModule,
        device: torch.device,
        autocast_dtype: torch.dtype | None,
        inference_mode: bool,
    ) -> None:
        super().__init__()
        # The replica copied the root's `_device`; code in forward that allocates on `self.device`
        # must get the replica's own device.
        _update_properties(replica, device=device)
        self.replica = replica
        self.autocast_dtype = autocast_dtype
        self.inference_mode = inference_mode

    @override
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        autocast_enabled = self.autocast_dtype is not None
        with (
            torch.inference_mode(self.inference_mode),
            torch.autocast("cuda", dtype=self.autocast_dtype, enabled=autocast_enabled),
        ):
            # The class's forward rather than `self.replica(...)`: the replica copied the root's
            # patched `forward` attribute, and the root's own module hooks already ran once on the
            # whole batch, as they would on one device.
            return type(self.replica).forward(self.replica, *args, **kwargs)


def gather_replica_outputs(
    outputs: Sequence[Any], chunk_sizes: Sequence[int], device: torch.device
) -> Any:
    """Merge the replicas' forward outputs on `device` into what one forward over the batch returns.

    `outputs[i]` came from a chunk of `chunk_sizes[i]` samples. Tensors with a batch dimension are
    concatenated along dim 0 in replica order. A 0-dim tensor holds one value per replica, typically
    a loss averaged over that replica's chunk, so it becomes the mean over replicas weighted by
    chunk size, in float32 or wider: the whole-batch mean even when the batch split unevenly.
    Dicts, lists and (named) tuples are merged entry by entry.
    """
    first = outputs[0]
    if isinstance(first, Tensor):
        if first.dim() == 0:
            values = torch.stack([value.to(device) for value in outputs])  # (replicas,)
            weights = torch.tensor(chunk_sizes, dtype=torch.float32, device=device)
            return (values * weights).sum() / weights.sum()
        return torch.cat([value.to(device) for value in outputs])
    if first is None:
        return None
    if isinstance(first, dict):
        return type(first)(
            (key, gather_replica_outputs([output[key] for output in outputs], chunk_sizes, device))
            for key in first
        )
    if isinstance(first, (list, tuple)):
        merged = [
            gather_replica_outputs(entries, chunk_sizes, device)
            for entries in zip(*outputs, strict=True)
        ]
        # A namedtuple takes its fields as separate arguments; list and tuple take one iterable.
        return type(first)(*merged) if hasattr(first, "_fields") else type(first)(merged)
    raise TypeError(
        f"forward returned a {type(first).__name__}, which DataParallelStrategy cannot merge across"
        " replicas; return tensors (or dicts, lists and tuples of them) from forward instead."
    )


def _chunk_size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    tensor = get_a_var((args, kwargs))
    assert tensor is not None, "scatter gives every chunk a slice of each tensor argument"
    return tensor.shape[0]


def _refuse_compiled(module: Module) -> None:
    # `_compiled_call_impl` is where nn.Module.compile() keeps its compiled call.
    compiled = [
        name or "the LightningModule"
        for name, submodule in module.named_modules()
        if isinstance(submodule, OptimizedModule) or submodule._compiled_call_impl is not None
    ]
    if compiled:
        raise ValueError(
            f"DataParallelStrategy cannot split compiled modules ({', '.join(compiled)}): compiled"
            " code is bound to the root device's copy, so the other replicas would run its weights."
            " Turn torch.compile off, or train with DDP."
        )
