import csv
import logging
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from volt.callbacks.gpu_memory import GPUMemoryMonitor
from volt.strategies.data_parallel import DataParallelStrategy
from volt.training import train

GIB = 1024**3


class TinyRegressor(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.layer(inputs)

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        inputs, targets = batch
        # Through self(...): under DataParallel that call is what splits the batch over the GPUs.
        loss = nn.functional.mse_loss(self(inputs), targets)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
        return DataLoader(data, batch_size=4)


def fit(tmp_path: Path, monitor: GPUMemoryMonitor, *extra: Callback, **trainer_args: Any) -> Path:
    """Train TinyRegressor for 2 epochs of 4 batches; return the CSVLogger's metrics file."""
    trainer = Trainer(
        max_epochs=2,
        limit_train_batches=4,
        logger=CSVLogger(tmp_path, name="", version=0),
        callbacks=[*extra, monitor],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **{"accelerator": "cpu", "devices": 1, **trainer_args},
    )
    trainer.fit(TinyRegressor())
    return tmp_path / "version_0" / "metrics.csv"


def metric_rows(metrics_file: Path, name: str) -> dict[int, float]:
    """{step: value} of one metric; CSVLogger leaves the cell empty where another metric logged."""
    with metrics_file.open() as file:
        return {int(row["step"]): float(row[name]) for row in csv.DictReader(file) if row.get(name)}


def slow_walk(*args: Any) -> None:
    raise AssertionError("torch.cuda.memory_stats and what calls it flatten every statistic")


class FakeCudaMemory:
    """Stands in for the caching allocator's statistics, per device index."""

    def __init__(self) -> None:
        # Device i holds i + 1 GiB of tensors inside 2 * (i + 1) GiB of reserved blocks.
        self.allocated = {index: (index + 1) * GIB for index in range(2)}
        self.reserved = {index: 2 * (index + 1) * GIB for index in range(2)}
        self.peak_allocated = dict(self.allocated)
        self.peak_reserved = dict(self.reserved)
        self.resets = 0
        self.walks = 0  # reads of the allocator's statistics

    def spike(self, index: int, gib: float) -> None:
        """A transient activation peak that is freed again before the batch ends."""
        self.peak_allocated[index] = max(self.peak_allocated[index], int(gib * GIB))
        self.peak_reserved[index] = max(self.peak_reserved[index], int((gib + 0.5) * GIB))

    def reset_peak_memory_stats(self, device: torch.device) -> None:
        self.peak_allocated[device.index] = self.allocated[device.index]
        self.peak_reserved[device.index] = self.reserved[device.index]
        self.resets += 1

    def memory_stats_as_nested_dict(self, device: torch.device) -> dict[str, Any]:
        self.walks += 1
        index = device.index
        return {
            "allocated_bytes": {
                "all": {"current": self.allocated[index], "peak": self.peak_allocated[index]}
            },
            "reserved_bytes": {
                "all": {"current": self.reserved[index], "peak": self.peak_reserved[index]}
            },
        }

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        nested = self.memory_stats_as_nested_dict
        monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", nested)
        for flattening in ["memory_stats", "max_memory_allocated", "max_memory_reserved"]:
            monkeypatch.setattr(torch.cuda, flattening, slow_walk)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self.reset_peak_memory_stats)
        monkeypatch.setattr(
            torch.cuda,
            "get_device_properties",
            lambda device: SimpleNamespace(total_memory=80 * GIB),
        )
        # The Trainer runs on CPU; the monitor believes each rank drives cuda:<rank>.
        monkeypatch.setattr(
            GPUMemoryMonitor,
            "_cuda_devices",
            staticmethod(lambda trainer: [torch.device("cuda", trainer.global_rank)]),
        )


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCudaMemory:
    fake = FakeCudaMemory()
    fake.install(monkeypatch)
    return fake


class SpikeEachBatch(Callback):
    """Peaks of 3 GiB in epoch 0 and 1.5 GiB in epoch 1 on this rank's device."""

    def __init__(self, fake: FakeCudaMemory) -> None:
        self.fake = fake

    def on_train_batch_start(self, trainer: Trainer, *args: Any) -> None:
        self.fake.spike(trainer.global_rank, 3.0 if trainer.current_epoch == 0 else 1.5)


def test_rejects_a_non_positive_interval() -> None:
    with pytest.raises(ValueError, match=r"log_every_n_steps=0\): must be 1 or more"):
        GPUMemoryMonitor(log_every_n_steps=0)


def test_inert_on_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_cuda(*args: Any) -> None:
        raise AssertionError("GPUMemoryMonitor queried CUDA on a CPU run")

    for name in ["memory_stats_as_nested_dict", "memory_stats", "reset_peak_memory_stats"]:
        monkeypatch.setattr(torch.cuda, name, no_cuda)

    with caplog.at_level(logging.DEBUG, logger="volt.callbacks.gpu_memory"):
        metrics_file = fit(tmp_path, GPUMemoryMonitor(), log_every_n_steps=1)

    # Said at debug level only: the default run on a CPU needs no news of it.
    (said,) = [r for r in caplog.records if "GPUMemoryMonitor is inactive" in r.getMessage()]
    assert said.levelno == logging.DEBUG and "training runs on cpu" in said.getMessage()
    assert "gpu_mem/" not in metrics_file.read_text()
    assert metric_rows(metrics_file, "train_loss")  # the run itself logged


def test_logs_with_the_trainers_metrics_and_resets_peaks_each_epoch(
    tmp_path: Path, fake_cuda: FakeCudaMemory, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics_file = fit(tmp_path, GPUMemoryMonitor(), SpikeEachBatch(fake_cuda), log_every_n_steps=2)

    # 8 batches, steps 0..7; Lightning logs every 2nd (steps 1, 3, 5, 7), and so do we.
    assert metric_rows(metrics_file, "gpu_mem/cuda0_allocated_gib") == dict.fromkeys(
        [1, 3, 5, 7], 1.0
    )
    assert metric_rows(metrics_file, "gpu_mem/cuda0_reserved_gib") == dict.fromkeys(
        [1, 3, 5, 7], 2.0
    )
    assert metric_rows(metrics_file, "train_loss").keys() == {1, 3, 5, 7}
    # Reset at each epoch start, so epoch 1 shows its own 1.5 GiB peak, not epoch 0's 3 GiB.
    assert metric_rows(metrics_file, "gpu_mem/cuda0_peak_allocated_gib") == {
        1: 3.0,
        3: 3.0,
        5: 1.5,
        7: 1.5,
    }
    assert fake_cuda.resets == 2
    # One read of the allocator's statistics per logging step (4), epoch start (2) and at the end
    assert fake_cuda.walks == 7

    # The summary keeps the peak over the whole fit: epoch 0's 3 GiB (3.5 GiB reserved).
    out = capsys.readouterr().out
    # Cells only: rich draws the borders in box characters, or in ASCII on a non-UTF-8 console.
    summary = [[cell for cell in line.split() if cell not in "│|"] for line in out.splitlines()]
    assert ["cuda0", "3.00", "3.50", "80.0", "4"] in summary


def test_own_interval_overrides_the_trainers(tmp_path: Path, fake_cuda: FakeCudaMemory) -> None:
    metrics_file = fit(tmp_path, GPUMemoryMonitor(log_every_n_steps=3), log_every_n_steps=2)

    assert metric_rows(metrics_file, "gpu_mem/cuda0_allocated_gib").keys() == {2, 5}


def test_ddp_ranks_gather_to_rank_zero(tmp_path: Path, fake_cuda: FakeCudaMemory) -> None:
    # Two real CPU processes over gloo; fork keeps the fake allocator in both.
    if torch.cuda.is_initialized():  # on a GPU machine, after a GPU test in this process
        pytest.skip("a forked rank cannot use CUDA once this process has (Lightning's RNG save)")
    metrics_file = fit(
        tmp_path,
        GPUMemoryMonitor(),
        SpikeEachBatch(fake_cuda),
        devices=2,
        strategy="ddp_fork",
        log_every_n_steps=2,
    )

    # 64 samples over 2 ranks: each sees 8 batches per epoch, limited to 4.
    assert metric_rows(metrics_file, "gpu_mem/rank0_allocated_gib") == dict.fromkeys(
        [1, 3, 5, 7], 1.0
    )
    assert metric_rows(metrics_file, "gpu_mem/rank1_allocated_gib") == dict.fromkeys(
        [1, 3, 5, 7], 2.0
    )
    # Reset brings rank 1's peak back to its 2 GiB of live tensors, above epoch 1's 1.5 GiB spike.
    assert metric_rows(metrics_file, "gpu_mem/rank1_peak_allocated_gib") == {
        1: 3.0,
        3: 3.0,
        5: 2.0,
        7: 2.0,
    }


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_logs_real_gpu_memory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    metrics_file = fit(
        tmp_path, GPUMemoryMonitor(), accelerator="gpu", devices=1, log_every_n_steps=1
    )

    allocated = metric_rows(metrics_file, "gpu_mem/cuda0_allocated_gib")
    reserved = metric_rows(metrics_file, "gpu_mem/cuda0_reserved_gib")
    peak = metric_rows(metrics_file, "gpu_mem/cuda0_peak_allocated_gib")
    assert allocated.keys() == reserved.keys() == peak.keys() == set(range(8))
    for step in allocated:
        assert 0 < allocated[step] <= peak[step]
        assert allocated[step] <= reserved[step]
    assert "cuda0" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_data_parallel_reports_every_gpu(tmp_path: Path) -> None:
    # One process drives both GPUs, so both appear under their device index.
    metrics_file = fit(
        tmp_path,
        GPUMemoryMonitor(),
        accelerator="gpu",
        devices=2,
        strategy=DataParallelStrategy(),
        log_every_n_steps=1,
    )

    for index in range(2):
        peaks = metric_rows(metrics_file, f"gpu_mem/cuda{index}_peak_allocated_gib")
        assert peaks.keys() == set(range(8))
        assert min(peaks.values()) > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_monitor_in_conf_logs_a_gpu_run(
    compose_config: Callable[..., DictConfig], fast: list[str]
) -> None:
    cfg = compose_config(
        "train",
        [
            *fast,
            "trainer=gpu",
            "trainer.devices=1",
            "trainer.max_epochs=1",
            "logger=csv",
            "callbacks.gpu_memory.log_every_n_steps=5",
            "trainer.log_every_n_steps=5",
        ],
    )
    train(cfg)
    peaks = metric_rows(
        Path(cfg.paths.output_dir) / "csv" / "metrics.csv", "gpu_mem/cuda0_peak_allocated_gib"
    )
    assert peaks and min(peaks.values()) > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_one_read_of_the_allocator_gives_what_torch_cuda_reports() -> None:
    from volt.callbacks.gpu_memory import _allocator_bytes

    device = torch.device("cuda", 0)
    held = torch.empty(3 * 2**20, device=device)  # noqa: F841  # 12 MiB live
    assert _allocator_bytes(device) == (
        torch.cuda.memory_allocated(device),
        torch.cuda.memory_reserved(device),
        torch.cuda.max_memory_allocated(device),
        torch.cuda.max_memory_reserved(device),
    )
    assert _allocator_bytes(device)[0] >= 12 * 2**20
