"""Fully sharded data parallel for any LightningModule: torch's FSDP2 (`fully_shard`) applied by
volt, ranks started from the run's resolved config as for volt's DDP (`volt.strategies.launcher`).

Each rank holds 1/N of every parameter, gradient and optimiser state; a layer's full weights exist
only while it runs (all-gathered before, freed after). The layers sharded one by one are those
whose class `wrap` names (a transformer's block); every top-level submodule of the
LightningModule is then sharded as a whole over what is left in it (embeddings, final norm, head).

Why FSDP2 (Lightning's ModelParallelStrategy) and not Lightning's FSDPStrategy (FSDP1), on
Lightning 2.6 with torch 2.11 (GPU) and 2.14 (here):
- FSDP1 flattens parameters into 1-D shards before `configure_optimizers` runs, so a net that picks
  weight decay by `p.dim()` (volt's GPT) would decay nothing; FSDP2's parameters are DTensors
  that keep their shapes, so `param_groups`, `num_params` (MFU) and state_dict keys are as without
  sharding.
- Lightning's FSDP1 precision plugin refuses gradient clipping by norm (gpt_bytes clips at 1.0);
  FSDP2's DTensor gradients give torch's `clip_grad_norm_` the global norm.
- bf16-mixed: FSDP1 as Lightning sets it up reduces gradients in bf16; here they are gathered in
  bf16 and reduced in float32 (`MixedPrecisionPolicy`).
- Lightning builds FSDP1 only on CUDA; FSDP2 trains on the CPU over gloo, so it is tested with real
  processes anywhere. torch.compile works per block under FSDP2 (torchtitan's recipe); FSDP1
  needs use_orig_params and breaks the graph at every wrapped unit. FSDP1 is in maintenance.
What it costs: ModelParallelStrategy is marked experimental, and it demands that the
LightningModule shard itself in `configure_model`. volt's contract is that any LightningModule
fits, so this strategy shards it (a module that does shard itself in `configure_model` is left as
it is). Precision 16-mixed (no sharded gradient scaler) and 64-true are refused by Lightning, and
by volt's config checks before anything starts.

Checkpoints: one file with the full state (assembled on rank 0, written through the Trainer's
CheckpointIO, volt's AtomicCheckpointIO), in the layout of a single-device run: `volt.eval` and
`load_trained_module` read it unchanged, and it loads with weights_only=True. Sharded folders
would save faster on many GPUs but need all ranks (or a conversion) to read; volt's resume, eval
and checkpoint checks all read one file.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, OptimStateKeyType, fully_shard
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1
from torch.distributed.tensor import DTensor
from typing_extensions import override

from volt.errors import ConfigError
from volt.strategies.launcher import run_config_launcher


class FSDPStrategy(ModelParallelStrategy):
    """FSDP2 over every rank, sharding the LightningModule itself (see the module docstring).

    `wrap`: the classes (`module.QualName`, e.g. `volt.nets.gpt.Block`) whose instances are sharded
    one by one; they are matched by name, never imported. `reshard_after_forward`: free each
    layer's gathered weights after its forward (False keeps them for backward: less traffic,
    more memory). `rank_config`, `trusted_targets`: as volt's DDPStrategy.
    """

    def __init__(
        self,
        rank_config: str | Path,
        trusted_targets: Sequence[str] = (),
        wrap: Sequence[str] = (),
        reshard_after_forward: bool = True,
        process_group_backend: str | None = None,
    ) -> None:
        # One mesh dimension of every rank (set in setup_environment, once the world size is
        # known): FSDP alone, no tensor parallelism.
        super().__init__(
            tensor_parallel_size=1,
            save_distributed_checkpoint=False,
            process_group_backend=process_group_backend,
        )
        self.rank_config = Path(rank_config)
        self.trusted_targets = list(trusted_targets)
        self.wrap = list(wrap)
        self.reshard_after_forward = reshard_after_forward

    def check_module(self, module: pl.LightningModule) -> None:
        """Raise ConfigError if `wrap` names a class `module` has no layer of (a typo, or a
        config for another model): called before any rank starts."""
        present = {_dotted(type(m)) for m in module.modules()}
        for name in self.wrap:
            if name not in present:
                layers = sorted(
                    {_dotted(type(m)) for m in module.modules() if list(m.children())}
                    - {_dotted(type(module))}
                )
                raise ConfigError(
                    f"trainer.strategy.wrap: {type(module).__name__} has no layer of class"
                    f" {name!r}: name its repeated block (its layers with sublayers:"
                    f" {', '.join(layers) or 'none'}), or trainer.strategy.wrap=[] to shard each"
                    " top-level submodule whole"
                )

    @override
    def _configure_launcher(self) -> None:
        self._launcher = run_config_launcher(self, "FSDP", self.rank_config, self.trusted_targets)

    @override
    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        # ModelParallelStrategy.setup, less its demand for a `configure_model` that shards: here
        # volt shards. (Meta-device init is not volt's: it builds modules before the Trainer.)
        assert self.model is not None
        assert self.accelerator is not None
        self.accelerator.setup(trainer)
        self.model = self.precision_plugin.convert_module(self.model)  # *-true: before sharding
        # Sharded already: by the module's own configure_model, or by the fit before a test.
        if not any(isinstance(m, FSDPModule) for m in self.model.modules()):
            shard(
                self.model,
                self.wrap,
                self.device_mesh["data_parallel"],
                mixed_precision(str(trainer.precision)),
                self.reshard_after_forward,
            )
        self.model_to_device()  # what no shard holds: metric states, buffers of unsharded parts
        self.barrier()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)  # after sharding: the optimiser holds the DTensors
        self.setup_precision_plugin()

    @override
    def load_checkpoint(self, checkpoint_path: _PATH, weights_only: bool | None = None) -> Any:
        # Lightning's loader (lightning.fabric.strategies.model_parallel._load_checkpoint) sets
        # parameters and buffers only: state a module keeps otherwise (a torchmetrics metric with
        # persistent(True), e.g. the LanguageModel's best bpb) would be dropped on resume (seen in
        # Lightning 2.6.6). Here the whole state_dict is loaded, every rank reading the file
        # through the Trainer's CheckpointIO (weights_only, a damaged file named) and keeping its
        # own shard. Delete this override once Lightning loads the full state_dict.
        path = Path(self.broadcast(checkpoint_path))
        assert self.model is not None
        assert self.lightning_module is not None
        checkpoint = self.checkpoint_io.load_checkpoint(path, weights_only=weights_only)
        strict = self.lightning_module.strict_loading
        options = StateDictOptions(full_state_dict=True, strict=strict)
        set_model_state_dict(self.model, checkpoint.pop("state_dict"), options=options)
        if self.lightning_module.trainer.state.fn != TrainerFn.FITTING:
            return checkpoint
        states = checkpoint.get("optimizer_states", [])
        if len(states) != len(self.optimizers):
            raise RuntimeError(
                f"{path} holds {len(states)} optimizer states for {len(self.optimizers)}"
                " optimizers: resume with the optimizers it was trained with"
            )
        for optimizer, state in zip(self.optimizers, states, strict=True):
            # Saved keyed by parameter index, as a single-device run's (Lightning's
            # optimizer_state); set_optimizer_state_dict wants parameter names.
            by_name = FSDP1.rekey_optim_state_dict(state, OptimStateKeyType.PARAM_NAME, self.model)
            set_optimizer_state_dict(self.model, optimizer, by_name, options=options)
        return checkpoint


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    """The FSDP2 policy for a Lightning precision: bf16-mixed gathers bf16 weights and reduces
    float32 gradients (Lightning's autocast still runs around the step); a *-true precision has
    converted the module before sharding, and 32-true needs nothing."""
    if precision == "bf16-mixed":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard(
    module: nn.Module,
    wrap: Sequence[str],
    mesh: DeviceMesh,
    policy: MixedPrecisionPolicy,
    reshard_after_forward: bool,
) -> None:
    """fully_shard every layer of a class named in `wrap` (innermost first), then every top-level
    submodule that still holds unsharded parameters.

    The top-level submodules are the roots, not the LightningModule: Lightning calls
    `training_step` directly, not through `__call__`, so hooks on the LightningModule would not
    run; a submodule's do, when the step calls it (and when sampling calls `net.generate`).
    """
    loose = [name for name, _ in module.named_parameters(recurse=False)]
    if loose:
        raise ConfigError(
            f"trainer=fsdp shards a LightningModule's submodules, but {type(module).__name__}"
            f" holds parameter {loose[0]!r} itself: move it into a submodule (an nn.Module"
            " attribute), or use trainer=ddp"
        )
    options: dict[str, Any] = {
        "mesh": mesh,
        "mp_policy": policy,
        "reshard_after_forward": reshard_after_forward,
    }
    for layer in reversed(list(module.modules())):
        if _dotted(type(layer)) in wrap:
            fully_shard(layer, **options)
    for child in module.children():
        if any(not isinstance(p, DTensor) for p in child.parameters()):
            fully_shard(child, **options)


def _dotted(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
