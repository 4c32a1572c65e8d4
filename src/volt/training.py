"""One training run, given its composed config: check, record, build, fit, test.

Rank 0 runs it from `volt.train` (under Hydra), the extra DDP ranks from `volt.rank` (from the run's
resolved config): both call `train` here, so every rank trains the same thing the same way.
"""

import logging
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from hydra.errors import InstantiationException
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.model_helpers import is_overridden
from omegaconf import DictConfig

from volt.build import TrainingObjects, build_training
from volt.callbacks.finite_guard import NonFiniteLossError
from volt.callbacks.watched_metric import WatchedMetricCheck
from volt.checkpointing import measure_checkpoint_files
from volt.config.redaction import redacted_container
from volt.config.validation import check_config, check_machine, check_resolves
from volt.console import (
    config_tree,
    describe_setup,
    print_config_tree,
    print_result,
    route_lightning_logs,
    save_config_tree,
    silence_known_warnings,
)
from volt.data.downloads import DataNotFoundError
from volt.device_report import headline, save_device_report
from volt.errors import ConfigError, RankFailedError, TrainingOutOfMemoryError
from volt.gpu import apply_matmul_precision, explain_oom
from volt.metric_names import is_recorded, watched_value
from volt.runs import (
    check_resumed_weights,
    hparams_session,
    plan_resume,
    run_record,
    save_resolved_config,
    write_metrics,
)
from volt.runs.stop_signals import RunStopper, stop_on_signals
from volt.strategies.launcher import ranks_end_with_run
from volt.sweeps.pruning import trial_in_environment, unwatched, was_pruned
from volt.tuning import find_batch_size, find_learning_rate

log = logging.getLogger("volt")


# What a user can cause and fix: one line, exit status 2 (volt.console.exit_on_config_error).
USER_ERRORS = (
    ConfigError,
    DataNotFoundError,
    InstantiationException,
    MisconfigurationException,
    TrainingOutOfMemoryError,
    NonFiniteLossError,
)


def is_user_caused(error: Exception) -> bool:
    # Another rank's error written for the user (its out-of-memory) is one line too.
    return isinstance(error, USER_ERRORS) or (
        isinstance(error, RankFailedError) and error.user_facing
    )


def nothing_to_keep(error: Exception, run_dir: Path) -> bool:
    """A run that ended before it trained anything leaves no directory: refused, or failed
    before its first optimizer step and its first checkpoint. Not after an out-of-memory, a
    non-finite loss or another rank's failure: they come from training steps, whose rank logs
    tell what happened; nor after a step (train_run notes how many were taken)."""
    during_steps = (TrainingOutOfMemoryError, NonFiniteLossError, RankFailedError)
    if isinstance(error, during_steps) or getattr(error, "steps_taken", 0) > 0:
        return False
    return not any(run_dir.glob("checkpoints/*"))


def prepare_run(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Everything before the objects exist: checks, records, seeds, global torch settings.
    Returns the resolved config as plain data, which is all the helpers past this point see
    (records, checkpoints, hparams): values read from the environment stay `${oc.env:...}` there,
    so no secret is written; the objects are built from `cfg`, which resolves them."""
    check_config(cfg)
    check_resolves(cfg)
    check_machine(cfg)
    measure_checkpoint_files(cfg.checkpoint_bytes)
    route_lightning_logs()
    silence_known_warnings()
    resolved = redacted_container(cfg)
    save_resolved_config(resolved, run_dir)
    save_config_tree(config_tree(resolved), run_dir / "config_tree.txt")
    if pl.utilities.rank_zero_only.rank == 0:  # type: ignore[attr-defined]  # set at import
        report = save_device_report(run_dir)
        log.info(headline(report))
    matmul = apply_matmul_precision(cfg.matmul_precision)
    log.info("float32 matmul precision: %s", matmul)
    if cfg.seed is not None:
        pl.seed_everything(cfg.seed, workers=True)
    return resolved


def fit_and_test(
    run: TrainingObjects, test: bool, resume_from: Path | None, watch: str, stopper: RunStopper
) -> tuple[dict[str, float], str]:
    """Fit (continuing from `resume_from` if given), then test the best checkpoint (or the final
    weights when none was kept). The metrics: validation's last values, the best value of the
    watched metric as `<watch>_best` when a checkpoint callback followed it, and the test's.
    A CUDA out-of-memory in either ends as `TrainingOutOfMemoryError`, saying what to change."""
    try:
        return _fit_and_test(run, test, resume_from, watch, stopper)
    except torch.OutOfMemoryError as error:
        raise TrainingOutOfMemoryError(_explain_oom(run)) from error


def _explain_oom(run: TrainingObjects) -> str:
    strategy = run.trainer.strategy
    net = getattr(run.model, "net", None)
    return explain_oom(
        getattr(run.datamodule, "batch_size", None),
        strategy.root_device,
        processes=run.trainer.world_size,
        sharded=isinstance(strategy, ModelParallelStrategy),
        checkpointing_key=(
            "model.net.activation_checkpointing"
            if hasattr(net, "activation_checkpointing")
            else None
        ),
    )


def _fit_and_test(
    run: TrainingObjects, test: bool, resume_from: Path | None, watch: str, stopper: RunStopper
) -> tuple[dict[str, float], str]:
    checks = [c for c in run.trainer.callbacks if isinstance(c, WatchedMetricCheck)]  # type: ignore[attr-defined]
    if resume_from is not None:
        say_how_data_resumes(run.datamodule)
        # Lightning 2.6.6 warns, as each checkpoint callback is set up, that its folder "exists
        # and is not empty": a resumed run's folders are expected to hold its checkpoints.
        warnings.filterwarnings("ignore", message="Checkpoint directory .* exists and is not empty")
        for check in checks:
            check.follow_checkpoint(run.trainer, resume_from)
    # From the sanity check on, GracefulShutdown answers signals (and saves) until training ends.
    stopper.at("starting the fit (the ranks, setup, compile, the data)")
    run.trainer.fit(run.model, datamodule=run.datamodule, ckpt_path=resume_from)
    # What the checkpoint and early stopping followed: the module's own name for it, maybe.
    watch = checks[0].watch if checks else watch
    metrics = {
        k: float(v) for k, v in run.trainer.callback_metrics.items() if is_recorded(k) or k == watch
    }
    checkpoint = run.trainer.checkpoint_callback
    # Rank 0's: a metric logged without sync_dist differs between ranks, and with it the file
    # name each rank formats, but only rank 0's file was written.
    best = run.trainer.strategy.broadcast(getattr(checkpoint, "best_model_path", ""))
    score = getattr(checkpoint, "best_model_score", None)
    if (
        isinstance(checkpoint, ModelCheckpoint)
        and checkpoint.monitor == watch
        and score is not None
    ):
        metrics[f"{watch}_best"] = float(score)
    if test and not run.trainer.interrupted and not was_pruned(run.trainer):
        stopper.at("testing, after training ended")
        log.info(
            "testing %s", f"the best checkpoint, {Path(best).name}" if best else "the final weights"
        )
        # verbose=False: print_result shows these, once.
        results = run.trainer.test(
            run.model, datamodule=run.datamodule, ckpt_path=best or None, verbose=False
        )
        for result in results:
            metrics.update({k: float(v) for k, v in result.items()})
    return metrics, best


def say_how_data_resumes(datamodule: pl.LightningDataModule) -> None:
    """Lightning 2.6.6 warns, on a resume mid-epoch, that a data loader without `state_dict`
    gives "unreliable results"; a data module that restores its position itself (volt's,
    through its own state_dict: volt.data.batches) draws the batches an unbroken run would.
    Then one line says so, in place of that warning."""
    if not is_overridden("load_state_dict", datamodule, pl.LightningDataModule):
        return  # Lightning's warning is true for it
    warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before")
    log.info(
        "%s continues where the checkpoint stopped, mid-epoch too: the batches an unbroken run"
        " would draw",
        type(datamodule).__name__,
    )


def tests_at_all(cfg: DictConfig, model: pl.LightningModule) -> bool:
    """`test=true` tests after fitting when the module has a `test_step`; one line says it has
    none (Lightning would end the run in a MisconfigurationException after the whole fit)."""
    if cfg.test and not is_overridden("test_step", model):
        log.info("no test after training: %s has no test_step", type(model).__name__)
        return False
    return bool(cfg.test)


def check_trial_value(metrics: dict[str, float], watch: str, model: pl.LightningModule) -> None:
    """A search's trial fails rather than hand its study no value and call itself completed.
    Pruning checks the watched metric at each validation; a module without validation comes
    through to here."""
    if trial_in_environment() is not None and watched_value(metrics, watch) is None:
        raise unwatched(watch, type(model).__name__, metrics)


def train(cfg: DictConfig) -> dict[str, float]:
    """One run; returns its final metrics (validation and test). A signal stops it wherever it
    is, with one line saying where (volt.runs.stop_signals; mid-training: GracefulShutdown)."""
    run_dir = Path(cfg.paths.output_dir)
    with stop_on_signals(run_dir / "checkpoints", named=cfg.name is not None) as stopper:
        return train_run(cfg, run_dir, stopper)


def train_run(cfg: DictConfig, run_dir: Path, stopper: RunStopper) -> dict[str, float]:
    resolved = prepare_run(cfg, run_dir)
    # Rank 0 enforces resume=true/false; the other ranks start after it wrote run.json and
    # would see a run that "already exists".
    rank = pl.utilities.rank_zero_only.rank  # type: ignore[attr-defined]  # set at import
    plan = plan_resume(run_dir, cfg.name, cfg.resume if rank == 0 else None)
    if plan.finished is not None:
        log.info(
            "run %s already finished: nothing to do (pick a new name to train again)", cfg.name
        )
        print_result(plan.finished, run_dir)
        return plan.finished
    with run_record(run_dir):
        stopper.at("building the model and the data")
        run = build_training(cfg, resolved)
        if plan.checkpoint is not None:
            # Hydra's callback checked a run's model on the meta device before Hydra wrote into
            # its folder; a sweep's job is checked only here, once its folder was written to.
            check_resumed_weights(run.model, plan.checkpoint)
        if cfg.verbose:  # once the objects are built: what they refuse comes first, in one line
            print_config_tree(config_tree(resolved))
        log.info(describe_setup(run.trainer, cfg.compile.mode))
        if cfg.tune == "batch_size":
            stopper.at("tuning the batch size")
            batch = find_batch_size(run.trainer, run.model, run.datamodule)
            resolved["data"]["batch_size"] = batch  # what checkpoints and records now hold
        elif cfg.tune == "lr":
            stopper.at("tuning the learning rate")
            lr = find_learning_rate(run.trainer, run.model, run.datamodule, run_dir)
            resolved["model"]["optimizer"]["lr"] = lr
        # What ran, where Lightning chose otherwise (16-mixed on a CPU runs bf16-mixed), and what
        # the finders found: config_resolved.yaml, checkpoints and the hparams tab say so.
        resolved["precision"] = resolved["trainer"]["precision"] = str(run.trainer.precision)
        save_resolved_config(resolved, run_dir)
        # The hparams tab lists the run from here on; its final status comes from the
        # metrics.json written inside, or from how the block ends.
        with hparams_session(run.trainer.loggers, resolved, run_dir):
            with ranks_end_with_run(run.trainer):  # this process's DDP ranks end with the run
                try:
                    metrics, best = fit_and_test(
                        run, tests_at_all(cfg, run.model), plan.checkpoint, cfg.task.watch, stopper
                    )
                except Exception as error:
                    # How far it got decides whether the run directory is kept (nothing_to_keep)
                    error.steps_taken = run.trainer.global_step  # type: ignore[attr-defined]
                    raise
            status = "pruned" if was_pruned(run.trainer) else "completed"
            if status == "completed":
                check_trial_value(metrics, cfg.task.watch, run.model)
            write_metrics(run_dir, metrics, best_checkpoint=best, status=status)
    print_result(metrics, run_dir)
    return metrics
