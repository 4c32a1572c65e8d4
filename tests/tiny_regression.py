"""The smallest LightningModule a Trainer can fit, for tests of callbacks and checkpointing."""

import lightning.pytorch as pl
import torch
from torch import Tensor, nn


class TinyRegression(pl.LightningModule):
    """Linear regression from 4 inputs to 1 output, mean squared error, plain SGD."""

    def __init__(self, lr: float = 0.01) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.lr = lr

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)
