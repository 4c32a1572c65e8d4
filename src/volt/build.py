"""The one place where configs become objects. Everything past this module takes typed arguments.

The contract with a task: `data` is any LightningDataModule `_target_`, `model` any
LightningModule `_target_`. What volt reads beyond that is declared in `task` (conf/task/) and read
here only: model arguments taken from the data module (`task.from_data`), the submodule that
compile and channels_last act on (`task.module`), and the watched metric (`task.watch`, used by
the callback configs through interpolation).

The toggles act on the built module here, in one documented order (`apply_toggles`):
channels_last -> the SyncBatchNorm choice -> compile; Lightning then distributes at fit.
"""

import copy
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback, LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.loggers import Logger
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from omegaconf import DictConfig, OmegaConf, open_dict
from torch import nn

from volt.callbacks.config_in_checkpoint import ConfigInCheckpoint
from volt.callbacks.prediction_writer import CSVPredictionWriter
from volt.callbacks.rng_state import RNGStateInCheckpoint
from volt.callbacks.weight_averaging import ExponentialMovingAverage
from volt.checkpointing import AtomicCheckpointIO, read_stored_config
from volt.config.targets import check_stored_config, check_targets
from volt.errors import ConfigError
from volt.gpu import apply_compile
from volt.strategies.fsdp import FSDPStrategy
from volt.strategies.sync_batchnorm import SyncBatchNormLayers
from volt.sweeps.pruning import TrialLink, TrialPruning, default_pruner, trial_in_environment

# The task of checkpoints written before conf/task/ existed (volt before 2026-11-23): what
# build_model then passed every model. Delete once such checkpoints need not be evaluated.
CLASSIFICATION_BEFORE_TASKS = {
    "from_data": {
        "net.in_shape": "input_shape",
        "net.num_classes": "num_classes",
        "num_classes": "num_classes",
    },
    "module": "net",
}


@dataclass
class TrainingObjects:
    datamodule: pl.LightningDataModule
    model: pl.LightningModule
    trainer: pl.Trainer


def instantiate_checked(node: Any, trusted: Sequence[str], **kwargs: Any) -> Any:
    """Hydra's instantiate, once every callable `node` names is allowed (`volt.config.targets`):
    every object volt builds from a config comes through here."""
    check_targets(node, trusted)
    return instantiate(node, **kwargs)


def build_datamodule(
    data: DictConfig, trusted: Sequence[str] = (), **overrides: Any
) -> pl.LightningDataModule:
    return instantiate_checked(data, trusted, **overrides)


def arguments_from_data(
    from_data: Mapping[str, str], datamodule: pl.LightningDataModule
) -> dict[str, Any]:
    """{"net.in_shape": "input_shape"} -> {"net.in_shape": datamodule.input_shape}: what one model
    config needs to fit every data set (shapes, class counts, vocabulary sizes)."""
    values = {}
    for key, attribute in from_data.items():
        if not hasattr(datamodule, attribute):
            raise ConfigError(
                f"task.from_data.{key}={attribute!r}: {type(datamodule).__name__} has no attribute"
                f" {attribute!r}: drop the entry (task=plain has none), or give the data module"
                " that attribute"
            )
        value = getattr(datamodule, attribute)
        values[key] = list(value) if isinstance(value, tuple) else value
    return values


def build_model(
    model: DictConfig,
    datamodule: pl.LightningDataModule,
    from_data: Mapping[str, str],
    trusted: Sequence[str] = (),
) -> pl.LightningModule:
    """The LightningModule, its nested parts (a net, optimiser partials) built by Hydra, with the
    arguments `from_data` names filled in from the data module."""
    model = copy.deepcopy(model)
    with open_dict(model):
        for key, value in arguments_from_data(from_data, datamodule).items():
            OmegaConf.update(model, key, value, force_add=True)
    return instantiate_checked(model, trusted)


def toggled_module(model: pl.LightningModule, path: str | None) -> nn.Module:
    """The part of `model` that compile and channels_last act on: `task.module` (e.g. `net`), or
    the whole LightningModule."""
    if not path:
        return model
    module: Any = model
    try:
        for part in path.split("."):
            module = getattr(module, part)
    except AttributeError as error:
        raise ConfigError(
            f"task.module={path!r}: {type(model).__name__} has no submodule {path!r}: set"
            " task.module=null to compile the whole LightningModule"
        ) from error
    if not isinstance(module, nn.Module):
        raise ConfigError(f"task.module={path!r} is a {type(module).__name__}, not an nn.Module")
    return module


def apply_toggles(cfg: DictConfig, model: pl.LightningModule) -> list[Any]:
    """channels_last -> SyncBatchNorm choice -> compile, each in this one place; returns the
    Trainer plugins the choices need (Lightning distributes at fit, after these)."""
    module = toggled_module(model, cfg.task.module)
    if cfg.get("channels_last"):
        # NHWC weights: convolutions on tensor cores run without transposes; an NCHW input is
        # converted by the first convolution.
        module.to(memory_format=torch.channels_last)
    plugins: list[Any] = []
    if OmegaConf.select(cfg, "trainer.sync_batchnorm"):
        # volt's SyncBatchNorm instead of Lightning's (torch's layer waits on the host at every
        # BatchNorm: volt.strategies.sync_batchnorm); Lightning converts the layers at setup.
        plugins.append(SyncBatchNormLayers())
    apply_compile(module, cfg.compile.mode, cfg.compile.fullgraph, cfg.compile.dynamic)
    return plugins


def build_callbacks(callbacks: DictConfig | None, trusted: Sequence[str]) -> list[Callback]:
    """Named entries (`model_checkpoint: {...}`); an entry set to null is switched off."""
    if not callbacks:
        return []
    return [instantiate_checked(c, trusted) for c in callbacks.values() if c is not None]


def build_loggers(loggers: DictConfig | None, trusted: Sequence[str]) -> list[Logger]:
    if not loggers:
        return []
    return [instantiate_checked(c, trusted) for c in loggers.values() if c is not None]


def build_trainer(
    cfg: DictConfig,
    trusted: Sequence[str],
    extra_callbacks: Sequence[Callback],
    plugins: list[Any],
) -> pl.Trainer:
    """The Trainer of `cfg.trainer` with `cfg.callbacks` and `cfg.logger`, for training and
    evaluation alike. What volt adds is merged with what the config gives, never written over it."""
    callbacks = build_callbacks(cfg.get("callbacks"), trusted) + list(extra_callbacks)
    loggers = build_loggers(cfg.get("logger"), trusted)
    if not loggers:  # Lightning refuses a learning-rate monitor with nothing to log to
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    trainer_cfg = copy.deepcopy(cfg.trainer)
    with open_dict(trainer_cfg):
        given = trainer_cfg.pop("plugins", None) or []
        given = [instantiate_checked(p, trusted) if OmegaConf.is_config(p) else p for p in given]
        if OmegaConf.select(cfg, "trainer.sync_batchnorm"):
            trainer_cfg.sync_batchnorm = False  # volt's layers come as a plugin (apply_toggles)
        # Checkpoints through a temporary file and a rename (a kill never leaves a torn one),
        # loaded with weights_only=True; a CheckpointIO of the user's own is kept instead.
        if not any(isinstance(p, CheckpointIO) for p in given):
            plugins = [*plugins, AtomicCheckpointIO()]
        if trainer_cfg.get("enable_checkpointing") is None:
            # Without volt's checkpoint callbacks (callbacks=none) Lightning would add its own,
            # writing where neither resume nor eval looks.
            trainer_cfg.enable_checkpointing = any(
                isinstance(c, ModelCheckpoint) for c in callbacks
            )
    trainer: pl.Trainer = instantiate_checked(
        trainer_cfg, trusted, callbacks=callbacks, logger=loggers or False, plugins=given + plugins
    )
    allow_clipping_fused_optimizers(trainer)
    return trainer


def allow_clipping_fused_optimizers(trainer: pl.Trainer) -> None:
    """Lightning 2.6.6's MixedPrecision refuses to clip gradients for a fused optimiser (AdamW's
    `fused=True`) even under bf16-mixed, which has no grad scaler for the fused step to clash with
    (Lightning issue #21435, fixed by PR #21436 after 2.6.6): where the plugin has no scaler it
    clips as its base class does, for any module. Remove when volt requires a Lightning with the
    fix. Under 16-mixed the refusal stands: there a fused step unscales after the clipping."""
    plugin = trainer.precision_plugin
    if isinstance(plugin, MixedPrecision) and plugin.scaler is None:
        plugin.clip_gradients = functools.partial(Precision.clip_gradients, plugin)  # type: ignore[method-assign]


def build_trial_pruning(watch: str) -> list[Callback]:
    """In a trial of volt's Optuna search (`volt.sweeps.pruning`): the callback that reports
    `watch` and stops the trial when pruned. Rank 0 reads the study's place and pruner from its
    Hydra config, the one Hydra built the sweeper from; the other ranks only hear the verdict."""
    number = trial_in_environment()
    if number is None:
        return []
    if pl.utilities.rank_zero_only.rank != 0:  # type: ignore[attr-defined]  # set at import
        return [TrialPruning(watch, None)]
    hydra_cfg = HydraConfig.get()
    pruner = hydra_cfg.sweeper.get("pruner")
    link = TrialLink(Path(hydra_cfg.sweep.dir), hydra_cfg.sweeper.study_name, number)
    return [TrialPruning(watch, link, instantiate(pruner) if pruner else default_pruner())]


def build_training(cfg: DictConfig, resolved: dict[str, Any]) -> TrainingObjects:
    """The run's objects; `resolved` (cfg as plain data) is what every checkpoint will store, so a
    value the run changes later (a tuned batch size or learning rate) is written into it."""
    trusted = cfg.trusted_targets
    # The whole config at once: full key names in the message, and nothing built before it.
    check_targets(cfg, trusted)
    datamodule = build_datamodule(cfg.data, trusted)
    model = build_model(cfg.model, datamodule, cfg.task.from_data, trusted)
    plugins = apply_toggles(cfg, model)
    # The resolved config in every checkpoint (`volt.eval` rebuilds the run from it alone), and
    # the random generators' states, so a resumed run draws what an unbroken one would.
    extra = [ConfigInCheckpoint(resolved), RNGStateInCheckpoint()]
    if cfg.get("ema") is not None:
        # Validation, the checkpoints and test see the average: volt.callbacks.weight_averaging.
        extra.append(ExponentialMovingAverage(cfg.ema))
    extra += build_trial_pruning(cfg.task.watch)
    trainer = build_trainer(cfg, trusted, extra, plugins)
    if isinstance(trainer.strategy, FSDPStrategy):
        trainer.strategy.check_module(model)  # its `wrap` against this model, before ranks start
    return TrainingObjects(datamodule, model, trainer)


def build_evaluation(cfg: DictConfig, stored: DictConfig) -> TrainingObjects:
    """Data, model and task as the checkpoint's run had them (the data replaced by `cfg.data` when
    the command names one, to predict on new data); trainer, callbacks, loggers, precision and
    compile from `cfg`, through the same functions as training.

    `stored` comes from a file someone may have handed over: it is checked as a whole first (full
    key names in the message, nothing built yet), against this command's trusted_targets only,
    never the list the checkpoint carries."""
    trusted = cfg.trusted_targets
    check_stored_config(stored, trusted)
    task = stored.get("task") or OmegaConf.create(CLASSIFICATION_BEFORE_TASKS)
    stored = copy.deepcopy(stored)
    with open_dict(stored):
        # Before 2026-11-23 channels_last was an argument of volt's Classifier.
        channels_last = stored.model.pop("channels_last", False) or stored.get("channels_last")
    data = cfg.data if cfg.get("data") is not None else stored.data
    given = (("batch_size", cfg.batch_size), ("root", cfg.data_root), ("prompt", cfg.prompt))
    overrides = {k: v for k, v in given if v}
    datamodule = build_datamodule(data, trusted, **overrides)
    model = build_model(stored.model, datamodule, task.from_data, trusted)
    toggles = OmegaConf.create(
        {
            "task": task,
            "compile": cfg.compile,
            "channels_last": bool(channels_last),
            "trainer": {"sync_batchnorm": False},  # one process: nothing to synchronise
        }
    )
    plugins = apply_toggles(toggles, model)
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):
        cfg.trainer.precision = cfg.precision or stored.precision  # null: as trained
    writer = [CSVPredictionWriter(cfg.paths.output_dir)] if cfg.mode == "predict" else []
    return TrainingObjects(datamodule, model, build_trainer(cfg, trusted, writer, plugins))


def load_trained_module(
    ckpt_path: str | Path, trusted: Sequence[str] = ()
) -> tuple[pl.LightningModule, pl.LightningDataModule]:
    """A volt checkpoint's LightningModule with its trained weights, and the data module it was
    built against, from the file alone: what `Classifier.load_from_checkpoint` cannot do, since a
    module's nets and optimiser factories are arguments, not hyperparameters (only plain values
    are, so that checkpoints load with weights_only=True). The stored config is checked against
    `trusted` like eval's."""
    stored = OmegaConf.create(read_stored_config(Path(ckpt_path)))
    check_stored_config(stored, trusted)
    task = stored.get("task") or OmegaConf.create(CLASSIFICATION_BEFORE_TASKS)
    datamodule = build_datamodule(stored.data, trusted)
    model = stored.model.copy()
    with open_dict(model):
        model.pop("channels_last", None)  # a Classifier argument before 2026-11-23
    module = build_model(model, datamodule, task.from_data, trusted)
    checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    module.load_state_dict(checkpoint["state_dict"])
    return module, datamodule
