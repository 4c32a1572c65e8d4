"""`python -m volt.eval ckpt_path=...`: rebuild a run from its checkpoint and test or predict."""

import csv
import logging
from pathlib import Path

import hydra
import torch
from hydra.errors import InstantiationException
from omegaconf import DictConfig, OmegaConf

from volt.build import build_evaluation
from volt.checkpointing import read_stored_config
from volt.config import CONF_DIR
from volt.config.run_dirs import remove_run_dir_made_here
from volt.config.validation import check_config, check_machine
from volt.console import describe_setup, exit_on_config_error, print_result, route_lightning_logs
from volt.data.downloads import DataNotFoundError
from volt.errors import ConfigError
from volt.runs.records import write_metrics

log = logging.getLogger("volt")


def load_run_config(ckpt_path: str) -> DictConfig:
    try:
        return OmegaConf.create(read_stored_config(Path(ckpt_path)))
    except Exception as error:  # unreadable, truncated, or not volt's: the user needs the file name
        raise ConfigError(f"ckpt_path={ckpt_path!r} cannot be used: {error}") from error


def write_predictions(batches: list[dict[str, torch.Tensor]], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["index", "prediction", "probability", "target"])
        index = 0
        for batch in batches:
            for pred, prob, target in zip(
                batch["pred"], batch["prob"], batch["target"], strict=True
            ):
                writer.writerow([index, int(pred), f"{float(prob):.6f}", int(target)])
                index += 1


def evaluate(cfg: DictConfig) -> dict[str, float]:
    check_config(cfg)
    check_machine(cfg)
    stored = load_run_config(cfg.ckpt_path)
    route_lightning_logs()
    run = build_evaluation(cfg, stored)
    log.info(describe_setup(run.trainer, None))
    metrics: dict[str, float] = {}
    for result in run.trainer.test(run.model, datamodule=run.datamodule, ckpt_path=cfg.ckpt_path):
        metrics.update({k: float(v) for k, v in result.items()})
    run_dir = Path(cfg.paths.output_dir)
    if cfg.mode == "predict":
        batches = run.trainer.predict(run.model, datamodule=run.datamodule)
        write_predictions(batches, run_dir / "predictions.csv")  # type: ignore[arg-type]
        log.info("predictions written to %s", run_dir / "predictions.csv")
    write_metrics(run_dir, metrics, checkpoint=str(Path(cfg.ckpt_path).resolve()))
    print_result(metrics, run_dir)
    return metrics


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="eval")
def main(cfg: DictConfig) -> None:
    try:
        evaluate(cfg)
    except (ConfigError, DataNotFoundError, InstantiationException) as error:
        # Refused before it evaluated: the run directory Hydra made holds nothing to keep.
        remove_run_dir_made_here(Path(cfg.paths.output_dir))
        exit_on_config_error(error)


if __name__ == "__main__":
    main()
