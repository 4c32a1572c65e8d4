"""`python train.py [overrides]`: compose the config, check it, build the objects, fit, test."""

import logging
from pathlib import Path

import hydra
import lightning.pytorch as pl
from omegaconf import DictConfig

from volt.build import build_training
from volt.config import CONF_DIR
from volt.config.hydra_callbacks import exit_on_config_error, in_multirun
from volt.config.validation import ConfigError, check_config, check_machine, check_resolves
from volt.console import describe_setup, print_config_tree, print_result, route_lightning_logs
from volt.run_records import log_final_hparams, save_resolved_config, write_metrics

log = logging.getLogger("volt")


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit and test one run; returns its final metrics (validation best and test)."""
    check_config(cfg)
    check_resolves(cfg)
    check_machine(cfg)
    route_lightning_logs()
    run_dir = Path(cfg.paths.output_dir)
    save_resolved_config(cfg, run_dir)
    print_config_tree(cfg, save_to=run_dir / "config_tree.txt")
    if cfg.seed is not None:
        pl.seed_everything(cfg.seed, workers=True)

    run = build_training(cfg)
    log.info(describe_setup(run.trainer, cfg.compile.mode))
    run.trainer.fit(run.model, datamodule=run.datamodule)
    metrics = {k: float(v) for k, v in run.trainer.callback_metrics.items() if k.startswith("val/")}

    # Test the best checkpoint when one was kept, else the weights as they are now.
    best = getattr(run.trainer.checkpoint_callback, "best_model_path", "")
    if cfg.test and not run.trainer.interrupted:
        for result in run.trainer.test(
            run.model, datamodule=run.datamodule, ckpt_path=best or None
        ):
            metrics.update({k: float(v) for k, v in result.items()})

    log_final_hparams(run.trainer.loggers, cfg, metrics)
    write_metrics(run_dir, metrics, best_checkpoint=best)
    print_result(metrics, run_dir)
    return metrics


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def main(cfg: DictConfig) -> float | None:
    try:
        metrics = train(cfg)
    except ConfigError as error:
        if in_multirun():
            raise  # fail this job only; the sweep goes on and its summary lists the failure
        exit_on_config_error(error)
    return metrics.get(cfg.optimized_metric) if cfg.get("optimized_metric") else None
