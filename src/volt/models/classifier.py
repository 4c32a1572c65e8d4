"""The classification task: loss, metrics and optimisers around a net that maps images to logits."""

from collections.abc import Callable

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.types import OptimizerLRScheduler
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler
from torchmetrics import MaxMetric, MeanMetric, Metric

from volt.models.fused_step import OptimizerFactory, check_fused_choice, fused_options

SchedulerFactory = Callable[[Optimizer], LRScheduler]
Batch = tuple[Tensor, Tensor]


class Classifier(pl.LightningModule):
    """Cross-entropy classification.

    `optimizer` and `scheduler` are partials (Hydra's `_partial_: true`) completed here with the
    parameters. `fused_optimizer`: torch's fused optimiser step (volt.models.fused_step); None
    uses it where the parameters are on CUDA. Only plain values go into hparams, so checkpoints
    load with weights_only=True.
    """

    def __init__(
        self,
        net: nn.Module,
        num_classes: int,
        optimizer: OptimizerFactory,
        scheduler: SchedulerFactory | None = None,
        scheduler_interval: str = "epoch",
        label_smoothing: float = 0.0,
        fused_optimizer: bool | None = None,
    ) -> None:
        super().__init__()
        check_fused_choice(optimizer, fused_optimizer)
        self.save_hyperparameters(ignore=["net", "optimizer", "scheduler"])
        self.net = net
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.scheduler_interval = scheduler_interval
        self.fused_optimizer = fused_optimizer
        self.criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)

        self.train_acc, self.val_acc, self.test_acc = Accuracy(), Accuracy(), Accuracy()
        # Epoch means of the loss, reduced over all processes when torchmetrics syncs.
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)  # saved in checkpoints: a resumed run keeps its best

    def forward(self, x: Tensor) -> Tensor:
        # channels_last=true lays out the net's weights (volt.build.apply_toggles); the first
        # convolution then converts the input itself.
        return self.net(x)  # (B, C, H, W) -> (B, K)

    def on_train_start(self) -> None:
        # The sanity-check batches before training must not count towards the best accuracy
        # (after a resume the best so far came back with the checkpoint and stays).
        self.val_acc.reset()
        self.val_loss.reset()
        if self.trainer.ckpt_path is None:
            self.val_acc_best.reset()

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        x, y = batch
        logits = self(x)
        loss = self.criterion(logits, y)
        # update, not forward: forward also computes this batch's accuracy, which nothing reads.
        self.train_acc.update(logits, y)
        # Per-step loss of this process (no cross-rank sync: that would cost a collective a step),
        # logged only in the batches after which Lightning writes the logs, so the TensorBoard
        # curve is the same: a `self.log` call costs CPU time (Lightning 2.6.6: ~200 us on a
        # 2-core CPU, ~26 us in volt's trainers, volt.loggers.logged_values), thrown away on the
        # other batches.
        # Not prog_bar=True: Lightning turns progress-bar values into numbers after every batch,
        # which makes the CPU wait for the GPU; volt's progress bar reads it itself.
        if self.trainer._logger_connector.should_update_logs:
            self.log("train/loss", loss, on_step=True, on_epoch=False)
        return loss

    def on_train_epoch_end(self) -> None:
        # Logged once, not each step: the value is the epoch's (reduced over processes).
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True)

    def validation_step(self, batch: Batch, batch_idx: int) -> Tensor:
        x, y = batch
        logits = self(x)
        self.val_loss(self.criterion(logits, y))
        self.val_acc(logits, y)
        self.log("val/loss", self.val_loss, on_step=False, on_epoch=True)
        self.log("val/acc", self.val_acc, on_step=False, on_epoch=True, prog_bar=True)
        return logits  # (B, K), for callbacks (volt.callbacks.images' confusion matrix)

    def on_validation_epoch_end(self) -> None:
        # val_acc.compute() is already reduced over processes, so every rank logs the same value.
        self.val_acc_best(self.val_acc.compute())
        self.log("val/acc_best", self.val_acc_best.compute(), prog_bar=True)

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.test_loss(self.criterion(logits, y))
        self.test_acc(logits, y)
        self.log("test/loss", self.test_loss, on_step=False, on_epoch=True)
        self.log("test/acc", self.test_acc, on_step=False, on_epoch=True)

    def predict_step(self, batch: Batch, batch_idx: int) -> dict[str, Tensor]:
        x, y = batch
        probs = torch.softmax(self(x).float(), dim=-1)
        return {"pred": probs.argmax(-1), "prob": probs.max(-1).values, "target": y}

    def configure_optimizers(self) -> OptimizerLRScheduler:
        options = fused_options(self, self.optimizer_factory, self.fused_optimizer)
        optimizer = self.optimizer_factory(self.parameters(), **options)
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": self.scheduler_interval},
        }


class Accuracy(Metric):
    """The share of rows whose largest logit is at the label: what torchmetrics'
    `MulticlassAccuracy(average="micro")` computes (0 before any update), in five small kernels an
    update and little Python.

    The training step updates it every batch, and where the host bounds the step (the eager
    ResNet on an H200 waits on the host, not the GPU) every microsecond of it counts:
    MulticlassAccuracy's update took 41 us of host time against 13 us for this one (2-core CPU,
    torch 2.14, torchmetrics 1.9, 2026-11-29). Its argument checks, besides, read the labels back to
    the host (a wait for the GPU) unless turned off. Counts are summed over processes when
    torchmetrics syncs, so the epoch's figure is over every sample seen.
    """

    full_state_update = False  # update does not read what compute returns

    def __init__(self) -> None:
        super().__init__()
        self.hits: Tensor
        self.seen: Tensor
        self.add_state("hits", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("seen", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, logits: Tensor, target: Tensor) -> None:
        # In place: assigning a state goes through torchmetrics' __setattr__ (Python, each step).
        self.hits.add_((logits.argmax(-1) == target).sum())  # logits (B, K), target (B,)
        self.seen.add_(target.numel())

    def compute(self) -> Tensor:
        return self.hits / self.seen.clamp(min=1)
