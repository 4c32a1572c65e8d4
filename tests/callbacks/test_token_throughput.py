"""TokenThroughput: tokens/s over training time only, read where Lightning writes its logs, and
MFU against the right peak."""

import csv
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from volt.callbacks import throughput, token_throughput
from volt.callbacks.token_throughput import TokenThroughput, matmul_dtype, peak_tflops

B, T = 4, 8  # tokens per batch: 32
STEP_S, VAL_S = 0.02, 0.5
STEPS, EVERY = 20, 5
FLOPS_PER_TOKEN = 1_000_000


class Clock:
    """The meter's clock (`time.perf_counter` as volt.callbacks.throughput sees it), moved only by
    the module's steps: the rates below are exact, however fast or busy the machine is."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(throughput, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    return clock


class SlowTokens(pl.LightningModule):
    """A step that takes STEP_S, a validation batch that takes VAL_S, on `clock`."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock
        self.emb = nn.Embedding(256, 4)

    def flops_per_token(self) -> int:
        return FLOPS_PER_TOKEN

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        self.clock.now += STEP_S
        return self.emb(batch[0]).pow(2).mean()

    def validation_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        self.clock.now += VAL_S

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(tmp_path: Path, meter: TokenThroughput, clock: Clock) -> list[dict[str, str]]:
    tokens = TensorDataset(torch.randint(256, (STEPS * B, T)))
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=STEPS,
        log_every_n_steps=EVERY,
        val_check_interval=7,  # validations inside the measured windows (steps 7, 14)
        limit_val_batches=1,
        num_sanity_val_steps=1,
        callbacks=[meter],
        logger=CSVLogger(tmp_path),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    loader = DataLoader(tokens, batch_size=B)
    trainer.fit(SlowTokens(clock), loader, DataLoader(tokens, batch_size=B))
    with (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").open() as file:
        return [row for row in csv.DictReader(file) if row.get("perf/train_tokens_per_s")]


def test_tokens_per_second_leave_validation_out_and_reach_the_logger_at_its_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    syncs = []
    monkeypatch.setattr(TokenThroughput, "_sync", lambda self, trainer: syncs.append(1))
    rows = fit(tmp_path, TokenThroughput(), clock)
    assert [int(row["step"]) for row in rows] == [4, 9, 14, 19]  # Lightning's rows at steps 5..20
    for row in rows:
        # Had a validation (0.5 s) been counted, a window of 5 steps (0.1 s) would show a sixth.
        assert float(row["perf/train_tokens_per_s"]) == pytest.approx(B * T / STEP_S)
    assert all(not row.get("perf/mfu") for row in rows)  # no peak for a CPU
    # The clock is read (after a GPU sync) at the 4 log steps and around the 2 validations, and
    # where training starts: never at every step.
    assert len(syncs) == 1 + 4 * 2 + 2 * 2


def test_mfu_is_the_model_flops_over_the_peak(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    monkeypatch.setattr(token_throughput, "peak_tflops", lambda device, dtype: 1e-3)
    rows = fit(tmp_path, TokenThroughput(), clock)
    for row in rows:
        rate = float(row["perf/train_tokens_per_s"])
        expected = FLOPS_PER_TOKEN * rate / 1e9
        assert float(row["perf/mfu"]) == pytest.approx(expected, rel=1e-5)


def test_mfu_is_per_device_when_several_processes_train(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    # Two processes: tokens/s counts both, each against its own device's peak.
    monkeypatch.setattr(token_throughput, "peak_tflops", lambda device, dtype: 1e-3)
    monkeypatch.setattr(pl.Trainer, "world_size", property(lambda trainer: 2))
    rows = fit(tmp_path, TokenThroughput(), clock)
    for row in rows:
        rate = float(row["perf/train_tokens_per_s"])
        assert rate == pytest.approx(2 * B * T / STEP_S)  # both processes' tokens
        expected = FLOPS_PER_TOKEN * rate / 2 / 1e9
        assert float(row["perf/mfu"]) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize(
    ("precision", "matmul", "dtype"),
    [
        ("bf16-mixed", "highest", "bf16"),
        ("bf16-true", "highest", "bf16"),
        ("16-mixed", "highest", "fp16"),
        ("32-true", "highest", "fp32"),
        ("32-true", "high", "tf32"),
        ("64-true", "high", "fp64"),
    ],
)
def test_the_precision_picks_the_matmul_dtype(precision: str, matmul: str, dtype: str) -> None:
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(matmul)
    try:
        assert matmul_dtype(precision) == dtype
    finally:
        torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_the_peak_is_read_by_device_name(
    name: str, peak: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: name)
    assert peak_tflops(torch.device("cuda", 0), "bf16") == peak
    assert peak_tflops(torch.device("cpu"), "bf16") is None
