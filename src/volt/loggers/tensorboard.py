"""`logger=tensorboard`: Lightning's TensorBoardLogger, less a wait on every logging step.

Lightning 2.6.6 calls `logger.save()` after each `log_metrics`, and TensorBoardLogger's `save`
flushes the event writer: it waits until the writer's thread has written every queued event and
the file is flushed, then asks the file system whether hparams.yaml exists. That happens right
after Lightning's `.item()` of the logged values has emptied the GPU's queue, so the GPU idles
through it (Lightning-AI/pytorch-lightning#20551, open). Here the writer's own thread flushes the
file every `flush_secs` (conf/logger/tensorboard.yaml), the end of a fit or a failed run flushes
and closes it as before, and hparams.yaml is written as Lightning writes it, once. Delete this
module when Lightning stops flushing loggers at every logging step.
"""

import os

from lightning.fabric.utilities.cloud_io import _is_dir
from lightning.pytorch.core.saving import save_hparams_to_yaml
from lightning.pytorch.loggers import TensorBoardLogger as LightningTensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
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
