"""Using a GPU well, each in one place: TF32 matmuls, torch.compile, and what to do after an OOM."""

import torch
from torch import nn


def has_tensor_cores_for_tf32() -> bool:
    """Ampere (sm_80) and newer run float32 matmuls on TF32 tensor cores when allowed."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8


def apply_matmul_precision(precision: str | None) -> str:
    """Set torch's float32 matmul precision; None picks `high` (TF32) where tensor cores have it.

    `high` keeps float32 storage but multiplies with a 10-bit mantissa: about 1e-3 relative
    error per product, several times the throughput. Returns the setting in force.
    """
    if precision is None:
        precision = "high" if has_tensor_cores_for_tf32() else torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    return precision


def apply_compile(
    net: nn.Module, mode: str | None, fullgraph: bool = False, dynamic: bool | None = None
) -> None:
    """Compile `net` in place (mode None: leave it eager).

    nn.Module.compile() swaps the module's call for a compiled one without wrapping it, so
    state_dict keys stay free of `_orig_mod.` and checkpoints load with or without compile.
    """
    if mode is None:
        return
    net.compile(mode=mode, fullgraph=fullgraph, dynamic=dynamic)


def explain_oom(batch_size: int | None, device: torch.device) -> str:
    """One paragraph for a CUDA out-of-memory during training: the numbers and what to change
    (`batch_size`: the data module's, when it has one)."""
    gib = 1024**3
    peak = torch.cuda.max_memory_allocated(device) / gib
    total = torch.cuda.get_device_properties(device).total_memory / gib
    smaller = f"data.batch_size={max(1, batch_size // 2)}" if batch_size else "a smaller one"
    return (
        f"CUDA out of memory on {device} with data.batch_size={batch_size}: peak {peak:.1f} GiB "
        f"allocated of {total:.1f} GiB. Try a smaller batch ({smaller}), "
        "mixed precision (precision=bf16-mixed or 16-mixed), or let volt find the largest batch "
        "that fits (tune=batch_size)."
    )
