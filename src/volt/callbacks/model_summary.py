"""The model in one line as a fit starts: its parameters, how many train, their size."""

import logging
import warnings
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelSummary
from lightning.pytorch.utilities.model_summary import get_human_readable_count

log = logging.getLogger(__name__)


class OneLineModelSummary(ModelSummary):
    """Lightning's ModelSummary (rank zero, at the start of each fit), said in one log line
    instead of a table of a row per module and seven lines under it, with a FLOPs column that
    Lightning 2.6.6 fills with 0 unless it measured them: about a third of a default run's
    console. Lightning's table: `callbacks.model_summary._target_=
    lightning.pytorch.callbacks.RichModelSummary`."""

    def _summary(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> Any:
        with warnings.catch_warnings():
            # Lightning 2.6.6 warns that it cannot size a "-mixed" precision's weights and counts
            # 32 bits each: mixed precision keeps float32 weights, so the size is right.
            warnings.filterwarnings("ignore", message=r"Precision \S+-mixed is not supported")
            return super()._summary(trainer, pl_module)

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        columns = dict(summary_data)
        rows = zip(columns["Name"], columns["Type"], columns["Params"], strict=True)
        # The top-level modules that hold parameters, as the table names them: "net: MLP"
        top = [
            f"{name}: {kind}"
            for name, kind, params in rows
            if "." not in name and params.strip() != "0"
        ]
        log.info(
            "model: %s parameters (%s trainable, %.1f MB)%s",
            get_human_readable_count(total_parameters),
            get_human_readable_count(trainable_parameters),
            model_size,
            f"; {', '.join(top[:4])}{', ...' if len(top) > 4 else ''}" if top else "",
        )
