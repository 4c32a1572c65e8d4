"""A classifier's validation in pictures, in TensorBoard's images tab: the confusion matrix of the
whole validation set and a grid of validation images with their predicted and true labels."""

import logging
import math
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor

log = logging.getLogger(__name__)

# Above this many classes the counts no longer fit in their cells; colours alone are drawn.
MAX_ANNOTATED_CLASSES = 20


class ClassificationImages(Callback):
    """After every `every_n_validations`-th validation during fit: `val/confusion_matrix` (rows:
    true class, columns: predicted; colour: the share of the row, text: the count) and
    `val/predictions` (the first `num_samples` images of the first validation batch, each titled
    with its predicted class and, where wrong, the true one), at the step of the validation's
    scalars.

    The predictions are the argmax of what the module's `validation_step` returns: the logits
    (B, num_classes), as volt's Classifier returns them. Counts accumulate on the device in
    `index_add_` (no per-batch host sync; torch's `bincount` reads its input's maximum on the
    host), are summed over processes once per validation, and rank 0 draws them with matplotlib
    and writes them. Without a TensorBoard logger nothing is counted or drawn.
    """

    def __init__(self, num_samples: int = 16, every_n_validations: int = 1) -> None:
        if num_samples < 1:
            raise ValueError(
                f"callbacks.classification_images.num_samples={num_samples} must be at least 1"
            )
        if every_n_validations < 1:
            raise ValueError(
                "callbacks.classification_images.every_n_validations="
                f"{every_n_validations} must be at least 1"
            )
        self.num_samples = num_samples
        self.every_n_validations = every_n_validations
        self._validations = 0  # validations during fit so far, the sanity check not counted
        self._drawing = False
        self._no_logits = False  # the module's validation_step returns no logits: never draws
        self._counts: Tensor | None = None  # (K * K,) int64 on the device, true * K + predicted
        self._samples: tuple[Tensor, Tensor, Tensor] | None = None  # images, predicted, true

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        fitting = trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking
        # The same answer on every rank: each one counts, and all of them sum the counts.
        has_writer = any(isinstance(x, TensorBoardLogger) for x in trainer.loggers)
        due = self._validations % self.every_n_validations == 0
        self._drawing = fitting and has_writer and due and not self._no_logits
        self._counts = None
        self._samples = None

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not self._drawing or dataloader_idx:
            return
        if not (isinstance(outputs, Tensor) and outputs.ndim == 2):
            # A module of the user's own under the default (classification) task: no pictures.
            log.warning(
                "callbacks.classification_images is off: %s.validation_step returned %s, not the"
                " logits (batch, classes); return them for a confusion matrix, or set"
                " callbacks.classification_images=null to silence this",
                type(pl_module).__name__,
                type(outputs).__name__,
            )
            self._drawing, self._no_logits = False, True
            return
        images, targets = batch[0], batch[1]
        classes = outputs.size(1)
        predicted = outputs.detach().argmax(dim=1)  # (B,)
        if self._counts is None:
            self._counts = torch.zeros(classes * classes, dtype=torch.long, device=outputs.device)
        cells = targets * classes + predicted
        self._counts.index_add_(0, cells, torch.ones_like(cells))
        if batch_idx == 0 and trainer.is_global_zero:
            n = self.num_samples
            self._samples = (images[:n].detach().clone(), predicted[:n], targets[:n].clone())

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            self._validations += 1
        if not self._drawing or self._counts is None:
            return
        counts = self._counts
        if trainer.world_size > 1:  # every rank counted its own share of the validation set
            counts = trainer.strategy.reduce(counts, reduce_op="sum")
        if not trainer.is_global_zero:
            return
        classes = math.isqrt(counts.numel())
        matrix = counts.view(classes, classes).cpu().numpy()
        pictures = {"val/confusion_matrix": draw_confusion_matrix(matrix)}
        if self._samples is not None:
            images, predicted, targets = (t.cpu() for t in self._samples)
            pictures["val/predictions"] = draw_predictions(images, predicted, targets)
        # The step Lightning writes this validation's scalars at, so both line up.
        step = trainer.fit_loop.epoch_loop._batches_that_stepped
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                for tag, picture in pictures.items():
                    logger.experiment.add_image(tag, picture, global_step=step, dataformats="HWC")
        self._counts = self._samples = None


def draw_confusion_matrix(matrix: np.ndarray) -> np.ndarray:
    """(K, K) counts, rows true and columns predicted, as an (H, W, 3) uint8 picture."""
    from matplotlib.figure import Figure  # imported when first drawn: it takes 1-2 s

    classes = len(matrix)
    rows = matrix.sum(axis=1, keepdims=True)
    shares = matrix / np.maximum(rows, 1)  # what became of each true class
    side = min(max(4.0, 0.45 * classes + 1.5), 16.0)
    figure = Figure(figsize=(side, side), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    axes.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0)
    accuracy = np.trace(matrix) / max(matrix.sum(), 1)
    axes.set(xlabel="predicted", ylabel="true", title=f"accuracy {accuracy:.2%}")
    if classes <= MAX_ANNOTATED_CLASSES:
        axes.set_xticks(range(classes))
        axes.set_yticks(range(classes))
        for true in range(classes):
            for predicted in range(classes):
                dark = shares[true, predicted] > 0.5
                axes.text(
                    predicted,
                    true,
                    str(matrix[true, predicted]),
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if dark else "black",
                )
    return _pixels(figure)


def draw_predictions(images: Tensor, predicted: Tensor, targets: Tensor) -> np.ndarray:
    """Images (N, C, H, W) (C: 1 or 3, any scale) in a grid, each titled with its predicted class,
    green where right, red with the true class where wrong; an (H, W, 3) uint8 picture."""
    from matplotlib.figure import Figure

    count = len(images)
    columns = math.ceil(math.sqrt(count))
    rows = math.ceil(count / columns)
    figure = Figure(figsize=(1.6 * columns, 1.8 * rows), dpi=100, layout="constrained")
    for i, (image, guess, truth) in enumerate(zip(images, predicted, targets, strict=True)):
        axes = figure.add_subplot(rows, columns, i + 1)
        pixels = image.float()
        # Normalised inputs: each image stretched to [0, 1] for display.
        pixels = (pixels - pixels.min()) / (pixels.max() - pixels.min()).clamp_min(1e-8)
        shown = pixels.permute(1, 2, 0).numpy()  # (H, W, C)
        axes.imshow(shown[..., 0] if shown.shape[2] == 1 else shown, cmap="gray")
        right = int(guess) == int(truth)
        title = f"{int(guess)}" if right else f"{int(guess)} (true {int(truth)})"
        axes.set_title(title, fontsize=9, color="green" if right else "red")
        axes.axis("off")
    return _pixels(figure)


def _pixels(figure: Any) -> np.ndarray:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()  # (H, W, 3) uint8
