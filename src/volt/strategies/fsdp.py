"""Fully sharded data parallel for any LightningModule: torch's FSDP2 (`fully_shard`) applied by
volt, ranks started from the run's resolved config as for volt's DDP (`volt.strategies.launcher`).

Each rank holds 1/N of every parameter, gradient and optimiser state; a layer's full weights exist
only while it runs (all-gathered before, freed after). The layers of the classes `wrap` names
(a transformer's block) are sharded in groups of consecutive ones of at least `min_group_params`
parameters (`shard` says why); every top-level submodule of the LightningModule is then sharded
as a whole over what is left in it (embeddings, final norm, head, blocks left over).

Why FSDP2 (Lightning's ModelParallelStrategy) and not Lightning's FSDPStrategy (FSDP1), on
Lightning 2.6 with torch 2.11 (GPU) and 2.14 (here):
- FSDP1 flattens parameters into 1-D shards before `configure_optimizers` runs, so a net that picks
  weight decay by `p.dim()` (volt's GPT) would decay nothing; FSDP2's parameters are DTensors
  that keep their shapes, so `param_groups`, `num_params` (MFU) and state_dict keys are as without
  sharding.
- Lightning's FSDP1 precision plugin refuses gradient clipping by norm (gpt_bytes clips at 1.0);
  under FSDP2 each rank clips its shards by the global norm (`clip_sharded_grad_norm_`), and
  torch's AdamW, Adam and SGD step on each rank's shards (`step_on_shards`).
- bf16-mixed: FSDP1 as Lightning sets it up reduces gradients in bf16; here they are gathered in
  bf16 and reduced in float32 (`MixedPrecisionPolicy`).
- Lightning builds FSDP1 only on CUDA; FSDP2 trains on the CPU over gloo, so it is tested with real
  processes anywhere. torch.compile works with FSDP2: a net sharded as one group compiles to one
  forward and one backward graph a step (FSDP2's hooks run in `_call_impl`, outside the compiled
  frame); once `wrap` layers are groups of their own, each carries hooks that break the net's
  frame, which then runs eagerly around one graph per layer (torchtitan compiles per block). FSDP1
  needs use_orig_params and breaks the graph at every wrapped unit. FSDP1 is in maintenance.
What it costs: ModelParallelStrategy is marked experimental, and it demands that the
LightningModule shard itself in `configure_model`. volt's contract is that any LightningModule
fits, so this strategy shards it (a module that does shard itself in `configure_model` is left as
it is). Precision 16-mixed (no sharded gradient scaler) and 64-true are refused by Lightning, and
by volt's config checks before anything starts.

Checkpoints (`trainer.strategy.checkpoint`; docs/checkpoints.md):
- sharded (the default, as torchtitan's): a folder `<name>.ckpt/` into which every rank writes
  its own shards of the weights and optimiser states at once, through torch.distributed.checkpoint
  (DCP), and rank 0 `meta.pt` (loops, callbacks, schedulers, hyperparameters, volt's config): no
  rank gathers the full state. Renamed into place once complete (`volt.checkpointing.sharded`).
  Any number of ranks resumes it, each reading only the saved parts its own shards overlap; eval
  and `load_trained_module` read it in one process, without a process group. Nothing in it runs
  code (`volt.checkpointing.dcp_reading`: torch's reader unpickles DCP's metadata as it is).
- full: one file, gathered on rank 0 (its host memory holds the whole state) and written through
  the Trainer's CheckpointIO (volt's AtomicCheckpointIO) in a single-device run's layout.
What is on disk decides how it is read: either resumes under either setting.
"""

import functools
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.optim.optimizer as torch_optimizer
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, OptimStateKeyType, fully_shard
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer
from typing_extensions import override

from volt.checkpointing import (
    begin_sharded_save,
    finish_sharded_save,
    is_sharded_checkpoint,
    read_sharded_into,
    remove_sharded_checkpoint,
    write_sharded,
)
from volt.errors import ConfigError
from volt.strategies.launcher import run_config_launcher

CHECKPOINTS = ("sharded", "full")


class FSDPStrategy(ModelParallelStrategy):
    """FSDP2 over every rank, sharding the LightningModule itself (see the module docstring).

    `wrap`: the classes (`module.QualName`, e.g. `volt.nets.gpt.Block`) whose instances are sharded
    in groups of consecutive layers, each of at least `min_group_params` parameters (0: one by
    one); they are matched by name, never imported. `reshard_after_forward`: free each
    layer's gathered weights after its forward (False keeps them for backward: less traffic,
    more memory). `checkpoint`: sharded (each rank writes its shards into one folder) or full
    (one file gathered on rank 0). `rank_config`, `trusted_targets`: as volt's DDPStrategy.
    """

    def __init__(
        self,
        rank_config: str | Path,
        trusted_targets: Sequence[str] = (),
        wrap: Sequence[str] = (),
        min_group_params: int = 100_000_000,
        reshard_after_forward: bool = True,
        checkpoint: str = "sharded",
        process_group_backend: str | None = None,
    ) -> None:
        if checkpoint not in CHECKPOINTS:
            raise ConfigError(
                f"trainer.strategy.checkpoint={checkpoint!r} is not valid: use sharded (each rank"
                " writes its own shards into one folder) or full (one file gathered on rank 0),"
                " e.g. trainer.strategy.checkpoint=full"
            )
        # One mesh dimension of every rank (set in setup_environment, once the world size is
        # known): FSDP alone, no tensor parallelism. Lightning's flag makes the state dicts it
        # collects for a save sharded (each rank's own) or full (gathered on rank 0).
        super().__init__(
            tensor_parallel_size=1,
            save_distributed_checkpoint=checkpoint == "sharded",
            process_group_backend=process_group_backend,
        )
        self.rank_config = Path(rank_config)
        self.trusted_targets = list(trusted_targets)
        if min_group_params < 0:
            raise ConfigError(
                f"trainer.strategy.min_group_params={min_group_params} is negative: use 0 to shard"
                " each layer of `wrap` on its own, or a parameter count, e.g. 100000000"
            )
        self.wrap = list(wrap)
        self.min_group_params = min_group_params
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
                self.min_group_params,
            )
        self.model_to_device()  # what no shard holds: metric states, buffers of unsharded parts
        self.barrier()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)  # after sharding: the optimiser holds the DTensors
        self.setup_precision_plugin()
        clip_on_shards(self.precision_plugin)
        for optimizer in self.optimizers:
            step_on_shards(optimizer)

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: _PATH, storage_options: Any | None = None
    ) -> None:
        if not self._save_distributed_checkpoint:
            super().save_checkpoint(checkpoint, filepath, storage_options)  # rank 0 writes all
            return
        if storage_options is not None:
            raise TypeError(
                f"a sharded checkpoint takes no storage_options, got {storage_options!r}; call"
                " Trainer.save_checkpoint without it"
            )
        # Every rank writes its shards into rank 0's temporary folder (made before its name
        # reaches the others, whose own argument is a placeholder), rank 0 renames it into place
        # once all have written.
        target = Path(self.broadcast(filepath))
        folder = self.broadcast(begin_sharded_save(target) if self.is_global_zero else target)
        write_sharded(checkpoint, folder, coordinator=self.is_global_zero)
        if self.is_global_zero:
            finish_sharded_save(folder, target)

    @override
    def remove_checkpoint(self, filepath: _PATH) -> None:
        """A sharded checkpoint (ModelCheckpoint's top-k turnover) is removed by rank 0, file by
        file and only inside a checkpoint callback's folder (`remove_sharded_checkpoint`); a
        file, or a link, goes to the CheckpointIO as before."""
        path = Path(filepath)
        if not path.is_dir() or path.is_symlink():
            super().remove_checkpoint(filepath)
        elif self.is_global_zero:
            assert self.lightning_module is not None
            callbacks = self.lightning_module.trainer.checkpoint_callbacks
            dirpaths = [getattr(callback, "dirpath", None) for callback in callbacks]
            remove_sharded_checkpoint(path, [Path(d) for d in dirpaths if d])

    @override
    def load_checkpoint(self, checkpoint_path: _PATH, weights_only: bool | None = None) -> Any:
        path = Path(self.broadcast(checkpoint_path))
        if is_sharded_checkpoint(path):
            return self._load_sharded(path)
        return self._load_full(path, weights_only)

    def _load_sharded(self, path: Path) -> dict[str, Any]:
        # Into the model's and optimisers' sharded state dicts (this rank's DTensors), read in
        # place by DCP from whichever saved shards overlap them, then set; as Lightning's own
        # loader does, with volt's checked reader.
        assert self.model is not None
        assert self.lightning_module is not None
        strict = self.lightning_module.strict_loading
        fitting = self.lightning_module.trainer.state.fn == TrainerFn.FITTING
        optimizers = self.optimizers if fitting else []
        state: dict[str, Any] = {"state_dict": get_model_state_dict(self.model)}
        for i, optimizer in enumerate(optimizers):
            state[f"optimizer_{i}"] = get_optimizer_state_dict(self.model, optimizer)
        rest = read_sharded_into(state, path, strict)
        options = StateDictOptions(strict=strict)
        set_model_state_dict(self.model, state["state_dict"], options=options)
        for i, optimizer in enumerate(optimizers):
            by_name = state[f"optimizer_{i}"]
            set_optimizer_state_dict(self.model, optimizer, by_name, options=options)
        return rest

    def _load_full(self, path: Path, weights_only: bool | None) -> dict[str, Any]:
        # Lightning's loader (lightning.fabric.strategies.model_parallel._load_checkpoint) sets
        # parameters and buffers only: state a module keeps otherwise (a torchmetrics metric with
        # persistent(True), e.g. the LanguageModel's best bpb) would be dropped on resume (seen in
        # Lightning 2.6.6). Here the whole state_dict is loaded, every rank reading the file
        # through the Trainer's CheckpointIO (weights_only, a damaged file named) and keeping its
        # own shard. Delete this method once Lightning loads the full state_dict.
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


def clip_on_shards(plugin: Precision) -> None:
    """Make `plugin` clip by norm with `clip_sharded_grad_norm_`, unless it clips its own way.

    The plugins ModelParallelStrategy takes (Precision, MixedPrecision, HalfPrecision in
    Lightning 2.6.6) clip with torch's clip_grad_norm_, and no strategy hook reaches clipping; a
    plugin of the user's (trainer.plugins) that overrides clip_grad_by_norm keeps it. build.py's
    `allow_clipping_fused_optimizers` patches the same plugin's clip_gradients, which calls this.
    Remove when torch's clip of DTensor gradients costs the host about what the shards' does
    (1,399 against 919 µs a step, torch 2.11), or Lightning lets a strategy clip."""
    if type(plugin).clip_grad_by_norm is Precision.clip_grad_by_norm:
        plugin.clip_grad_by_norm = functools.partial(_clip_by_norm_on_shards, plugin)  # type: ignore[method-assign]


def _clip_by_norm_on_shards(plugin: Precision, optimizer: Optimizer, clip_val: float) -> None:
    clip_sharded_grad_norm_(plugin.main_params(optimizer), clip_val)


@torch.no_grad()
def clip_sharded_grad_norm_(parameters: Iterable[Tensor], max_norm: float) -> Tensor:
    """torch's `clip_grad_norm_` (the 2-norm over all gradients) for gradients FSDP2 shards along
    one mesh dimension: the squared norms of this rank's shards, summed over the ranks in one
    all-reduce, scale the shards in place. Returns the total norm, the same on every rank (in
    float32 here, whatever the gradients' dtype: low-precision gradients' norms are taken in
    float32, where torch's rounds each to their dtype).

    torch's own function takes the same DTensors, but spends host time in DTensor's dispatch of
    each foreach op over every gradient: clipping the 85M GPT's 75 gradients took 1,399 µs of
    host time a step against 919 µs for a prototype of this (one H200's host, a world of one,
    torch 2.11, 2026-11-29), on a step that FSDP leaves bound by the host. Any other layout (a
    plain tensor, replicated or 2-D placements) goes to torch's function.
    """
    params = list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    sharded = [g for g in grads if isinstance(g, DTensor)]
    meshes = {g.device_mesh for g in sharded}
    on_shards = len(sharded) == len(grads) and len(meshes) == 1
    on_shards &= all(g.device_mesh.ndim == 1 and g.placements[0].is_shard() for g in sharded)
    if not on_shards:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    (mesh,) = meshes
    local = [g.to_local() for g in sharded]  # the shards themselves: autograd is off here
    by_kind: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    for g in local:
        by_kind.setdefault((g.device, g.dtype), []).append(g)
    squares = [
        torch.stack(torch._foreach_norm(kind, 2.0, dtype=torch.float32)).square().sum()
        for kind in by_kind.values()
    ]
    total = torch.stack([s.to(mesh.device_type) for s in squares]).sum()
    torch.distributed.all_reduce(total, group=mesh.get_group())  # shards are disjoint: a sum
    total = total.sqrt()
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for (device, _), kind in by_kind.items():
        torch._foreach_mul_(kind, coef.to(device))
    return total


# Optimisers whose step is elementwise over each parameter, calls its closure once before
# anything else, and keeps only parameter-shaped tensors and scalars as state: stepping them on
# each rank's shards is stepping them on the DTensors.
ELEMENTWISE_OPTIMIZERS = (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD)


def step_on_shards(optimizer: Optimizer) -> None:
    """Make `optimizer.step` run on each DTensor parameter's local shard (see `_step_locally`),
    for torch's AdamW, Adam and SGD (not subclasses); any other optimiser is left as it is.

    torch's optimisers take FSDP2's DTensor parameters, but every foreach or fused op over them
    goes through DTensor's dispatch in Python (pytorch/pytorch#134191, open): the 85M GPT's fused
    AdamW step took 2,738 µs of host time on an H200's host against 466 µs on the shards, swaps
    included (torch 2.11, a world of one, 2026-11-29), on a step that FSDP leaves bound by the
    host. Outside the step nothing changes: the parameter groups and the state hold the
    DTensors, so sharded checkpoints, LR schedulers and anything reading the state see what they
    would without it. An optimiser with step hooks (its own or torch's global ones) steps on the
    DTensors as torch runs it, hooks before the closure: a hook sees what it would without volt.
    Remove once DTensor's dispatch of foreach and fused ops costs the host about what plain
    tensors' does.
    """
    if type(optimizer) not in ELEMENTWISE_OPTIMIZERS or hasattr(optimizer.step, "on_shards"):
        return  # (a test after a fit sets the same optimisers up again)
    # The step this one runs: the class's, or an LR scheduler's wrapper of it (which holds the
    # optimiser weakly). The class's is called on a weak reference, as the scheduler calls it: a
    # bound method kept on the optimiser would hold the optimiser itself, freed only by Python's
    # cyclic collector.
    bound_or_wrapper = optimizer.step
    inner_function = getattr(bound_or_wrapper, "__func__", None)
    wrapper = None if inner_function else bound_or_wrapper
    del bound_or_wrapper
    owner = weakref.ref(optimizer)

    def step(closure: Any = None, **kwargs: Any) -> Any:
        opt = owner()
        assert opt is not None, "the optimizer was freed"
        opt._opt_called = True  # type: ignore[attr-defined]  # what an LR scheduler checks
        run = functools.partial(inner_function, opt) if inner_function else wrapper
        assert run is not None
        if _has_step_hooks(opt):
            return run(closure=closure, **kwargs)
        # These optimisers' own step calls the closure (Lightning's forward and backward, with
        # clipping and on_before_optimizer_step) first, with gradients enabled, then steps.
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        _step_locally(opt, functools.partial(run, **kwargs))
        return loss

    step.on_shards = True  # type: ignore[attr-defined]
    # An LR scheduler wraps a step without this mark to record in `_opt_called` that it ran (set
    # above), and warns at its first step if the mark is gone ("optimizer.step() has been
    # overridden"), as it would be on one it had wrapped before.
    step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    optimizer.step = step  # type: ignore[method-assign]


def _has_step_hooks(optimizer: Optimizer) -> bool:
    """Whether step hooks would run around `optimizer.step`: its own, or torch's global ones
    (torch.optim.optimizer's registries, as in torch 2.11 and 2.14)."""
    registries = (
        getattr(optimizer, "_optimizer_step_pre_hooks", None),
        getattr(optimizer, "_optimizer_step_post_hooks", None),
        getattr(torch_optimizer, "_global_optimizer_pre_hooks", None),
        getattr(torch_optimizer, "_global_optimizer_post_hooks", None),
    )
    return any(registries)


@torch.no_grad()
def _step_locally(optimizer: Optimizer, step: Callable[[], Any]) -> None:
    """Run `step` with each DTensor parameter of `optimizer` (and its gradient and state) replaced
    by its local tensor, then put the DTensors back. The local tensors are the DTensors' own
    storage (to_local without autograd: the local tensor itself in torch 2.11, a view of it in
    2.14), so the step updates them in place, and no gradient is left on them; state the step makes
    (on its first call) is wrapped as DTensors laid out as their parameter. A Partial placement,
    a gradient laid out unlike its parameter, a 0-d parameter, or a differentiable group takes
    the step as is."""
    groups = optimizer.param_groups
    sharded = [p for group in groups for p in group["params"] if isinstance(p, DTensor)]
    as_is = not sharded or any(group.get("differentiable") for group in groups)
    for p in sharded:
        as_is = as_is or p.dim() == 0 or any(place.is_partial() for place in p.placements)
        grad = p.grad
        laid_out_alike = isinstance(grad, DTensor) and grad.placements == p.placements
        as_is = as_is or (grad is not None and not laid_out_alike)
    if as_is:
        step()
        return
    state = optimizer.state
    originals = [group["params"] for group in groups]
    swapped: list[tuple[DTensor, Tensor, dict[str, Any], dict[str, Any]]] = []
    try:
        for group in groups:
            on_shards = []
            for p in group["params"]:
                if not isinstance(p, DTensor):
                    on_shards.append(p)
                    continue
                local = p.to_local()
                grad = p.grad  # a DTensor laid out as p, or None (checked above)
                local.grad = grad.to_local() if isinstance(grad, DTensor) else None
                saved = state.pop(p, {})
                lent = {k: v.to_local() if isinstance(v, DTensor) else v for k, v in saved.items()}
                if lent:
                    state[local] = lent
                swapped.append((p, local, saved, lent))
                on_shards.append(local)
            group["params"] = on_shards
        step()
    finally:
        for group, original in zip(groups, originals, strict=True):
            group["params"] = original
        for p, local, saved, lent in swapped:
            local.grad = None
            stepped = state.pop(local, {})
            back = {
                k: saved[k] if k in lent and v is lent[k] else _as_state_of(p, local, v)
                for k, v in stepped.items()
            }
            if back or saved:
                state[p] = back or saved


def _as_state_of(param: DTensor, local: Tensor, value: Any) -> Any:
    """A state entry the step made on `local`: a parameter-shaped tensor as a DTensor laid out as
    `param`, anything else (a step count) as it is."""
    if isinstance(value, Tensor) and value.shape == local.shape and value.device == local.device:
        return DTensor.from_local(
            value,
            param.device_mesh,
            param.placements,
            run_check=False,
            shape=param.shape,
            stride=param.stride(),
        )
    return value


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
    min_group_params: int,
) -> None:
    """fully_shard the layers of the classes named in `wrap` a group at a time, then every
    top-level submodule over the parameters still unsharded in it.

    A group is a run of consecutive such layers (outermost ones, in the order the module
    registers them: a net's forward order) in one top-level submodule, closed once it holds
    `min_group_params` parameters; layers that add up to less at the end of a submodule are left
    to that submodule's own group. FSDP2 costs host time per group and pass (about 1 ms of CPU
    before each block's forward and as much in backward on an H200's host, 2026-11-28), while a
    group's GPU work grows with its size: the 85M GPT of gpt_bytes, each of its 12 blocks sharded
    alone, trained at 0.42x a plain DDP loop on 2 H200s, as one group 0.86x. 100M (the default)
    is the threshold of torch's FSDP1 size-based wrapping policy: every block of the 1.2B
    gpt_1b pairs with the next, the 85M GPT is one group. 0 shards each layer on its own.

    A layer of a `wrap` class inside another one (an MLP named beside its block) is sharded on
    its own first, inside its outer layer's group (and kept gathered with it).

    The last group that holds a trainable parameter (a net's last blocks) keeps its gathered
    weights after its forward whatever `reshard_after_forward` says: backward starts with it, so
    freeing them would only gather them again at once (torchtitan does the same). A top-level
    submodule with no trainable weight (a frozen distillation teacher) frees its weights after
    every forward, whatever `reshard_after_forward` says: no backward runs through it to free
    them, and they would stay whole, unlike the student's shards that a momentum update mixes
    them with. A network whose weights still require gradients but that runs only under
    `torch.no_grad()` must be frozen (`requires_grad_(False)`) for that.

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
    children = list(module.children())
    found = [_wrapped(child, wrap) for child in children]
    # A child with no trainable weight (a frozen teacher) has no backward to free what its
    # forward gathered: each of its units frees its weights after forward whatever
    # `reshard_after_forward` says.
    trained = [any(p.requires_grad for p in child.parameters()) for child in children]

    def frees(child_trained: bool) -> dict[str, Any]:
        return {**options, "reshard_after_forward": reshard_after_forward or not child_trained}

    # A layer inside another wrap layer is sharded alone (before the groups: FSDP shards
    # children before parents), once: one reached through an alias as a child's outer layer is
    # still inside another.
    inner: dict[int, tuple[nn.Module, bool]] = {}
    for (_, layers), child_trained in zip(found, trained, strict=True):
        for layer in layers:
            inner.setdefault(id(layer), (layer, child_trained))
    groups: list[tuple[list[nn.Module], bool]] = []
    seen = set(inner)  # a layer reachable from two children (an alias) is sharded once
    for child, (outer, _), child_trained in zip(children, found, trained, strict=True):
        layers = [layer for layer in outer if id(layer) not in seen]
        seen.update(id(layer) for layer in layers)
        # A container that is never called itself (a ModuleList) can neither take a rest nor be
        # the root above groups: its layers are sharded one by one, as before grouping.
        runs = _groups(layers, min_group_params if _has_forward(child) else 0)
        groups += [(run, child_trained) for run in runs]
    learning = [g for g, _ in groups if any(p.requires_grad for m in g for p in m.parameters())]
    kept = learning[-1] if learning else []
    in_kept = {id(sub) for layer in kept for sub in layer.modules()}
    keep = {"reshard_after_forward": False}
    # the innermost first: a layer holds fewer modules than any layer around it
    for layer, child_trained in sorted(inner.values(), key=lambda i: len(list(i[0].modules()))):
        fully_shard(layer, **frees(child_trained) | (keep if id(layer) in in_kept else {}))
    for group, child_trained in reversed(groups):
        unit = frees(child_trained) | (keep if group is kept else {})
        fully_shard(group if len(group) > 1 else group[0], **unit)
    for child, child_trained in zip(children, trained, strict=True):
        grouped = any(isinstance(m, FSDPModule) for m in child.modules())
        unsharded = any(not isinstance(p, DTensor) for p in child.parameters())
        # A child whose layers were grouped is sharded too, parameters of its own or not: FSDP
        # needs one root above the groups it runs.
        if not isinstance(child, FSDPModule) and (unsharded or (grouped and _has_forward(child))):
            fully_shard(child, **frees(child_trained))


def _has_forward(module: nn.Module) -> bool:
    """False for containers that are never called (ModuleList, ModuleDict)."""
    return type(module).forward is not nn.Module.forward


def _wrapped(module: nn.Module, wrap: Sequence[str]) -> tuple[list[nn.Module], list[nn.Module]]:
    """The layers in `module` of a class named in `wrap`: those not inside another such layer,
    and those inside one."""
    layers = [layer for layer in module.modules() if _dotted(type(layer)) in wrap]
    inside = {id(sub) for layer in layers for sub in layer.modules() if sub is not layer}
    return [m for m in layers if id(m) not in inside], [m for m in layers if id(m) in inside]


def _groups(layers: list[nn.Module], min_params: int) -> list[list[nn.Module]]:
    """`layers` cut into runs of at least `min_params` parameters (one tied to another layer's
    counted once); a shorter rest is dropped."""
    groups: list[list[nn.Module]] = []
    run: list[nn.Module] = []
    count, counted = 0, set[int]()
    for layer in layers:
        run.append(layer)
        fresh = [p for p in layer.parameters() if id(p) not in counted]
        counted.update(id(p) for p in fresh)
        count += sum(p.numel() for p in fresh)
        if count >= min_params:
            groups.append(run)
            run, count = [], 0
    return groups


def _dotted(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
