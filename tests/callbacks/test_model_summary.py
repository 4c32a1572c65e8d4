"""OneLineModelSummary: the model in one log line, no table."""

import logging
import warnings

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from volt.callbacks.model_summary import OneLineModelSummary


class TwoLayers(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(100, 1000), nn.Linear(1000, 1))
        self.frozen = nn.Linear(10, 10).requires_grad_(False)
        self.criterion = nn.MSELoss()  # no parameters: not named

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return nn.functional.mse_loss(self.net(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.net.parameters(), lr=0.01)


# Mixed precision keeps float32 weights: the same size, and no warning from Lightning that it
# cannot tell it.
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_the_model_is_one_line(
    precision: str, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    data = DataLoader(TensorDataset(torch.randn(8, 100), torch.randn(8, 1)), batch_size=4)
    trainer = pl.Trainer(
        accelerator="cpu", max_epochs=1, logger=False, enable_progress_bar=False,
        enable_checkpointing=False, callbacks=[OneLineModelSummary(max_depth=1)],
        precision=precision,
    )  # fmt: skip
    logged = caplog.at_level(logging.INFO, logger="volt.callbacks.model_summary")
    with logged, warnings.catch_warnings():
        warnings.filterwarnings("error", message="Precision")
        trainer.fit(TwoLayers(), data)
    lines = [r.getMessage() for r in caplog.records if r.name == "volt.callbacks.model_summary"]
    # 100*1000+1000 + 1000+1 = 102,001 trainable; 110 frozen
    assert lines == [
        "model: 102 K parameters (102 K trainable, 0.4 MB); net: Sequential, frozen: Linear"
    ]
    assert "Total params" not in capsys.readouterr().out  # Lightning's table is not printed
