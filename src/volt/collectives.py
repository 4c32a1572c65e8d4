"""Collectives volt calls itself, outside Lightning's strategy.

`all_reduce_queued`, for per-step checks that must not make the host wait for the GPU:
Lightning's `strategy.reduce` runs a `barrier()` before its all-reduce, and NCCL's barrier blocks
the CPU until the GPU has finished all the work queued so far. Called once per step, that keeps
the CPU from queueing the next step ahead of the GPU. `all_reduce` alone is only queued on the
GPU's stream: the host reads the result later, when it needs it.

Seen with Lightning 2.4-2.6.6 (`DDPStrategy.reduce`). Replace `all_reduce_queued` with the
strategy's own reduce when Lightning offers one without a barrier.
"""

from collections.abc import Iterable

import torch.distributed as dist
from torch import Tensor

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


def all_reduce_queued(tensor: Tensor, op: str) -> Tensor:
    """`tensor` reduced in place over all ranks with `op` ("sum" or "max"); itself if one rank."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=_OPS[op])
    return tensor


def names_on_every_rank(names: Iterable[str]) -> list[str]:
    """Those of `names` (sorted) that every rank holds too; all ranks must call it together."""
    mine = sorted(names)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return mine
    every: list[list[str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return [name for name in mine if all(name in (other or ()) for other in every)]
