"""Using a GPU well, each in one place: TF32 matmuls, torch.compile, float8 matmuls (torchao),
and what to do after an OOM."""

import importlib.util

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


def explain_oom(
    batch_size: int | None,
    device: torch.device,
    processes: int = 1,
    sharded: bool = False,
    checkpointing_key: str | None = None,
) -> str:
    """One paragraph for a CUDA out-of-memory during training: the numbers and what to change.

    `batch_size`: the data module's (per GPU under DDP and FSDP); `processes`: the run's ranks;
    `sharded`: the weights are already sharded (trainer=fsdp); `checkpointing_key`: the setting
    that turns activation checkpointing on for this model, where it has one."""
    gib = 1024**3
    try:
        peak = torch.cuda.max_memory_allocated(device) / gib
        total = torch.cuda.get_device_properties(device).total_memory / gib
        used = f"peak {peak:.1f} GiB allocated of {total:.1f} GiB"
    except (ValueError, RuntimeError, AssertionError):  # not a CUDA device, no CUDA build
        used = f"no CUDA memory figures for {device}"
    half = f"data.batch_size={max(1, batch_size // 2)}" if batch_size else "a smaller one"
    if processes == 1:
        where = f"{device} with data.batch_size={batch_size}"
        fixes = [f"a smaller batch ({half})"]
    else:
        where = f"{device} (one of {processes} GPUs) with data.batch_size={batch_size} per GPU"
        fixes = [f"fewer samples per GPU ({half})"]
    fixes.append("mixed precision (precision=bf16-mixed or 16-mixed)")
    if processes > 1 and not sharded:
        fixes.append("trainer=fsdp (each GPU holds 1/N of the weights, gradients, optimiser state)")
    if checkpointing_key:
        fixes.append(f"activation checkpointing ({checkpointing_key}=true)")
    else:
        fixes.append("activation checkpointing in your net")
    fixes.append("a smaller model")
    if processes == 1:
        fixes.append("or let volt find the largest batch that fits (tune=batch_size)")
    return f"CUDA out of memory on {where}: {used}. Try {', '.join(fixes)}."


# float8 matmuls need the tensor cores of Ada (sm_89) and Hopper (sm_90) or newer.
FLOAT8_CAPABILITY = (8, 9)
FLOAT8_DIM_MULTIPLE = 16  # torch._scaled_mm wants both dims of a float8 weight divisible by 16


def float8_unavailable() -> str | None:
    """Why `float8=true` cannot train here (one line: the key, the value, the fix), or None."""
    if not torch.cuda.is_available():
        return (
            "float8=true but no CUDA GPU is visible here (float8 matmuls run on Ada/Hopper tensor"
            " cores): use float8=false"
        )
    capability = torch.cuda.get_device_capability()
    if capability < FLOAT8_CAPABILITY:
        name = torch.cuda.get_device_name()
        return (
            f"float8=true but {name} (compute capability {capability[0]}.{capability[1]}) has no"
            " float8 tensor cores (8.9+: L4, L40, H100, H200, B200): use float8=false"
        )
    if importlib.util.find_spec("torchao") is None:
        return (
            "float8=true needs the torchao package, which is not installed: pip install -e"
            " '.[float8]' (offline: its wheel in .whl/, docs/gpt.md), or use float8=false"
        )
    return None


def converts_to_float8(module: nn.Module, name: str) -> bool:
    """torchao's module filter: a Linear whose dims are multiples of 16, except the LM head (its
    weight is the tied token table, and its logits are where float8's rounding shows most)."""
    if not isinstance(module, nn.Linear) or name.rsplit(".", 1)[-1] == "lm_head":
        return False
    out_features, in_features = module.weight.shape
    return out_features % FLOAT8_DIM_MULTIPLE == 0 and in_features % FLOAT8_DIM_MULTIPLE == 0


def apply_float8(net: nn.Module) -> None:
    """Swap `net`'s Linear layers that `converts_to_float8` picks for torchao's Float8Linear, in
    place: dynamic tensorwise scales, matmuls in float8 forward and backward, weights and their
    gradients kept in the module's dtype (state_dict keys unchanged, so checkpoints load without
    float8). Before compile (which fuses the casts) and before FSDP shards the weights; FSDP
    gathers them in bf16 and each layer casts after the gather (torchao's
    enable_fsdp_float8_all_gather is left off: see docs/gpt.md)."""
    from torchao.float8 import convert_to_float8_training  # an optional extra: imported when on

    convert_to_float8_training(net, module_filter_fn=converts_to_float8)
