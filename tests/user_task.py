"""A task written as a Lightning user writes one, knowing nothing of volt: a plain LightningModule
and LightningDataModule over a Dataset, with their own optimiser. tests/test_contract.py trains,
evaluates and predicts with it through volt's entry points (configs in tests/user_task_conf/)."""

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset


class NoisyLine(Dataset[tuple[Tensor, Tensor]]):
    """y = 3x - 1 + noise, x in [-1, 1]: a regression any small net learns in a few epochs."""

    def __init__(self, size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.rand(size, 1, generator=generator) * 2 - 1
        self.y = 3 * self.x - 1 + 0.05 * torch.randn(size, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.x[index], self.y[index]


class LineData(pl.LightningDataModule):
    def __init__(self, batch_size: int = 32, size: int = 512) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.size = size

    def setup(self, stage: str) -> None:
        self.train_set = NoisyLine(self.size, seed=0)
        self.val_set = NoisyLine(self.size // 4, seed=1)
        self.test_set = NoisyLine(self.size // 4, seed=2)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=self.batch_size)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=self.batch_size)


class LineRegressor(pl.LightningModule):
    def __init__(self, hidden: int = 16, lr: float = 0.05, fused: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.body = nn.Sequential(nn.Linear(1, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x)

    def _loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.log("val/loss", self._loss(batch))

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.log("test/loss", self._loss(batch))

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self(batch[0]).squeeze(-1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr, fused=self.hparams.fused)
