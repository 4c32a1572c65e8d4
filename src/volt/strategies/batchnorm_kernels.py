"""The arithmetic of volt's SyncBatchNorm, per device: torch's fused CUDA kernels, or the same
in plain tensor operations on the CPU (which has no such kernels). Both offer the same static
methods, called by `volt.strategies.sync_batchnorm` around its collectives; shapes: input
(N, C, ...), statistics (C,), gathered statistics (W, C) for W ranks, counts (W,).
"""

import torch
from torch import Tensor


class CUDAKernels:
    """torch's fused BatchNorm kernels (CUDA only)."""

    @staticmethod
    def stats(input: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        return torch.batch_norm_stats(input, eps)

    @staticmethod
    def merge_stats(
        input: Tensor,
        means: Tensor,
        invstds: Tensor,
        counts: Tensor,
        running_mean: Tensor | None,
        running_var: Tensor | None,
        momentum: float,
        eps: float,
    ) -> tuple[Tensor, Tensor]:
        # One kernel: the global mean and inverse std, and the running statistics updated. It
        # works in the dtype of the running statistics, or of its first argument without them,
        # and reads the counts in that dtype: merge in the gathered statistics' dtype (float32,
        # float64 for float64 inputs), where counts are exact and cannot overflow as in float16.
        # The counts were gathered with the statistics, so they are in that dtype already.
        dtype = means.dtype
        # The kernel merges rank after rank, dividing by the count so far: 0/0 if the first ranks
        # had empty batches. A tiny count weighs such a rank out just as well as 0 does.
        counts = counts.clamp_min(1e-30)
        if running_mean is None or running_var is None or running_mean.dtype == dtype:
            return torch.batch_norm_gather_stats_with_counts(
                means, means, invstds, running_mean, running_var, momentum, eps, counts
            )
        merged_mean, merged_var = running_mean.to(dtype), running_var.to(dtype)
        mean, invstd = torch.batch_norm_gather_stats_with_counts(
            means, means, invstds, merged_mean, merged_var, momentum, eps, counts
        )
        running_mean.copy_(merged_mean)
        running_var.copy_(merged_var)
        return mean, invstd

    @staticmethod
    def normalize(
        input: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        mean: Tensor,
        invstd: Tensor,
        eps: float,
    ) -> Tensor:
        return torch.batch_norm_elemt(input, weight, bias, mean, invstd, eps)

    @staticmethod
    def backward_reduce(
        grad_output: Tensor,
        input: Tensor,
        mean: Tensor,
        invstd: Tensor,
        weight: Tensor | None,
        needs_input: bool,
        needs_weight: bool,
        needs_bias: bool,
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        sum_dy, sum_dy_xmu, grad_weight, grad_bias = torch.batch_norm_backward_reduce(
            grad_output, input, mean, invstd, weight, needs_input, needs_weight, needs_bias
        )
        return sum_dy, sum_dy_xmu, grad_weight, grad_bias

    @staticmethod
    def backward_input(
        grad_output: Tensor,
        input: Tensor,
        mean: Tensor,
        invstd: Tensor,
        weight: Tensor | None,
        sum_dy: Tensor,
        sum_dy_xmu: Tensor,
        counts: Tensor,
    ) -> Tensor:
        if weight is not None and weight.dtype != mean.dtype:
            weight = weight.to(mean.dtype)
        return torch.batch_norm_backward_elemt(
            grad_output, input, mean, invstd, weight, sum_dy, sum_dy_xmu, counts
        )


class CPUKernels:
    """The same arithmetic as `CUDAKernels` in plain operations (gloo DDP, tests), in float32, or
    float64 for float64 inputs, as the CUDA kernels."""

    @staticmethod
    def stats(input: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        var, mean = torch.var_mean(_wide(input), dim=_reduced_dims(input), correction=0)
        return mean, torch.rsqrt(var + eps)

    @staticmethod
    def merge_stats(
        input: Tensor,
        means: Tensor,
        invstds: Tensor,
        counts: Tensor,
        running_mean: Tensor | None,
        running_var: Tensor | None,
        momentum: float,
        eps: float,
    ) -> tuple[Tensor, Tensor]:
        # Groups of sizes n_r: N = sum n_r, mean = sum n_r mean_r / N and
        # var = sum n_r (var_r + (mean_r - mean)^2) / N, with no difference of large squares.
        variances = invstds.pow(-2) - eps  # (W, C)
        total = counts.sum()
        weights = (counts / total).unsqueeze(1)  # (W, 1)
        mean = (weights * means).sum(0)
        var = (weights * (variances + (means - mean) ** 2)).sum(0)
        if running_mean is not None and running_var is not None:
            unbiased = var * (total / (total - 1))
            running_mean.lerp_(mean.to(running_mean.dtype), momentum)
            running_var.lerp_(unbiased.to(running_var.dtype), momentum)
        return mean, torch.rsqrt(var + eps)

    @staticmethod
    def normalize(
        input: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        mean: Tensor,
        invstd: Tensor,
        eps: float,
    ) -> Tensor:
        scale = invstd if weight is None else invstd * weight.to(invstd.dtype)
        shift = -mean * scale if bias is None else bias.to(mean.dtype) - mean * scale
        output = _wide(input) * _per_channel(scale, input) + _per_channel(shift, input)
        return output.to(input.dtype)

    @staticmethod
    def backward_reduce(
        grad_output: Tensor,
        input: Tensor,
        mean: Tensor,
        invstd: Tensor,
        weight: Tensor | None,
        needs_input: bool,
        needs_weight: bool,
        needs_bias: bool,
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        dims = _reduced_dims(input)
        grad = _wide(grad_output)
        centred = _wide(input) - _per_channel(mean, input)
        sum_dy = grad.sum(dims)
        sum_dy_xmu = (grad * centred).sum(dims)
        grad_weight = (sum_dy_xmu * invstd) if needs_weight else None
        grad_bias = sum_dy if needs_bias else None
        if weight is not None:
            grad_weight = None if grad_weight is None else grad_weight.to(weight.dtype)
            grad_bias = None if grad_bias is None else grad_bias.to(weight.dtype)
        return sum_dy, sum_dy_xmu, grad_weight, grad_bias

    @staticmethod
    def backward_input(
        grad_output: Tensor,
        input: Tensor,
        mean: Tensor,
        invstd: Tensor,
        weight: Tensor | None,
        sum_dy: Tensor,
        sum_dy_xmu: Tensor,
        counts: Tensor,
    ) -> Tensor:
        # d input = w invstd (dy - mean(dy) - (x - mean) invstd^2 mean(dy (x - mean))),
        # the means taken over the global batch of sum(counts) values per channel.
        total = counts.sum().to(mean.dtype)
        scale = invstd if weight is None else invstd * weight.to(invstd.dtype)
        centred = _wide(input) - _per_channel(mean, input)
        grad = (
            _wide(grad_output)
            - _per_channel(sum_dy / total, input)
            - centred * _per_channel(invstd**2 * sum_dy_xmu / total, input)
        )
        return (grad * _per_channel(scale, input)).to(input.dtype)


def _wide(tensor: Tensor) -> Tensor:
    # The dtype the statistics are computed in: float32, or float64 for float64 tensors.
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


def _per_channel(tensor: Tensor, input: Tensor) -> Tensor:
    # (C,) -> (1, C, 1, ...) to broadcast against (N, C, ...)
    return tensor.view(1, -1, *([1] * (input.dim() - 2)))


def _reduced_dims(input: Tensor) -> list[int]:
    return [0, *range(2, input.dim())]
