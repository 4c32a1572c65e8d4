"""GPU memory in the run's logs while training, and a peak-memory table when it ends."""

import logging
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.utilities.types import STEP_OUTPUT
from rich.table import Table

from volt.console import Terminal

log = logging.getLogger(__name__)

_GIB = 1024**3

# (label, per-device numbers in bytes), label "cuda<i>" or "rank<r>"; see GPUMemoryMonitor.
LabelledRows = list[tuple[str, list[int]]]


class GPUMemoryMonitor(Callback):
    """Logs each training GPU's memory every few steps; prints each one's peak when training ends.

    Metrics, in GiB: `gpu_mem/<device>_allocated_gib` (live tensors), `..._reserved_gib` (held
    by PyTorch's caching allocator: roughly what `nvidia-smi` shows, less the CUDA context) and
    `..._peak_allocated_gib` (high-water mark since the current training epoch began).
    `<device>` is `cuda<i>` when one process drives the GPUs, and `rank<r>` under multi-process
    strategies such as DDP, because local device indices repeat from node to node.

    Why not Lightning's `DeviceStatsMonitor` (Lightning 2.4-2.6.6): it logs every entry of
    `torch.cuda.memory_stats` (over a hundred keys per device) before and after each logged batch,
    names devices by local index, which repeats across DDP nodes, and has no peak-per-epoch reset
    or end-of-fit table. Delete this class if Lightning's gains a compact per-rank mode.

    Args:
        log_every_n_steps: log every this many training batches; None follows
            `Trainer(log_every_n_steps=...)`.
    """

    def __init__(self, log_every_n_steps: int | None = None) -> None:
        if log_every_n_steps is not None and log_every_n_steps < 1:
            raise ValueError(
                f"GPUMemoryMonitor(log_every_n_steps={log_every_n_steps!r}): must be 1 or more; "
                "pass None to follow Trainer(log_every_n_steps=...)."
            )
        self.log_every_n_steps = log_every_n_steps
        self._devices: list[torch.device] = []
        # Per device index: the highest (allocated, reserved) bytes seen during the whole fit,
        # kept here because the allocator's own peaks are reset at every epoch.
        self._fit_peaks: dict[int, tuple[int, int]] = {}
        self._summary: LabelledRows = []

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._devices = self._cuda_devices(trainer)
        self._fit_peaks = {device.index: (0, 0) for device in self._devices}
        self._summary = []
        if not self._devices and trainer.is_global_zero:  # the default run on a CPU: no news
            log.debug(
                "GPUMemoryMonitor is inactive: training runs on %s, not on a CUDA device.",
                trainer.strategy.root_device,
            )

    @staticmethod
    def _cuda_devices(trainer: Trainer) -> list[torch.device]:
        root = trainer.strategy.root_device
        if root.type != "cuda":
            return []
        # A single process may drive several GPUs (DataParallel); under DDP each process drives
        # its root device only and sees the others through all_gather.
        strategy = trainer.strategy
        if trainer.world_size == 1 and isinstance(strategy, ParallelStrategy):
            return list(strategy.parallel_devices or [root])
        return [root]

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        for device in self._devices:
            self._fold_fit_peak(device)
            torch.cuda.reset_peak_memory_stats(device)

    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: STEP_OUTPUT,
        batch: Any,
        batch_idx: int,
    ) -> None:
        # Lightning assigns Trainer.log_every_n_steps at runtime without declaring it.
        interval = self.log_every_n_steps or trainer.log_every_n_steps  # type: ignore[attr-defined]
        # The step Lightning logs this batch's own metrics at (its LearningRateMonitor does the
        # same), so memory lines up with the loss curve; `+ 1` matches its interval test.
        step = trainer.fit_loop.epoch_loop._batches_that_stepped
        if not self._devices or interval == 0 or (step + 1) % interval != 0:
            return
        # [allocated, reserved, peak allocated] bytes
        rows = [list(_allocator_bytes(device)[:3]) for device in self._devices]
        metrics: dict[str, float] = {}
        for label, (allocated, reserved, peak) in self._gather(trainer, pl_module, rows):
            metrics[f"gpu_mem/{label}_allocated_gib"] = allocated / _GIB
            metrics[f"gpu_mem/{label}_reserved_gib"] = reserved / _GIB
            metrics[f"gpu_mem/{label}_peak_allocated_gib"] = peak / _GIB
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Gathered here, not in on_fit_end: by then the strategy has torn down and the model
        # left the GPU.
        if not self._devices:
            return
        rows = []
        for device in self._devices:
            self._fold_fit_peak(device)
            total = torch.cuda.get_device_properties(device).total_memory
            rows.append([*self._fit_peaks[device.index], total])
        self._summary = self._gather(trainer, pl_module, rows)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Printed after the progress bar has finished drawing, so the two do not interleave.
        if self._summary and trainer.is_global_zero:
            Terminal().print(peak_memory_table(self._summary))

    def _fold_fit_peak(self, device: torch.device) -> None:
        allocated, reserved = self._fit_peaks[device.index]
        _, _, allocated_peak, reserved_peak = _allocator_bytes(device)
        self._fit_peaks[device.index] = (
            max(allocated, allocated_peak),
            max(reserved, reserved_peak),
        )

    def _gather(
        self, trainer: Trainer, pl_module: LightningModule, rows: list[list[int]]
    ) -> LabelledRows:
        if trainer.world_size == 1:
            return [
                (f"cuda{device.index}", row)
                for device, row in zip(self._devices, rows, strict=True)
            ]
        # Loggers write from rank 0 only, so it needs every rank's row. All ranks reach this call
        # at the same batch (they share the step count), as a collective requires.
        local = torch.tensor(rows, dtype=torch.int64, device=pl_module.device)  # (1, stats)
        gathered = trainer.strategy.all_gather(local)  # (world, 1, stats)
        return [(f"rank{rank}", ranks_rows[0]) for rank, ranks_rows in enumerate(gathered.tolist())]


def _allocator_bytes(device: torch.device) -> tuple[int, int, int, int]:
    """Bytes (allocated, reserved, peak allocated, peak reserved) from one read of the caching
    allocator's statistics, as nested dictionaries: `torch.cuda.memory_stats` flattens them in
    Python and `torch.cuda.memory_allocated` and its siblings each call it (84 us a call against
    15 on an H200's host, torch 2.11, 2026-11-29)."""
    stats = torch.cuda.memory_stats_as_nested_dict(device)  # {} before CUDA is initialised
    allocated = stats.get("allocated_bytes", {}).get("all", {})
    reserved = stats.get("reserved_bytes", {}).get("all", {})
    return (
        allocated.get("current", 0),
        reserved.get("current", 0),
        allocated.get("peak", 0),
        reserved.get("peak", 0),
    )


def peak_memory_table(rows: LabelledRows) -> Table:
    """Rows of (device label, [peak allocated, peak reserved, total] in bytes) as a rich table."""
    table = Table(title="GPU memory peaks over the fit")
    for column in ["device", "peak allocated GiB", "peak reserved GiB", "total GiB", "reserved %"]:
        table.add_column(column, justify="left" if column == "device" else "right")
    for label, (allocated, reserved, total) in rows:
        table.add_row(
            label,
            f"{allocated / _GIB:.2f}",
            f"{reserved / _GIB:.2f}",
            f"{total / _GIB:.1f}",
            f"{100 * reserved / total:.0f}",
        )
    return table
