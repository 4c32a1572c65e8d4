"""Predictions to a CSV file as they are made, whatever the task returns from `predict_step`."""

import csv
import io
import json
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import BasePredictionWriter

from volt.folder_files import replacing


def _cell(value: Any) -> Any:
    """One sample's value as a CSV cell: numbers as numbers, text as text, arrays as JSON."""
    if isinstance(value, torch.Tensor):
        value = value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list | tuple | dict):
        return json.dumps(value)
    return value


def prediction_rows(prediction: Any) -> list[dict[str, Any]]:
    """A batch of predictions as one row per sample.

    `predict_step` may return a tensor (B, ...), a sequence of B items (e.g. generated strings),
    or a mapping of such, one column per key.
    """
    columns = prediction if isinstance(prediction, Mapping) else {"prediction": prediction}
    sizes = {key: len(value) for key, value in columns.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(
            f"predict_step returned columns of different lengths {sizes}: return one value per "
            "sample in every column"
        )
    size = next(iter(sizes.values()), 0)
    return [{key: _cell(value[i]) for key, value in columns.items()} for i in range(size)]


class CSVPredictionWriter(BasePredictionWriter):
    """Writes `predictions.csv` (`predictions_rank<r>.csv` under several processes) batch by
    batch, so predicting over a large data set never holds every output in memory.

    The first column is the sample's index in the prediction data set when the loader's sampler
    tells it (Lightning's `batch_indices`), else a running count.

    The rows go to a new file beside it, renamed over it when prediction ends (volt.folder_files):
    the output folder can be a handed-over run's, and a link at the file's name is replaced, not
    written through. A prediction that fails or is stopped leaves no partial file.
    """

    def __init__(self, output_dir: str | Path) -> None:
        super().__init__(write_interval="batch")
        self.output_dir = Path(output_dir)
        self._file: IO[str] | None = None
        self._staged = ExitStack()
        self._writer: csv.DictWriter[str] | None = None
        self._count = 0
        self.path: Path | None = None

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        suffix = f"_rank{trainer.global_rank}" if trainer.world_size > 1 else ""
        self.path = self.output_dir / f"predictions{suffix}.csv"
        self.output_dir.mkdir(parents=True, exist_ok=True)
        binary = self._staged.enter_context(replacing(self.path, self.output_dir))
        self._file = self._staged.enter_context(io.TextIOWrapper(binary, "utf-8", newline=""))
        self._writer = None
        self._count = 0

    def write_on_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        prediction: Any,
        batch_indices: Sequence[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        assert self._file is not None, "on_predict_start opens the file"
        rows = prediction_rows(prediction)
        indices = list(batch_indices) if batch_indices else None
        if indices is None or len(indices) != len(rows):
            indices = list(range(self._count, self._count + len(rows)))
        self._count += len(rows)
        for index, row in zip(indices, rows, strict=True):
            if self._writer is None:
                self._writer = csv.DictWriter(self._file, fieldnames=["index", *row])
                self._writer.writeheader()
            self._writer.writerow({"index": index, **row})

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._staged.close()  # the file renamed into place
        self._file = None

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        # The block `replacing` opened ends on the error: its file is removed.
        self._staged.__exit__(type(exception), exception, exception.__traceback__)
        self._file = None
