"""Evaluating a run from its checkpoint (`python -m volt.eval`, entry in volt.eval): rebuild it,
then test (or validate, for a module with no test_step) or predict."""

import logging
import warnings
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.utilities.model_helpers import is_overridden
from omegaconf import DictConfig

from volt.build import TrainingObjects
from volt.checkpointing import measure_checkpoint_files
from volt.config.validation import check_config, check_machine
from volt.console import (
    describe_setup,
    print_result,
    route_lightning_logs,
    silence_known_warnings,
)
from volt.errors import ConfigError
from volt.rebuild import build_evaluation, read_evaluated_run
from volt.runs.records import write_metrics

log = logging.getLogger("volt")


def evaluate(cfg: DictConfig) -> dict[str, float]:
    check_config(cfg)
    check_machine(cfg)
    measure_checkpoint_files(cfg.checkpoint_bytes)
    stored = read_evaluated_run(cfg)
    route_lightning_logs()
    silence_known_warnings()
    # Lightning 2.6 warns that the checkpoint's training callbacks (checkpointing, early stopping)
    # are absent: evaluation needs none of them, so the warning only misleads here.
    warnings.filterwarnings("ignore", message="Be aware that when using `ckpt_path`, callbacks")
    # Lightning 2.6.6 warns when a loader's sampler does not tell each batch's sample indices
    # (volt's ImageBatches): the CSVPredictionWriter then counts the rows, in the predict
    # loader's fixed order, which gives the same indices.
    warnings.filterwarnings("ignore", message="Couldn't infer the batch indices fetched from")
    run = build_evaluation(cfg, stored)
    if cfg.mode == "predict":
        check_predicts(run.model)
    log.info(describe_setup(run.trainer, cfg.compile.mode))
    metrics: dict[str, float] = {}
    # New data named on the command line may have no labels: it is predicted on, not tested.
    if cfg.mode == "test" or cfg.get("data") is None:
        metrics = test_or_validate(run, cfg.ckpt_path)
    run_dir = Path(cfg.paths.output_dir)
    if cfg.mode == "predict":
        # Written batch by batch by the CSVPredictionWriter that build_evaluation added.
        run.trainer.predict(
            run.model, datamodule=run.datamodule, ckpt_path=cfg.ckpt_path, return_predictions=False
        )
        log.info("predictions written to %s", run_dir / "predictions.csv")
    write_metrics(run_dir, metrics, checkpoint=str(Path(cfg.ckpt_path).resolve()))
    print_result(metrics, run_dir)
    return metrics


def test_or_validate(run: TrainingObjects, ckpt_path: str) -> dict[str, float]:
    """The test set's metrics, or the validation set's for a module with no test_step (one line
    says so); neither for a module with no validation_step either."""
    name = type(run.model).__name__  # verbose=False below: print_result shows the metrics once
    if is_overridden("test_step", run.model):
        results = run.trainer.test(
            run.model, datamodule=run.datamodule, ckpt_path=ckpt_path, verbose=False
        )
    elif is_overridden("validation_step", run.model):
        log.info("%s has no test_step: evaluated on the validation set", name)
        results = run.trainer.validate(
            run.model, datamodule=run.datamodule, ckpt_path=ckpt_path, verbose=False
        )
    else:
        log.info("%s has no test_step nor validation_step: nothing to evaluate", name)
        results = []
    return {k: float(v) for result in results for k, v in result.items()}


def check_predicts(model: pl.LightningModule) -> None:
    """Lightning's default predict_step calls forward; a module with neither gets one line."""
    if not is_overridden("predict_step", model) and not is_overridden("forward", model):
        raise ConfigError(
            f"mode=predict: {type(model).__name__} has neither predict_step nor forward; add"
            " one (predict_step(self, batch, batch_idx) returning the predictions), or mode=test"
        )
