"""The one place where configs become objects. Everything past this module takes typed arguments."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
from hydra.utils import instantiate
from lightning.pytorch.callbacks import (
    Callback,
    LearningRateMonitor,
    ModelCheckpoint,
    RichProgressBar,
)
from lightning.pytorch.loggers import CSVLogger, Logger
from omegaconf import DictConfig

from volt.callbacks.config_in_checkpoint import ConfigInCheckpoint
from volt.callbacks.rng_state import RNGStateInCheckpoint
from volt.checkpointing import AtomicCheckpointIO
from volt.config.targets import check_stored_config, check_targets
from volt.data.classification import ImageClassificationDataModule
from volt.gpu import apply_compile
from volt.models.classifier import Classifier


@dataclass
class TrainingObjects:
    datamodule: ImageClassificationDataModule
    model: Classifier
    trainer: pl.Trainer


def instantiate_checked(node: DictConfig, trusted: Sequence[str], **kwargs: Any) -> Any:
    """Hydra's instantiate, once every callable `node` names is allowed (`volt.config.targets`):
    every object volt builds from a config comes through here."""
    check_targets(node, trusted)
    return instantiate(node, **kwargs)


def build_datamodule(
    data: DictConfig, trusted: Sequence[str] = (), **overrides: Any
) -> ImageClassificationDataModule:
    return instantiate_checked(data, trusted, **overrides)


def build_model(
    model: DictConfig, datamodule: ImageClassificationDataModule, trusted: Sequence[str] = ()
) -> Classifier:
    # Shapes come from the data module, not the config: one model config fits every data set.
    net = instantiate_checked(
        model.net, trusted, in_shape=datamodule.input_shape, num_classes=datamodule.num_classes
    )
    return instantiate_checked(model, trusted, net=net, num_classes=datamodule.num_classes)


def build_callbacks(callbacks: DictConfig | None, trusted: Sequence[str]) -> list[Callback]:
    """Named entries (`model_checkpoint: {...}`); an entry set to null is switched off."""
    if not callbacks:
        return []
    return [instantiate_checked(c, trusted) for c in callbacks.values() if c is not None]


def build_loggers(loggers: DictConfig | None, trusted: Sequence[str]) -> list[Logger]:
    if not loggers:
        return []
    return [instantiate_checked(c, trusted) for c in loggers.values() if c is not None]


def build_evaluation(cfg: DictConfig, stored: DictConfig) -> TrainingObjects:
    """Data and model as the checkpoint's run had them; trainer, batch size and root from `cfg`.

    `stored` comes from a file someone may have handed over: it is checked as a whole first (full
    key names in the message, nothing built yet), against this command's trusted_targets only,
    never the list the checkpoint carries."""
    trusted = cfg.trusted_targets
    check_stored_config(stored, trusted)
    overrides = {k: v for k, v in (("batch_size", cfg.batch_size), ("root", cfg.data_root)) if v}
    datamodule = build_datamodule(stored.data, trusted, **overrides)
    model = build_model(stored.model, datamodule, trusted)
    trainer = pl.Trainer(
        accelerator=cfg.accelerator,
        devices=1,
        precision=cfg.precision or stored.precision,
        logger=CSVLogger(cfg.paths.output_dir, name="csv", version=""),
        callbacks=[RichProgressBar(leave=False)],
        # test(ckpt_path=...) loads through it: weights_only=True, whatever Lightning's default
        plugins=[AtomicCheckpointIO()],
        enable_checkpointing=False,
        default_root_dir=cfg.paths.output_dir,
    )
    return TrainingObjects(datamodule, model, trainer)


def build_training(cfg: DictConfig, resolved: dict[str, Any]) -> TrainingObjects:
    """The run's objects; `resolved` (cfg as plain data) is what every checkpoint will store, so a
    value the run changes later (a tuned batch size or learning rate) is written into it."""
    trusted = cfg.trusted_targets
    # The whole config at once: full key names in the message, and nothing built before it.
    check_targets(cfg, trusted)
    datamodule = build_datamodule(cfg.data, trusted)
    model = build_model(cfg.model, datamodule, trusted)
    apply_compile(model.net, cfg.compile.mode, cfg.compile.fullgraph, cfg.compile.dynamic)
    callbacks = build_callbacks(cfg.get("callbacks"), trusted)
    # Store the resolved config in every checkpoint: `volt.eval` rebuilds the run from it alone.
    callbacks.append(ConfigInCheckpoint(resolved))
    # ...and the random generators' states, so a resumed run draws what an unbroken one would.
    callbacks.append(RNGStateInCheckpoint())
    loggers = build_loggers(cfg.get("logger"), trusted)
    if not loggers:  # Lightning refuses a learning-rate monitor with nothing to log to
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    # Checkpoints are written to a temporary file and renamed: a kill never leaves a torn one.
    trainer: pl.Trainer = instantiate_checked(
        cfg.trainer,
        trusted,
        callbacks=callbacks,
        logger=loggers or False,
        plugins=[AtomicCheckpointIO()],
        # Without volt's checkpoint callbacks (callbacks=none) Lightning would add its own,
        # writing where neither resume nor eval looks.
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
    )
    return TrainingObjects(datamodule, model, trainer)
