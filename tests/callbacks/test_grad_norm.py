"""GradNorm: the total gradient norm in a real TensorBoard event file, of the gradients the
optimizer steps with (unscaled under fp16 mixed precision, fused optimizer or not), on the steps
Lightning writes its logs, with no host sync of its own."""

from collections.abc import Iterator
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.plugins.precision import MixedPrecision
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader, TensorDataset

from tests.sync_counter import SyncCounter, per_step, read_counts
from volt.callbacks.grad_norm import GradNorm

STEPS, LOG_EVERY = 12, 3


class TwoLayers(pl.LightningModule):
    def __init__(self, fused: bool = False) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.fused = fused

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x).float(), y)

    def configure_optimizers(self) -> Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3, fused=self.fused)


class ReferenceNorm(pl.Callback):
    """The norm of the gradients as the optimizer will use them, in float64, at every step."""

    def __init__(self) -> None:
        self.norms: dict[int, float] = {}

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Optimizer
    ) -> None:
        grads = [p.grad.double() for p in pl_module.parameters() if p.grad is not None]
        norm = torch.sqrt(sum((g**2).sum() for g in grads))
        if isinstance(trainer.precision_plugin, MixedPrecision) and pl_module.fused:
            norm = norm / trainer.precision_plugin.scaler.get_scale()  # fused: still scaled here
        self.norms[trainer.global_step] = float(norm)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def fit(root: Path, callbacks: list[pl.Callback], fused: bool = False, **trainer: object) -> None:
    pl.seed_everything(0, verbose=False)
    data = TensorDataset(torch.randn(STEPS * 4, 8), torch.randn(STEPS * 4, 1))
    pl.Trainer(
        accelerator="cpu",
        max_steps=STEPS,
        log_every_n_steps=LOG_EVERY,
        callbacks=callbacks,
        logger=TensorBoardLogger(root, name="", version=""),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **trainer,  # type: ignore[arg-type]
    ).fit(TwoLayers(fused), DataLoader(data, batch_size=4))


def logged(root: Path) -> dict[int, float]:
    events = EventAccumulator(str(root))
    events.Reload()
    return {e.step: e.value for e in events.Scalars("train/grad_norm")}


def test_the_norm_of_the_gradients_is_logged_on_the_log_steps(tmp_path: Path) -> None:
    reference, counter = ReferenceNorm(), SyncCounter(str(tmp_path / "syncs.json"), 0, STEPS)
    fit(tmp_path, [GradNorm(), reference, counter])
    norms = logged(tmp_path)
    assert list(norms) == [2, 5, 8, 11]  # (step + 1) % 3 == 0, where train/loss would be too
    assert norms == {step: pytest.approx(reference.norms[step], rel=1e-5) for step in norms}
    # Read on the host only when Lightning writes the logs, with its own values.
    syncs = per_step(read_counts(tmp_path / "syncs.json", rank=0), "syncs", "volt/")
    assert syncs == [{}] * STEPS


@pytest.mark.parametrize("fused", [False, True], ids=["unscaled-by-lightning", "fused-adamw"])
def test_under_fp16_mixed_precision_the_norm_is_of_unscaled_gradients(
    fused: bool, tmp_path: Path
) -> None:
    scale = 2.0**12
    precision = MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", init_scale=scale))
    reference = ReferenceNorm()
    fit(tmp_path / "amp", [GradNorm(), reference], fused=fused, plugins=[precision])
    fit(tmp_path / "fp32", [GradNorm()], fused=fused)
    amp, fp32 = logged(tmp_path / "amp"), logged(tmp_path / "fp32")
    assert amp == {step: pytest.approx(reference.norms[step], rel=1e-4) for step in amp}
    # The same training in float32 has about the same gradients; scaled ones would be 4096x.
    assert amp[2] == pytest.approx(fp32[2], rel=0.05)
