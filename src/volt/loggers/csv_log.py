"""`logger=csv`: Lightning's CSVLogger, whose metrics.csv a continued run (`name=...`) keeps.

Lightning 2.6.6 deletes the metrics.csv it finds in its folder when it starts writing (with a
warning that previous log files will be deleted), so a resumed run's file held the last attempt
alone. Here the rows are appended: each attempt's steps follow the last, those logged after the
checkpoint it resumed from logged again. Delete this module when Lightning appends on resume.
"""

import csv
import os
from pathlib import Path

from lightning.fabric.loggers.csv_logs import _ExperimentWriter
from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment

from volt.folder_files import open_regular

HEADER_LIMIT = 64 * 1024  # bytes of the header line read: the columns of a run's metrics


class _AppendingWriter(ExperimentWriter):
    def _check_log_dir_exists(self) -> None:
        # In place of Lightning's, which deletes metrics.csv: its columns are read, so the rows to
        # come are appended under them (Lightning rewrites the file when a column is new).
        path = Path(self.metrics_file_path)
        if path.is_file():
            with os.fdopen(open_regular(path, path.parent, os.O_RDONLY), newline="") as file:
                self.metrics_keys = next(csv.reader([file.readline(HEADER_LIMIT)]), [])


class CSVLogger(LightningCSVLogger):
    @property
    @rank_zero_experiment
    def experiment(self) -> _ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment
