"""ClassificationImages: a classifier's confusion matrix and sample predictions in a real
TensorBoard event file, counted on the device without a host sync per validation batch."""

import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from omegaconf import DictConfig
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import Tensor

import volt.callbacks.images as images_module
from tests.sync_counter import SyncCounter, per_step, read_counts
from tests.tiny_regression import TinyRegression
from volt.build import build_callbacks
from volt.callbacks.images import ClassificationImages
from volt.data.digits import DigitsDataModule
from volt.models.classifier import Classifier
from volt.nets.mlp import MLP

TRAIN_BATCHES, VAL_BATCHES, BATCH = 4, 3, 32


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def classifier() -> tuple[Classifier, DigitsDataModule]:
    pl.seed_everything(0, verbose=False)
    data = DigitsDataModule(batch_size=BATCH, on_device=False)
    net = MLP(in_shape=(1, 8, 8), num_classes=10, hidden_sizes=[32])
    return Classifier(net, 10, optimizer=partial(torch.optim.AdamW, lr=3e-3)), data


def trainer(root: Path, callbacks: list[pl.Callback], epochs: int, val_batches: int) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        limit_train_batches=TRAIN_BATCHES,
        limit_val_batches=val_batches,
        log_every_n_steps=1,
        callbacks=callbacks,
        logger=TensorBoardLogger(root, name="", version=""),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def test_confusion_matrix_and_predictions_of_every_nth_validation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn: list[np.ndarray] = []
    draw = images_module.draw_confusion_matrix

    def recorded(matrix: np.ndarray) -> np.ndarray:
        drawn.append(matrix)
        return draw(matrix)

    monkeypatch.setattr(images_module, "draw_confusion_matrix", recorded)
    model, data = classifier()
    callback = ClassificationImages(num_samples=6, every_n_validations=2)
    trainer(tmp_path, [callback], epochs=3, val_batches=VAL_BATCHES).fit(model, datamodule=data)

    events = EventAccumulator(str(tmp_path), size_guidance={"images": 0})
    events.Reload()
    val_steps = [e.step for e in events.Scalars("val/acc")]
    # Validations 1 and 3 of 3 (not the sanity check), at their scalars' steps.
    for tag in ("val/confusion_matrix", "val/predictions"):
        assert [e.step for e in events.Images(tag)] == val_steps[::2], tag
    assert len(drawn) == 2

    # The last one was drawn with the final weights: count its predictions again here.
    model.eval()
    expected = np.zeros((10, 10), dtype=np.int64)
    with torch.no_grad():
        for i, (x, y) in enumerate(data.val_dataloader()):
            if i == VAL_BATCHES:
                break
            for true, predicted in zip(y, model(x).argmax(1), strict=True):
                expected[true, predicted] += 1
    assert expected.sum() == VAL_BATCHES * BATCH
    np.testing.assert_array_equal(drawn[-1], expected)
    accuracy = np.trace(expected) / expected.sum()
    assert events.Scalars("val/acc")[-1].value == pytest.approx(accuracy)


def test_the_last_validation_is_drawn_at_the_end_of_the_fit_when_not_due(tmp_path: Path) -> None:
    model, data = classifier()
    callback = ClassificationImages(num_samples=4, every_n_validations=3)
    trainer(tmp_path, [callback], epochs=3, val_batches=1).fit(model, datamodule=data)

    events = EventAccumulator(str(tmp_path), size_guidance={"images": 0})
    events.Reload()
    val_steps = [e.step for e in events.Scalars("val/acc")]
    # Validation 1 (due), then 3, the last, when the fit ends; not 2.
    for tag in ("val/confusion_matrix", "val/predictions"):
        assert [e.step for e in events.Images(tag)] == [val_steps[0], val_steps[2]], tag


def test_pictures_are_images_of_the_expected_size() -> None:
    matrix = np.arange(100).reshape(10, 10)
    picture = images_module.draw_confusion_matrix(matrix)
    assert picture.dtype == np.uint8 and picture.shape[2] == 3
    assert picture.std() > 10  # something was drawn
    grid = images_module.draw_predictions(
        torch.rand(5, 3, 16, 16), torch.tensor([1, 2, 3, 4, 5]), torch.tensor([1, 0, 3, 0, 5])
    )
    assert grid.dtype == np.uint8 and grid.shape[2] == 3


def pixels_of(picture: np.ndarray, colour: Sequence[int]) -> int:
    return int((picture == np.array(colour, dtype=np.uint8)).all(axis=-1).sum())


def tinted(picture: np.ndarray, channel: int) -> int:
    """Pixels in which one channel leads the others: text of that colour (anti-aliased, so
    rarely exactly it) on grey images and a white ground."""
    rgb = picture.astype(int)
    others = np.delete(rgb, channel, axis=-1).max(axis=-1)
    return int((rgb[..., channel] > others + 60).sum())


def test_the_confusion_matrix_colours_each_cell_by_its_share_of_the_row() -> None:
    """Above MAX_ANNOTATED_CLASSES no text: every cell is exactly its colour, so the pixels of
    each colour count the cells: a right row is dark blue on its diagonal, white elsewhere."""
    classes = images_module.MAX_ANNOTATED_CLASSES + 5
    cell = images_module.MATRIX_SIDE // classes
    matrix = 7 * np.eye(classes, dtype=np.int64)
    matrix[0] = 0
    matrix[0, 1] = 4  # true class 0 always taken for 1
    picture = images_module.draw_confusion_matrix(matrix)
    dark, white = images_module.BLUES[-1], images_module.BLUES[0]
    assert pixels_of(picture, dark) == classes * cell * cell
    assert pixels_of(picture, white) == (classes * classes - classes) * cell * cell


def test_the_confusion_matrix_of_few_classes_shows_counts_in_cells() -> None:
    matrix = np.array([[30, 0], [0, 30]])
    picture = images_module.draw_confusion_matrix(matrix)
    cell = images_module.CELL
    dark = pixels_of(picture, images_module.BLUES[-1])
    # The two diagonal cells, less the pixels of their counts, written in white.
    assert 1.5 * cell * cell < dark < 2 * cell * cell


def test_the_prediction_grid_titles_right_in_green_and_wrong_in_red() -> None:
    def grid(predicted: list[int], targets: list[int]) -> np.ndarray:
        images = torch.randn(len(predicted), 1, 8, 8)
        return images_module.draw_predictions(
            images, torch.tensor(predicted), torch.tensor(targets)
        )

    green, red = 1, 0
    right = grid([1, 2, 3, 4], [1, 2, 3, 4])
    assert tinted(right, green) > 0 and tinted(right, red) == 0
    one_wrong = grid([1, 2, 3, 4], [1, 2, 3, 9])
    assert tinted(one_wrong, red) > 0
    assert tinted(one_wrong, green) < tinted(right, green)
    # 8x8 images enlarged to TILE pixels, in 2 columns: wider than two tiles.
    assert one_wrong.shape[1] > 2 * images_module.TILE


def test_pictures_are_drawn_without_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """matplotlib took about 0.5 s a validation, most of the default run's time on a CPU."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # any import of it now fails
    images_module.draw_confusion_matrix(np.eye(3, dtype=np.int64))
    images_module.draw_predictions(
        torch.rand(2, 3, 4, 4), torch.tensor([0, 1]), torch.tensor([0, 0])
    )


def counted_syncs(root: Path, val_batches: int) -> list[dict[str, int]]:
    """What images.py read on the host in each of the 4 steps of one epoch; the validation at
    its end falls in the last step's count."""
    model, data = classifier()
    counter = SyncCounter(str(root / "syncs.json"), start_step=0, steps=TRAIN_BATCHES)
    callbacks = [ClassificationImages(num_samples=4), counter]
    trainer(root, callbacks, epochs=1, val_batches=val_batches).fit(model, datamodule=data)
    record = read_counts(root / "syncs.json", rank=0)
    return per_step(record, "syncs", "volt/callbacks/images.py")


def test_the_host_reads_the_counts_once_per_validation_not_per_batch(tmp_path: Path) -> None:
    one = counted_syncs(tmp_path / "one", val_batches=1)
    three = counted_syncs(tmp_path / "three", val_batches=3)
    assert one[:-1] == [{}] * (TRAIN_BATCHES - 1)  # training steps: nothing
    assert one[-1]  # the drawing at the validation's end
    assert three == one


class NoLogits(TinyRegression):
    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.log("val/loss", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))


class Predictions(TinyRegression):
    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self.layer(batch[0]).squeeze(1)  # (B,): not logits (B, classes)


@pytest.mark.parametrize(("module", "warned"), [(NoLogits, False), (Predictions, True)])
def test_a_module_that_returns_no_logits_trains_without_pictures(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, module: type[TinyRegression], warned: bool
) -> None:
    """A module of the user's own under the default (classification) task: no pictures, the fit
    goes on; one line only for a module that returns a tensor that is not the logits (one that
    returns nothing, as Lightning's docs write validation_step, is no classifier to warn about)."""
    data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    run = trainer(tmp_path, [ClassificationImages()], epochs=2, val_batches=1)
    with caplog.at_level(logging.WARNING, logger="volt.callbacks.images"):
        run.fit(module(), loader, loader)
    lines = [r.getMessage() for r in caplog.records if r.name == "volt.callbacks.images"]
    assert len(lines) == int(warned)
    assert all(f"{module.__name__}.validation_step returned Tensor, not" in line for line in lines)
    assert run.current_epoch == 2


def test_every_n_validations_null_trains_without_pictures(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The README's `callbacks.classification_images.every_n_validations=null`: no pictures, no
    warning (it ended the run with a TypeError, issue #36)."""
    model, data = classifier()
    run = trainer(tmp_path, [ClassificationImages(every_n_validations=None)], 2, VAL_BATCHES)
    with caplog.at_level(logging.WARNING, logger="volt.callbacks.images"):
        run.fit(model, datamodule=data)
    events = EventAccumulator(str(tmp_path), size_guidance={"images": 0})
    events.Reload()
    assert len(events.Scalars("val/acc")) == 2
    assert events.Tags()["images"] == []
    assert not [r for r in caplog.records if r.name == "volt.callbacks.images"]


def test_the_shipped_config_takes_every_n_validations_null(
    compose_config: Callable[..., DictConfig],
) -> None:
    key = "callbacks.classification_images.every_n_validations"
    cfg = compose_config("train", [f"{key}=null"])
    built = build_callbacks(cfg.callbacks, trusted=())
    [callback] = [c for c in built if isinstance(c, ClassificationImages)]
    assert callback.every_n_validations is None


@pytest.mark.parametrize("value", [0, -1, 2.5, "often", True])
def test_a_wrong_every_n_validations_names_the_key_the_value_and_the_fix(value: object) -> None:
    with pytest.raises(ValueError) as refused:
        ClassificationImages(every_n_validations=value)  # type: ignore[arg-type]
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        f"callbacks.classification_images.every_n_validations={value!r}: must be a whole"
        " number of at least 1"
    )
    assert "or null (no pictures)" in message


@pytest.mark.parametrize("value", [0, 2.5, None])
def test_a_wrong_num_samples_names_the_key_the_value_and_the_fix(value: object) -> None:
    with pytest.raises(ValueError, match=rf"num_samples={value!r}: must be a whole number"):
        ClassificationImages(num_samples=value)  # type: ignore[arg-type]
