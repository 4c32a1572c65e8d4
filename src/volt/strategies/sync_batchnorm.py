"""BatchNorm over the global batch of a DDP run, without waiting on the GPU from the host.

torch's `nn.SyncBatchNorm` drops the statistics of ranks whose batch is empty with a boolean mask
whose size depends on values on the GPU, so every BatchNorm layer makes the host wait for the
GPU. A ResNet has one such layer per convolution: on 2 x H200 a plain PyTorch DDP
loop with it ran at 9.0k samples/s, without it at 20.7k (CIFAR-sized ResNet, bf16, 128 per GPU).
Here an empty rank's statistics go into the merge with a count of (almost) 0, where they weigh
nothing, so nothing needs to leave the GPU; at 256 per GPU the same loop ran at 19.7k with
torch's layer and 30.3k with this one (48.3k without synchronised BatchNorm).

The result is the BatchNorm of the whole global batch, as with `nn.SyncBatchNorm`: the same
normalisation, running statistics and input gradients. Weight and bias gradients are each rank's
share of the global batch's, which DDP's all-reduce adds up (and averages, as for every other
parameter). On CUDA it uses the fused kernels torch's own SyncBatchNorm uses; on the CPU (DDP
over gloo) the same arithmetic in plain tensor operations, so it also runs, and is tested,
without a GPU.

Its collectives are torch's functional ones, so `torch.compile` traces the layer whole (forward
and backward, no graph break) and `compile=reduce-overhead` captures them in its CUDA graphs.
`dist.all_gather_into_tensor` into a (ranks, K) buffer, as eager code writes it, made dynamo fail
on torch 2.11 (pytorch/pytorch#155632, fixed by PR #177205).

Why a replacement: torch's host wait comes from the empty-rank filter added for
pytorch/pytorch#36530 (PR #74944, `count_all[mask]` in `torch/nn/modules/_functions.py`), seen on
torch 2.4 to 2.14; the general host-blocking of that layer is pytorch/pytorch#36452, and the
capture problem it causes for CUDA graphs is pytorch/pytorch#78656. Delete this module, and let
`sync_batchnorm=true` use `nn.SyncBatchNorm` again, once torch's layer merges ranks without a
value-dependent index (check: `torch.cuda.set_sync_debug_mode("error")` around a DDP forward
with `nn.SyncBatchNorm` raises nothing).
"""

import datetime
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from lightning.pytorch.plugins import LayerSync
from torch import Tensor, nn
from torch.autograd.function import FunctionCtx
from torch.nn.modules.batchnorm import _BatchNorm
from typing_extensions import override

from volt.strategies.batchnorm_kernels import CPUKernels, CUDAKernels


class BatchNormNd(_BatchNorm):
    """BatchNorm for inputs (N, C, ...) of any number of dimensions, what a layer of unknown
    origin reverts to."""

    @override
    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(
                f"expected an input of at least 2 dimensions (N, C, ...), got {input.dim()}"
            )


class SyncBatchNorm(BatchNormNd):
    """BatchNorm over the global batch whose training forward never makes the host wait.

    Outside training, or when no process group of more than one rank exists, it is plain BatchNorm
    over the local batch, as `nn.SyncBatchNorm` is. Build it from a model with `convert_batchnorm`.
    It does not derive from `nn.SyncBatchNorm`: DDP refuses that class on the CPU. A process group
    cannot be pickled, so a copy of the layer (`copy.deepcopy`, `pickle`) syncs over the default
    group (`process_group=None`).
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: dist.ProcessGroup | None = None,
        reverts_to: type[_BatchNorm] | None = None,
        device: torch.device | None = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device)
        self.process_group = process_group
        self.reverts_to = reverts_to or BatchNormNd  # the class it replaced, for `revert_batchnorm`

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["process_group"] = None
        return state

    @override
    def forward(self, input: Tensor) -> Tensor:
        group = self.process_group or dist.group.WORLD
        synced = (
            self.training
            and dist.is_available()
            and dist.is_initialized()
            and dist.get_world_size(group) > 1
        )
        if not synced:
            return super().forward(input)

        self._check_input_dim(input)
        running_mean = running_var = None
        momentum = 0.0
        if self.track_running_stats:
            assert self.num_batches_tracked is not None
            self.num_batches_tracked.add_(1)
            running_mean, running_var = self.running_mean, self.running_var
            if self.momentum is not None:
                momentum = self.momentum
            else:
                # The cumulative average, as in BatchNorm; reading the count waits for the GPU
                # (the merge kernel takes a number), so prefer a momentum.
                momentum = 1.0 / self.num_batches_tracked.item()
        return _GlobalBatchNorm.apply(
            input, self.weight, self.bias, running_mean, running_var, momentum, self.eps, group
        )


def convert_batchnorm(
    module: nn.Module, process_group: dist.ProcessGroup | None = None
) -> nn.Module:
    """`module` with every BatchNorm layer replaced by volt's `SyncBatchNorm`, sharing its tensors.

    Layers that are torch's `nn.SyncBatchNorm` are replaced too (reverting to `BatchNormNd`: which
    BatchNorm class they came from is not recorded).
    """
    converted = module
    if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
        original = BatchNormNd if isinstance(module, nn.SyncBatchNorm) else type(module)
        converted = SyncBatchNorm(
            module.num_features,
            module.eps,
            module.momentum,
            module.affine,
            module.track_running_stats,
            process_group,
            reverts_to=original,
            device=_device_of(module),
        )
        _share_tensors(module, converted)
    for name, child in module.named_children():
        converted.add_module(name, convert_batchnorm(child, process_group))
    return converted


def revert_batchnorm(module: nn.Module) -> nn.Module:
    """`module` with volt's `SyncBatchNorm` layers turned back into the classes they replaced."""
    converted = module
    if isinstance(module, SyncBatchNorm):
        converted = module.reverts_to(
            module.num_features,
            module.eps,
            module.momentum,
            module.affine,
            module.track_running_stats,
            device=_device_of(module),
        )
        _share_tensors(module, converted)
    for name, child in module.named_children():
        converted.add_module(name, revert_batchnorm(child))
    return converted


def _share_tensors(source: _BatchNorm, target: _BatchNorm) -> None:
    if source.affine:
        target.weight = source.weight
        target.bias = source.bias
    target.running_mean = source.running_mean
    target.running_var = source.running_var
    target.num_batches_tracked = source.num_batches_tracked
    target.train(source.training)


def _device_of(module: nn.Module) -> torch.device | None:
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return None


class SyncBatchNormLayers(LayerSync):
    """Lightning's `sync_batchnorm=True`, done with volt's `SyncBatchNorm`.

    The layers talk over a process group of their own (all ranks): on the default group their
    collectives would queue behind DDP's gradient all-reduces, and backward would wait for those
    at every BatchNorm layer (on 2 x H200, a plain DDP loop: 27.2k samples/s on the default
    group, 30.3k on its own). The group is made once per fit, with the strategy's `timeout`, and
    let go of when the fit ends: a group kept alive keeps the run's rendezvous store alive, and
    the next job of a sweep in the same process, given the same port (`MASTER_PORT`), would
    rendezvous on the old one. Checkpoints hold the same keys as without it: the layers keep
    their parameters and buffers.
    """

    def __init__(self, timeout: datetime.timedelta | None = None) -> None:
        self.timeout = timeout
        self._group: dist.ProcessGroup | None = None
        self._synced = False  # layers made that talk to other ranks

    @override
    def apply(self, model: nn.Module) -> nn.Module:
        # Lightning calls this on every rank after the process group is up, as new_group needs.
        if not (dist.is_available() and dist.is_initialized()):
            return convert_batchnorm(model)
        if self._group is None:
            group = dist.new_group(timeout=self.timeout)
            assert isinstance(group, dist.ProcessGroup)  # every rank is a member
            self._group = group
        converted = convert_batchnorm(model, self._group)
        self._synced = dist.get_world_size(self._group) > 1 and any(
            isinstance(module, SyncBatchNorm) for module in converted.modules()
        )
        return converted

    @override
    def revert(self, model: nn.Module) -> nn.Module:
        # Lightning calls this when the fit ends, also on an error.
        if self._synced:
            _forget_compiled_code()
        self._synced = False
        self._group = None
        return revert_batchnorm(model)


def _forget_compiled_code() -> None:
    """After a fit whose layers talked to other ranks: torch.compile's code and CUDA graphs go.

    Under `compile=reduce-overhead` the layers' collectives are captured in CUDA graphs, and
    destroying a process group whose collectives a live CUDA graph holds hangs in ncclCommDestroy
    (pytorch/pytorch#115388, open; seen on torch 2.11 with 2 x H200); volt destroys its groups when
    a run ends. Freeing the graphs alone would leave compiled code bound to them, which fails when
    called again ("Running CUDAGraph after shutdown": a test after the fit, the next job of a sweep
    in this process), so the compiled code is dropped with them and compiled again when next run
    (the reverted layers would be anyway). Drop this once that issue is fixed.
    """
    if "torch._inductor.cudagraph_trees" in sys.modules:  # only a run with CUDA graphs has them
        torch.compiler.reset()


class _GlobalBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: FunctionCtx,
        input: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        running_mean: Tensor | None,
        running_var: Tensor | None,
        momentum: float,
        eps: float,
        group: dist.ProcessGroup,
    ) -> Tensor:
        input = _dense(input)
        kernels = CUDAKernels if input.is_cuda else CPUKernels
        channels = input.shape[1]
        count = input.numel() // channels
        # float32 statistics (the kernels' accumulation type), float64 for float64 inputs
        dtype = torch.promote_types(input.dtype, torch.float32)
        if count > 0:
            mean, invstd = kernels.stats(input, eps)
        else:
            # An empty batch on this rank: any finite statistics do, its count of 0 weighs them out.
            mean = input.new_zeros(channels, dtype=dtype)
            invstd = torch.ones_like(mean)
        # (2C + 1,) -> (W, 2C + 1): every rank's mean, inverse standard deviation and count.
        local = torch.cat([mean.to(dtype), invstd.to(dtype), mean.new_full((1,), float(count))])
        means, invstds, counts = _all_gather(local, group).split([channels, channels, 1], dim=1)
        counts = counts.flatten()
        mean, invstd = kernels.merge_stats(
            input, means, invstds, counts, running_mean, running_var, momentum, eps
        )

        ctx.save_for_backward(
            input,
            weight,  # type: ignore[arg-type]  # None is saved as None
            mean,
            invstd,
            counts.to(torch.int32),
        )
        ctx.group = group  # type: ignore[attr-defined]
        if count == 0:
            return torch.empty_like(input)
        return kernels.normalize(input, weight, bias, mean, invstd, eps)

    @staticmethod
    def backward(ctx: FunctionCtx, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        grad_output = _dense(grad_output)
        input, weight, mean, invstd, counts = ctx.saved_tensors  # type: ignore[attr-defined]
        needs_input, needs_weight, needs_bias = ctx.needs_input_grad[:3]  # type: ignore[attr-defined]
        kernels = CUDAKernels if input.is_cuda else CPUKernels
        channels = input.shape[1]
        grad_input = grad_weight = grad_bias = None

        if input.numel() > 0:
            sum_dy, sum_dy_xmu, grad_weight, grad_bias = kernels.backward_reduce(
                grad_output, input, mean, invstd, weight, needs_input, needs_weight, needs_bias
            )
        else:
            sum_dy = sum_dy_xmu = mean.new_zeros(channels)
        if needs_input:
            # The input gradient needs the sums over the global batch. Weight and bias gradients
            # stay local: DDP averages them with the other parameters'.
            group = ctx.group  # type: ignore[attr-defined]
            sums = _waited(funcol.all_reduce(torch.cat([sum_dy, sum_dy_xmu]), "sum", group))
            sum_dy, sum_dy_xmu = sums.split(channels)
            if input.numel() > 0:
                grad_input = kernels.backward_input(
                    grad_output, input, mean, invstd, weight, sum_dy, sum_dy_xmu, counts
                )
        if weight is None or not needs_weight:
            grad_weight = None
        if weight is None or not needs_bias:
            grad_bias = None
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


def _dense(tensor: Tensor) -> Tensor:
    # The fused kernels take contiguous or channels-last tensors; keep channels-last as it is.
    if tensor.is_contiguous(memory_format=torch.channels_last) or tensor.is_contiguous(
        memory_format=torch.channels_last_3d
    ):
        return tensor
    return tensor.contiguous()


# torch 2.14 deprecates all_gather_tensor (it warns) for all_gather_single, a name older torch
# lacks. Use all_gather_single alone once volt requires a torch that has it.
_gather_along_first = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor


def _all_gather(local: Tensor, group: dist.ProcessGroup) -> Tensor:
    """(K,) on each rank -> (W, K), rows in rank order."""
    gathered = _waited(_gather_along_first(local, 0, group))  # (W * K,)
    return gathered.view(dist.get_world_size(group), local.numel())


def _waited(tensor: Tensor) -> Tensor:
    """A functional collective's result as a plain tensor: the GPU's stream waits for it, the host
    does not. (Eager mode hands it back as an AsyncCollectiveTensor, whose every later op, views
    too, would go through Python; under torch.compile it is plain already.)"""
    return tensor.wait() if isinstance(tensor, funcol.AsyncCollectiveTensor) else tensor
