"""`logger=tensorboard`: Lightning's TensorBoardLogger, less a wait on every logging step and an
event per number.

Lightning 2.6.6 calls `logger.save()` after each `log_metrics`, and TensorBoardLogger's `save`
flushes the event writer: it waits until the writer's thread has written every queued event and
the file is flushed, then asks the file system whether hparams.yaml exists. That happens right
after Lightning's `.item()` of the logged values has emptied the GPU's queue, so the GPU idles
through it (Lightning-AI/pytorch-lightning#20551, open). Here the writer's own thread flushes the
file every `flush_secs` (conf/logger/tensorboard.yaml), the end of a fit or a failed run flushes
and closes it as before, and hparams.yaml is written as Lightning writes it, once. Delete this
module when Lightning stops flushing loggers at every logging step.

Lightning also writes each number of a `log_metrics` call as an event of its own (`add_scalar`),
and every event costs the host its serialization, a checksum computed in pure Python (tensorboard
without TensorFlow) and an append to the file on the writer's thread, which holds the
interpreter's lock meanwhile: 59 us a number on an H200's host, 136 us for three against 48 us for
one event of three (torch 2.11, 2026-11-29). Here one call's numbers go into one event; TensorBoard
reads its values as it reads single ones. Keep this part until Lightning writes a call's numbers
together.
"""

import os
from collections.abc import Mapping
from typing import Any

from lightning.fabric.utilities.cloud_io import _is_dir
from lightning.fabric.utilities.logger import _add_prefix
from lightning.pytorch.core.saving import save_hparams_to_yaml
from lightning.pytorch.loggers import TensorBoardLogger as LightningTensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from tensorboard.compat.proto.summary_pb2 import Summary
from torch import Tensor
from typing_extensions import override


class TensorBoardLogger(LightningTensorBoardLogger):
    _hparams_file_written = False

    @override
    @rank_zero_only
    def save(self) -> None:
        if self._hparams_file_written:
            return
        hparams_file = os.path.join(self.log_dir, self.NAME_HPARAMS_FILE)
        if _is_dir(self._fs, self.log_dir) and not self._fs.isfile(hparams_file):
            save_hparams_to_yaml(hparams_file, self.hparams)
        self._hparams_file_written = self._fs.isfile(hparams_file)

    @override
    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        groups = {name: value for name, value in metrics.items() if isinstance(value, dict)}
        if groups:  # add_scalars: a file of its own per group, as Lightning writes them
            super().log_metrics(groups, step)  # type: ignore[arg-type]  # Lightning writes dicts
        numbers = {name: value for name, value in metrics.items() if name not in groups}
        values = []
        for name, value in _add_prefix(numbers, self._prefix, self.LOGGER_JOIN_CHAR).items():
            try:
                if isinstance(value, Tensor) and value.numel() != 1:
                    raise TypeError("more than one element")
                number = float(value.item() if isinstance(value, Tensor) else value)
            except (TypeError, ValueError) as error:
                raise ValueError(
                    f"logger=tensorboard cannot write {name}={value!r}: log a number, a"
                    " one-element tensor or a dict of them"
                ) from error
            values.append(Summary.Value(tag=name, simple_value=number))
        if values:
            # torch's SummaryWriter (torch 2.11 to 2.14) gives its event file's writer only
            # through this method; add_scalar goes the same way, one value at a time.
            writer = self.experiment._get_file_writer()
            writer.add_summary(Summary(value=values), global_step=step)
