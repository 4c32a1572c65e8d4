"""How long a checkpoint save stalls training under trainer=fsdp, and how much host memory it
takes, for the sharded layout (each rank writes its shards, DCP) against the full one (gathered
on rank 0, one file), beside the floor: one torch.save of this rank's own shard.

    python benchmarks/fsdp_checkpoint.py --outputs /tmp/ckpt_bench                   # CPU, 2 ranks
    python benchmarks/fsdp_checkpoint.py --outputs /tmp/ckpt_bench --experiment gpt_bytes \\
        --devices 8 -- model.net.n_layer=24 model.net.n_head=16 model.net.n_embd=2048 \\
        data.batch_size=4 compile=off                                    # a 1.2B GPT on 8 GPUs

Each layout runs `train.py` for two steps; when training ends every rank saves `--repeats` times
through `trainer.save_checkpoint` (what ModelCheckpoint calls), each save's seconds until it
returned (training resumes then) and host memory (the peak resident set during it less the one
before; Linux and glibc only); then, once, the part of a save that collects the state, and the
floor: this rank's shard of the weights and AdamW states staged to the host, torch.save'd and
fsync'ed. Sharded runs also time DCP's `async_save` (not used by volt): its blocking part (the
staging) and the whole.
"""

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from lightning.pytorch.callbacks import Callback
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.tensor import DTensor

PROJECT = Path(__file__).resolve().parents[1]


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _measured(trainer: pl.Trainer, save: Callable[[], object]) -> dict[str, float]:
    trainer.strategy.barrier()
    # Memory freed by training (gradients, activations on the CPU) stays resident in malloc's
    # free lists, where a save's allocations would land unseen: hand it back to the system first.
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current VmRSS
    before = _status_kib("VmRSS")
    start = time.perf_counter()
    save()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "host_gib": (_status_kib("VmHWM") - before) / 2**20}


def _remove_on_rank_zero(trainer: pl.Trainer, path: Path) -> None:
    """Once every rank has written: `path`, a file or a folder (not timed; the next save anew)."""
    trainer.strategy.barrier()
    if trainer.is_global_zero:
        subprocess.run(["rm", "-rf", str(path)], check=True)


class TimedSaves(Callback):
    """Saves `repeats` times when training ends, then the floor (see the module docstring); each
    rank writes <run dir>/saves_rank<N>.json."""

    def __init__(self, repeats: int = 3) -> None:
        self.repeats = repeats

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        root, rank = Path(trainer.default_root_dir), trainer.global_rank
        target = root / "timed.ckpt"
        saves = []
        for _ in range(self.repeats):
            saves.append(_measured(trainer, lambda: trainer.save_checkpoint(target)))
            _remove_on_rank_zero(trainer, target)
        model, optimizer = trainer.strategy.model, trainer.optimizers[0]
        floor_file = root / f"floor_rank{rank}.pt"

        def floor() -> None:
            own = {
                "model": get_model_state_dict(model),
                "optimizer": get_optimizer_state_dict(model, optimizer),
            }
            with floor_file.open("wb") as file:
                torch.save(_to_host(own), file)
                file.flush()
                os.fsync(file.fileno())

        # Of a save, what collecting the state takes (Lightning's dump_checkpoint: the state
        # dicts, gathered on rank 0 for full, this rank's staged on the host for sharded).
        connector = trainer._checkpoint_connector
        collect = _measured(trainer, lambda: connector.dump_checkpoint(weights_only=False))
        record: dict[str, Any] = {
            "saves": saves,
            "collect": collect,
            "floor": _measured(trainer, floor),
        }
        floor_file.unlink()
        if getattr(trainer.strategy, "_save_distributed_checkpoint", False):
            record["async"] = _async_save(trainer, root / "async.ckpt")
        (root / f"saves_rank{rank}.json").write_text(json.dumps(record))


def _to_host(node: Any) -> Any:
    if isinstance(node, DTensor):
        node = node.to_local()
    if isinstance(node, torch.Tensor):
        return node.detach().to("cpu", copy=True)
    if isinstance(node, dict):
        return {k: _to_host(v) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return type(node)(_to_host(v) for v in node)
    return node


def _async_save(trainer: pl.Trainer, folder: Path) -> dict[str, float]:
    model = trainer.strategy.model
    state = {
        "state_dict": get_model_state_dict(model),
        "optimizer_0": get_optimizer_state_dict(model, trainer.optimizers[0]),
    }
    group = dist.new_group(backend="gloo")  # async_save's collectives run on the host
    trainer.strategy.barrier()
    start = time.perf_counter()
    future = dcp.async_save(state, checkpoint_id=str(folder), process_group=group)
    blocked = time.perf_counter() - start
    future.result()
    total = time.perf_counter() - start
    _remove_on_rank_zero(trainer, folder)
    return {"blocking_seconds": blocked, "total_seconds": total}


def run(layout: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    # Here, not at the top: train.py imports this module as benchmarks.fsdp_checkpoint for its
    # callback, where only the script's own run puts benchmarks/ on sys.path.
    import harness

    name = f"bench_{layout}"
    command = [
        *(sys.executable, "train.py", f"experiment={args.experiment}", "trainer=fsdp"),
        f"trainer.devices={args.devices}",
        f"trainer.strategy.checkpoint={layout}",
        "trainer.max_steps=2",
        "model.scheduler.warmup_steps=0",  # two steps only
        *("trainer.limit_val_batches=0", "test=false", "logger=none"),
        *(f"callbacks.{c}=null" for c in ("model_checkpoint", "last_checkpoint", "early_stopping")),
        *("callbacks.text_samples=null", "callbacks.progress_bar=null"),
        "trusted_targets=[benchmarks]",
        "+callbacks.timed={_target_:benchmarks.fsdp_checkpoint.TimedSaves,"
        f"repeats:{args.repeats}}}",
        f"name={name}",
        f"paths.outputs_dir={args.outputs}",
        *args.overrides,
    ]
    log = args.outputs / f"{name}.log"
    print(f"{layout}: training and saving, log in {log}", flush=True)
    harness.run_fresh(command, log, cwd=PROJECT).check(command)
    run_dir = args.outputs / "train" / "runs" / name
    return [json.loads(p.read_text()) for p in sorted(run_dir.glob("saves_rank*.json"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--outputs", type=Path, required=True, help="where the runs are written")
    parser.add_argument("--experiment", default="gpt_bytes_tiny")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--layouts", nargs="+", choices=["sharded", "full"], default=["sharded", "full"]
    )
    parser.add_argument("overrides", nargs="*", help="after --: train.py overrides")
    args = parser.parse_args()
    print(
        "layout   rank  save s (median)  of which collect s  host GiB (max)  floor s  floor GiB"
        "  async block/total s"
    )
    for layout in args.layouts:
        for rank, record in enumerate(run(layout, args)):
            seconds = statistics.median(s["seconds"] for s in record["saves"])
            host = max(s["host_gib"] for s in record["saves"])
            floor, sync = record["floor"], record.get("async")
            async_text = (
                f"{sync['blocking_seconds']:.2f}/{sync['total_seconds']:.2f}" if sync else "-"
            )
            print(
                f"{layout:8} {rank:4}  {seconds:15.2f}  {record['collect']['seconds']:18.2f}"
                f"  {host:14.2f}  {floor['seconds']:7.2f}  {floor['host_gib']:9.2f}  {async_text}"
            )


if __name__ == "__main__":
    main()
