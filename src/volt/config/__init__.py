"""Where volt's configs live, and the resolvers they use (registered on import)."""

import datetime
import os
import secrets
from functools import cache
from pathlib import Path

from omegaconf import OmegaConf

from volt.strategies.torchrun import launched_by_torchrun, stamp_of_rank_zero

# src/volt/config/__init__.py -> the project root holding conf/. The package is installed
# editable (or put on PYTHONPATH), so this is the clone the user works in.
PROJECT_ROOT = Path(__file__).resolve().parents[3]
CONF_DIR = PROJECT_ROOT / "conf"


@cache
def run_stamp() -> str:
    """`2026-11-22_01-49-46_3fa9c1`: start time plus a per-process random tag.

    Cached so every job of one multirun, and every re-resolution of the same config, gets the
    same value; the random tag keeps two runs started in the same second apart.
    """
    now = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    stamp = f"{now}_{secrets.token_hex(3)}"
    # Under torchrun every rank runs Hydra: all take rank 0's stamp and so share one run directory.
    return stamp_of_rank_zero(stamp) if launched_by_torchrun() else stamp


def devices_per_node(without_gpu: int) -> int:
    """torchrun's processes per node where it started this one, else every visible GPU, else
    `without_gpu` (processes or devices on the CPU)."""
    if "LOCAL_WORLD_SIZE" in os.environ:
        return int(os.environ["LOCAL_WORLD_SIZE"])
    import torch

    return torch.cuda.device_count() or without_gpu


def rank_log_suffix() -> str:
    """'_rank3' in rank 3 of a run whose ranks each run Hydra (torchrun, srun); '' in rank 0."""
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    return f"_rank{rank}" if rank else ""


OmegaConf.register_new_resolver("volt.project_root", lambda: str(PROJECT_ROOT), replace=True)
# A named run's directory is its name; an unnamed one's is the stamp. use_cache: the value is
# kept in the config, so a sweep job that Hydra's submitit launcher runs in another process (a
# SLURM task) resolves the sweep directory its launcher made.
OmegaConf.register_new_resolver(
    "volt.run_id", lambda name: str(name) if name else run_stamp(), replace=True, use_cache=True
)
OmegaConf.register_new_resolver("volt.devices_per_node", devices_per_node, replace=True)
OmegaConf.register_new_resolver("volt.rank_log_suffix", rank_log_suffix, replace=True)
