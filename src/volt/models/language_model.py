"""The byte-level language-modelling task: next-byte cross-entropy, bits per byte, sampling."""

import functools
import math
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities.types import OptimizerLRScheduler
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler
from torchmetrics import MeanMetric, MinMetric

from volt.models.fused_step import OptimizerFactory, check_fused_choice, fused_options

SchedulerFactory = Callable[[Optimizer], LRScheduler]
Batch = tuple[Tensor, Tensor]  # inputs and targets, (B, T) token indices


@runtime_checkable
class HasParamGroups(Protocol):
    def param_groups(self, weight_decay: float) -> list[dict[str, Any]]: ...


@runtime_checkable
class Generates(Protocol):
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float,
        top_k: int | None,
        generator: torch.Generator | None,
    ) -> Tensor: ...


@runtime_checkable
class CountsFlops(Protocol):
    def flops_per_token(self) -> int: ...


class LanguageModel(pl.LightningModule):
    """Next-byte prediction with a net that maps (B, T) bytes to (B, T, 256) logits.

    `optimizer` and `scheduler` are partials (Hydra's `_partial_: true`) completed here. A net
    with `param_groups(weight_decay)` chooses which of its tensors decay, by `weight_decay`;
    other nets get `optimizer(parameters)` and the optimiser's own decay. `fused_optimizer`
    picks torch's fused optimiser step (one kernel over all parameters instead of several per
    tensor) for optimisers that have one; None uses it where the parameters are on CUDA. Bits per
    byte (bpb) is the loss in base 2: 8 is no better than guessing uniformly. Only plain values go
    into hparams, so checkpoints load with weights_only=True.
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory,
        scheduler: SchedulerFactory | None = None,
        scheduler_interval: str = "step",
        weight_decay: float = 0.1,
        max_new_tokens: int = 256,
        temperature: float = 1.0,
        top_k: int | None = None,
        fused_optimizer: bool | None = None,
    ) -> None:
        super().__init__()
        check_fused_choice(optimizer, fused_optimizer)
        if (
            isinstance(net, HasParamGroups)
            and isinstance(optimizer, functools.partial)
            and "weight_decay" in optimizer.keywords
        ):
            value = optimizer.keywords["weight_decay"]
            raise ValueError(
                f"model.optimizer.weight_decay={value} would be overridden: this net sets the "
                f"decay of its parameter groups from model.weight_decay; set "
                f"model.weight_decay={value} and remove model.optimizer.weight_decay"
            )
        self.save_hyperparameters(ignore=["net", "optimizer", "scheduler"])
        self.net = net
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.scheduler_interval = scheduler_interval
        self.weight_decay = weight_decay
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_k = top_k
        self.fused_optimizer = fused_optimizer
        # Epoch means over all tokens, reduced over all processes when torchmetrics syncs. Their
        # NaN check reads each value back (one host sync per evaluation batch); the check's
        # off switch, nan_strategy="disable", would also drop the weights (torchmetrics 1.9).
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()
        self.val_bpb_best = MinMetric()
        self.val_bpb_best.persistent(True)  # saved in checkpoints: a resumed run keeps its best

    def forward(self, idx: Tensor) -> Tensor:
        return self.net(idx)  # (B, T) -> (B, T, V)

    def flops_per_token(self) -> int | None:
        """The net's training FLOPs per token (forward and backward), if it counts them."""
        return self.net.flops_per_token() if isinstance(self.net, CountsFlops) else None

    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """(B, T0) -> (B, T0 + max_new_tokens) from the net's own sampler."""
        if not isinstance(self.net, Generates):
            raise TypeError(
                f"{type(self.net).__name__} has no generate(): sampling continues text with the "
                "net, so use one that can, such as volt.nets.gpt.GPT"
            )
        return self.net.generate(idx, max_new_tokens, temperature, top_k, generator)

    def loss(self, batch: Batch) -> Tensor:
        x, y = batch
        logits = self(x)  # (B, T, V)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))

    def on_train_start(self) -> None:
        # The sanity-check batches before training must not count towards the best bpb
        # (after a resume the best so far came back with the checkpoint and stays).
        self.val_loss.reset()
        if self.trainer.ckpt_path is None:
            self.val_bpb_best.reset()

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        loss = self.loss(batch)
        # Per-step loss of this process (no cross-rank sync: that would cost a collective a step),
        # logged only in the batches after which Lightning writes the logs (the curve is the same):
        # Lightning 2.6.6's `self.log` costs CPU time at every call, thrown away on the others.
        # Not prog_bar=True: Lightning turns progress-bar values into numbers after every batch,
        # which makes the CPU wait for the GPU.
        trainer = self._trainer
        if trainer is None or trainer._logger_connector.should_update_logs:
            self.log("train/loss", loss, on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        # Weighted by tokens, so a short last batch counts for what it holds.
        self.val_loss(self.loss(batch), weight=batch[1].numel())
        self.log("val/loss", self.val_loss, on_step=False, on_epoch=True)

    def on_validation_epoch_end(self) -> None:
        # compute() is already reduced over processes, so every rank logs the same values.
        bpb = self.val_loss.compute() / math.log(2)
        self.val_bpb_best(bpb)
        self.log("val/bpb", bpb, prog_bar=True)
        self.log("val/bpb_best", self.val_bpb_best.compute())

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self.test_loss(self.loss(batch), weight=batch[1].numel())
        self.log("test/loss", self.test_loss, on_step=False, on_epoch=True)

    def on_test_epoch_end(self) -> None:
        self.log("test/bpb", self.test_loss.compute() / math.log(2))

    def predict_step(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        """Continues the prompts in batch[0], (B, T0) token indices (a test batch's inputs, or a
        DataLoader over a TensorDataset of prompts)."""
        prompts = batch[0]
        tokens = self.generate(prompts, self.max_new_tokens, self.temperature, self.top_k)
        continuation = tokens[:, prompts.size(1) :]  # (B, max_new_tokens)
        return {
            "prompt": prompts,
            "continuation": continuation,
            # Bytes, read as UTF-8: a sampled byte sequence need not be valid UTF-8.
            "text": [bytes(row).decode("utf-8", errors="replace") for row in continuation.tolist()],
        }

    def configure_optimizers(self) -> OptimizerLRScheduler:
        options = fused_options(self, self.optimizer_factory, self.fused_optimizer)
        if isinstance(self.net, HasParamGroups):
            optimizer = self.optimizer_factory(self.net.param_groups(self.weight_decay), **options)
        else:
            optimizer = self.optimizer_factory(self.parameters(), **options)
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": self.scheduler_interval},
        }
