"""A classifier's validation in pictures, in TensorBoard's images tab: the confusion matrix of the
whole validation set and a grid of validation images with their predicted and true labels."""

import logging
import math
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from PIL import Image, ImageDraw, ImageFont
from torch import Tensor

log = logging.getLogger(__name__)

# Above this many classes the counts no longer fit in their cells; colours alone are drawn.
MAX_ANNOTATED_CLASSES = 20
CELL = 28  # pixels a side of an annotated confusion-matrix cell
MATRIX_SIDE = 600  # pixels a side that a matrix of more classes shrinks its cells to (1 at least)
TILE = 64  # pixels a side that small images are enlarged to, in whole multiples
GAP = 4  # pixels between tiles and around the edges
# matplotlib's "Blues" (ColorBrewer's 9 steps), white for a share of 0 to dark blue for 1.
BLUES = np.array(
    [
        [247, 251, 255],
        [222, 235, 247],
        [198, 219, 239],
        [158, 202, 225],
        [107, 174, 214],
        [66, 146, 198],
        [33, 113, 181],
        [8, 81, 156],
        [8, 48, 107],
    ]
)
BLACK, WHITE = (0, 0, 0), (255, 255, 255)
RIGHT, WRONG = (0, 128, 0), (200, 0, 0)


@dataclass
class _Validation:
    """One validation's counts, summed over the ranks, and its samples, kept on rank 0 until they
    are drawn."""

    counts: Tensor  # (K * K,) int64 on the device, true * K + predicted
    samples: tuple[Tensor, Tensor, Tensor] | None  # images, predicted, true
    step: int  # the step Lightning wrote this validation's scalars at


class ClassificationImages(Callback):
    """After the 1st, (N+1)-th, (2N+1)-th ... validation during fit, N = `every_n_validations`,
    and at the end of the fit for its last validation (the final weights) if that one was not
    due: `val/confusion_matrix` (rows: true class, columns: predicted; colour: the share of the
    row, text: the count) and `val/predictions` (the first `num_samples` images of the first
    validation batch, each titled with its predicted class and, where wrong, the true one), at
    the step of that validation's scalars. `every_n_validations=None`: no pictures.

    The predictions are the argmax of what the module's `validation_step` returns: the logits
    (B, num_classes), as volt's Classifier returns them. Counts accumulate on the device in
    `index_add_` (no per-batch host sync; torch's `bincount` reads its input's maximum on the
    host) and are summed over processes once per validation; rank 0 draws them with Pillow
    (about 4 ms for both pictures of a 10-class task, 5 ms more for TensorBoard to encode them;
    matplotlib took 0.5 s) and writes them. Without a TensorBoard logger nothing is counted or
    drawn.
    """

    def __init__(self, num_samples: int = 16, every_n_validations: int | None = 5) -> None:
        if not _whole_at_least_1(num_samples):
            raise ValueError(
                f"callbacks.classification_images.num_samples={num_samples!r}: must be a whole"
                " number of at least 1 (the images in val/predictions), e.g. =16"
            )
        if every_n_validations is not None and not _whole_at_least_1(every_n_validations):
            raise ValueError(
                "callbacks.classification_images.every_n_validations="
                f"{every_n_validations!r}: must be a whole number of at least 1 (=5: after"
                " every 5th validation and the last) or null (no pictures)"
            )
        self.num_samples = num_samples
        self.every_n_validations = every_n_validations
        self._validations = 0  # validations counted during fit so far (not the sanity check)
        self._counting = False
        self._due = False  # this validation is drawn as soon as it ends
        self._no_logits = False  # the module's validation_step returns no logits: never draws
        self._counts: Tensor | None = None  # (K * K,) int64 on the device, true * K + predicted
        self._samples: tuple[Tensor, Tensor, Tensor] | None = None  # images, predicted, true
        self._undrawn: _Validation | None = None  # the latest validation, if not drawn yet

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        fitting = trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking
        # The same answer on every rank: each one counts, and all of them sum the counts.
        has_writer = any(isinstance(x, TensorBoardLogger) for x in trainer.loggers)
        every = self.every_n_validations
        # Every validation is counted (a few kernels a batch), as any may turn out the last.
        self._counting = fitting and has_writer and every is not None and not self._no_logits
        self._due = self._counting and every is not None and self._validations % every == 0
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
        if not self._counting or dataloader_idx:
            return
        if not (isinstance(outputs, Tensor) and outputs.ndim == 2):
            # A module of the user's own under the default (classification) task: no pictures.
            # One that returns nothing is no classifier to warn about (Lightning's docs' modules).
            log.log(
                logging.WARNING if isinstance(outputs, Tensor) else logging.DEBUG,
                "callbacks.classification_images is off: %s.validation_step returned %s, not the"
                " logits (batch, classes); return them for a confusion matrix, or set"
                " callbacks.classification_images=null to silence this",
                type(pl_module).__name__,
                type(outputs).__name__,
            )
            self._counting, self._no_logits = False, True
            self._undrawn = None
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
        if not self._counting or self._counts is None:
            return
        self._validations += 1
        counts = self._counts
        if trainer.world_size > 1:  # every rank counted its own share of the validation set
            counts = trainer.strategy.reduce(counts, reduce_op="sum")
        self._counts = None
        if not trainer.is_global_zero:
            return
        # The step Lightning writes this validation's scalars at, so both line up.
        step = trainer.fit_loop.epoch_loop._batches_that_stepped
        validation = _Validation(counts, self._samples, step)
        self._samples = None
        if self._due:
            self._draw(trainer, validation)
        self._undrawn = None if self._due else validation

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._undrawn is not None:  # rank 0's, the fit's last validation
            self._draw(trainer, self._undrawn)
            self._undrawn = None

    def _draw(self, trainer: pl.Trainer, validation: _Validation) -> None:
        classes = math.isqrt(validation.counts.numel())
        matrix = validation.counts.view(classes, classes).cpu().numpy()
        pictures = {"val/confusion_matrix": draw_confusion_matrix(matrix)}
        if validation.samples is not None:
            images, predicted, targets = (t.cpu() for t in validation.samples)
            pictures["val/predictions"] = draw_predictions(images, predicted, targets)
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                for tag, picture in pictures.items():
                    logger.experiment.add_image(
                        tag, picture, global_step=validation.step, dataformats="HWC"
                    )


def _whole_at_least_1(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def draw_confusion_matrix(matrix: np.ndarray) -> np.ndarray:
    """(K, K) counts, rows true and columns predicted, as an (H, W, 3) uint8 picture: each cell
    coloured by its share of the row (what became of each true class), with its count and the
    class numbers where K <= MAX_ANNOTATED_CLASSES."""
    classes = len(matrix)
    annotated = classes <= MAX_ANNOTATED_CLASSES
    cell = CELL if annotated else max(1, MATRIX_SIDE // classes)
    side = classes * cell
    shares = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    accuracy = np.trace(matrix) / max(matrix.sum(), 1)
    title = f"accuracy {accuracy:.2%} (rows: true, columns: predicted)"
    font = ImageFont.load_default()
    title_width, line = _text_size(title, font)
    line += GAP
    # Room for the class numbers: the columns' above the cells, the rows' to their left.
    left = _text_size(str(classes - 1), font)[0] + 2 * GAP if annotated else GAP
    top = GAP + line + (line if annotated else 0)
    width = max(left + side, GAP + title_width) + GAP
    canvas = np.full((top + side + GAP, width, 3), 255, dtype=np.uint8)
    cells = _blues(shares).repeat(cell, axis=0).repeat(cell, axis=1)  # (side, side, 3)
    canvas[top : top + side, left : left + side] = cells
    picture = Image.fromarray(canvas)
    draw = ImageDraw.Draw(picture)
    draw.text((GAP, GAP), title, fill=BLACK, font=font)
    if annotated:
        middles = [k * cell + cell // 2 for k in range(classes)]
        for k, middle in enumerate(middles):
            _centred(draw, (left + middle, top - line // 2), str(k), BLACK, font)
            _centred(draw, ((left - GAP) // 2, top + middle), str(k), BLACK, font)
        for true, y in enumerate(middles):
            for predicted, x in enumerate(middles):
                colour = WHITE if shares[true, predicted] > 0.5 else BLACK
                _centred(draw, (left + x, top + y), str(matrix[true, predicted]), colour, font)
    return np.asarray(picture)


def draw_predictions(images: Tensor, predicted: Tensor, targets: Tensor) -> np.ndarray:
    """Images (N, C, H, W) (C: 1 for grey, else the first 3 are RGB; any scale) in a grid, each
    under its predicted class, green where right, red with the true class where wrong; small
    images enlarged to about TILE pixels. An (H, W, 3) uint8 picture."""
    count, _, height, width = images.shape
    scale = max(1, TILE // max(height, width))
    tiles = _pixels(images).repeat(scale, axis=1).repeat(scale, axis=2)  # (N, H', W', 3)
    pairs = list(zip(predicted.tolist(), targets.tolist(), strict=True))
    titles = [f"{guess}" if guess == truth else f"{guess} (true {truth})" for guess, truth in pairs]
    font = ImageFont.load_default()
    sizes = [_text_size(title, font) for title in titles]
    line = max(h for _, h in sizes) + GAP
    column_width = max(tiles.shape[2], *(w for w, _ in sizes)) + GAP
    row_height = line + tiles.shape[1] + GAP
    columns = math.ceil(math.sqrt(count))
    rows = math.ceil(count / columns)
    canvas = np.full((GAP + rows * row_height, GAP + columns * column_width, 3), 255, np.uint8)
    corners = [divmod(i, columns) for i in range(count)]
    corners = [(GAP + r * row_height, GAP + c * column_width) for r, c in corners]
    for tile, (y, x) in zip(tiles, corners, strict=True):
        canvas[y + line : y + line + tile.shape[0], x : x + tile.shape[1]] = tile
    picture = Image.fromarray(canvas)
    draw = ImageDraw.Draw(picture)
    for title, (guess, truth), (y, x) in zip(titles, pairs, corners, strict=True):
        draw.text((x, y), title, fill=RIGHT if guess == truth else WRONG, font=font)
    return np.asarray(picture)


def _blues(shares: np.ndarray) -> np.ndarray:
    """Shares in [0, 1], any shape, as BLUES colours: shape + (3,) uint8."""
    steps = np.linspace(0.0, 1.0, len(BLUES))
    channels = [np.interp(shares, steps, BLUES[:, c]) for c in range(3)]
    return np.stack(channels, axis=-1).round().astype(np.uint8)


def _pixels(images: Tensor) -> np.ndarray:
    """(N, C, H, W) of any scale -> (N, H, W, 3) uint8, each image stretched to 0..255 alone (the
    inputs are normalised). numpy, not torch: on a 2-core CPU shared with other work, torch's
    thread pool took milliseconds over these few tiny ops, waiting for the busy core."""
    pixels = images.float().numpy()
    low = pixels.min(axis=(1, 2, 3), keepdims=True)
    high = pixels.max(axis=(1, 2, 3), keepdims=True)
    pixels = (pixels - low) / np.maximum(high - low, 1e-8)
    rgb = pixels[:, :1].repeat(3, axis=1) if pixels.shape[1] < 3 else pixels[:, :3]
    return (rgb * 255).round().astype(np.uint8).transpose(0, 2, 3, 1)  # (N, H, W, 3)


def _text_size(text: str, font: Any) -> tuple[int, int]:
    left, top, right, bottom = font.getbbox(text)
    return math.ceil(right - left), math.ceil(bottom - top)


def _centred(
    draw: ImageDraw.ImageDraw, centre: tuple[int, int], text: str, fill: tuple[int, ...], font: Any
) -> None:
    left, top, right, bottom = font.getbbox(text)
    draw.text((centre[0] - (left + right) / 2, centre[1] - (top + bottom) / 2), text, fill, font)
