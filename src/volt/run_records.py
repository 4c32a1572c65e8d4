"""What a run leaves in its directory besides checkpoints: resolved config, metrics.json, and the
TensorBoard hparams tab filled with the run's final metrics."""

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

HPARAM_GROUPS = ("data", "model", "trainer", "compile", "precision", "seed")
METRICS_FILE = "metrics.json"


@rank_zero_only
def save_resolved_config(cfg: DictConfig, run_dir: Path) -> None:
    """.hydra/config.yaml keeps interpolations; this copy shows the values the run really used."""
    (run_dir / "config_resolved.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))


def flat_hparams(cfg: DictConfig) -> dict[str, Any]:
    """`model.optimizer.lr: 0.003`, ...: scalars as they are, lists as text, for the hparams tab."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif value is None or isinstance(value, bool | int | float | str):
            flat[prefix] = value if value is not None else "null"
        else:
            flat[prefix] = str(value)

    container = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(container, dict)
    for group in HPARAM_GROUPS:
        if group in container:
            walk(group, container[group])
    return flat


@rank_zero_only
def log_final_hparams(
    loggers: Sequence[Logger], cfg: DictConfig, metrics: Mapping[str, float]
) -> None:
    """One hparams record per run, written after test so it carries real results."""
    params = flat_hparams(cfg)
    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):
            # TensorBoard links hparams to metrics in one record; the hparams tab shows both.
            logger.log_hyperparams(params, metrics=dict(metrics))
        else:
            logger.log_hyperparams(params)
        logger.save()


@rank_zero_only
def write_metrics(run_dir: Path, metrics: Mapping[str, float], **details: Any) -> None:
    record = {"status": "completed", "metrics": dict(metrics), **details}
    (run_dir / METRICS_FILE).write_text(json.dumps(record, indent=2) + "\n")
