"""Modules as Lightning's own docs write them ("LightningModule" and "LightningDataModule" pages):
metrics named `train_loss` and `val_loss`, no `test_step`, no `forward`; and one that only returns
its loss and logs nothing. tests/test_lightning_docs_task.py runs them through volt with two YAML
files each (tests/lightning_docs_conf/) and nothing volt-specific."""

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class LineDataModule(L.LightningDataModule):
    def __init__(self, batch_size: int = 32):
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str):
        generator = torch.Generator().manual_seed(0)
        x = torch.rand(640, 1, generator=generator) * 2 - 1
        y = 3 * x - 1 + 0.05 * torch.randn(640, 1, generator=generator)
        self.train_set = TensorDataset(x[:512], y[:512])
        self.val_set = TensorDataset(x[512:], y[512:])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)

    def predict_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)


class LitRegressor(L.LightningModule):
    def __init__(self, hidden: int = 16, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.model = nn.Sequential(nn.Linear(1, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.model(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        val_loss = F.mse_loss(self.model(x), y)
        self.log("val_loss", val_loss)

    def predict_step(self, batch, batch_idx):
        x, _ = batch
        return self.model(x)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class SilentRegressor(L.LightningModule):
    """Returns its loss and logs nothing; no validation, no forward."""

    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
        self.lr = lr

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.model(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class PlateauRegressor(LitRegressor):
    """A common slip: ReduceLROnPlateau without the metric it should follow."""

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        return {
            "optimizer": optimizer,
            "lr_scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer),
        }


class BuggyRegressor(LitRegressor):
    """A defect in the user's code, which no config fixes."""

    def training_step(self, batch, batch_idx):
        raise RuntimeError("a bug in training_step")


class GatheredRegressor(LitRegressor):
    """Its validation loss over every rank's batches, gathered and logged by rank 0 alone, as
    Lightning's docs show (Logging, "rank_zero_only"): under DDP the other ranks log no
    `val_loss`."""

    def on_validation_epoch_start(self):
        self.val_losses = []

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.val_losses.append(F.mse_loss(self.model(x), y))

    def on_validation_epoch_end(self):
        losses = self.all_gather(torch.stack(self.val_losses))
        if self.trainer.is_global_zero:
            self.log("val_loss", losses.mean(), rank_zero_only=True)
