"""The one place where configs become objects. Everything past this module takes typed arguments.

The contract with a task: `data` is any LightningDataModule `_target_`, `model` any
LightningModule `_target_`. What volt reads beyond that is declared in `task` (conf/task/) and read
here only: model arguments taken from the data module (`task.from_data`), the submodule that
compile and channels_last act on (`task.module`), and the watched metric (`task.watch`, used by
the callback configs through interpolation).

The toggles act on the built module here, in one documented order (`apply_toggles`):
channels_last -> the SyncBatchNorm choice -> float8 -> compile; Lightning then distributes at fit.
"""

import copy
import functools
import inspect
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import lightning.pytorch as pl
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.pytorch.callbacks import (
    Callback,
    LearningRateMonitor,
    ModelCheckpoint,
    ModelSummary,
    ProgressBar,
)
from lightning.pytorch.loggers import Logger
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from omegaconf import DictConfig, OmegaConf, open_dict
from torch import nn

from volt.callbacks.config_in_checkpoint import ConfigInCheckpoint
from volt.callbacks.restored_paths import RestoredPathsCheck
from volt.callbacks.rng_state import RNGStateInCheckpoint
from volt.callbacks.watched_metric import Remake, WatchedMetricCheck
from volt.callbacks.weight_averaging import ExponentialMovingAverage
from volt.checkpointing import AtomicCheckpointIO
from volt.config.execution_whitelist import instantiate_whitelist
from volt.config.targets import RETURNED_CALLABLES, allowed_prefixes, check_targets, locate_checked
from volt.errors import ConfigError
from volt.gpu import apply_compile, apply_float8
from volt.hook_dispatch import (
    NoProfiler,
    read_step_signature_once,
    skip_inherited_batch_hooks,
    store_hook_names_directly,
)
from volt.loggers.logged_values import skip_needless_moves
from volt.strategies.fsdp import FSDPStrategy
from volt.strategies.launcher import RunConfigLauncher
from volt.strategies.sync_batchnorm import SyncBatchNormLayers
from volt.sweeps.pruning import TrialLink, TrialPruning, default_pruner, trial_in_environment

log = logging.getLogger("volt")


@dataclass
class TrainingObjects:
    datamodule: pl.LightningDataModule
    model: pl.LightningModule
    trainer: pl.Trainer


def instantiate_checked(node: Any, trusted: Sequence[str], **kwargs: Any) -> Any:
    """Hydra's instantiate, once every callable `node` names is allowed (`volt.config.targets`):
    every object volt builds from a config comes through here. Hydra checks the same allow-list
    again where it takes one (`volt.config.execution_whitelist`)."""
    check_targets(node, trusted)
    whitelist = instantiate_whitelist(allowed_prefixes(trusted), RETURNED_CALLABLES)
    try:
        return instantiate(node, **whitelist, **kwargs)
    except InstantiationException:
        raise
    except Exception as error:
        # hydra-core 1.3 wraps what a constructor raises in an InstantiationException, which the
        # entry points report as one line; 1.4 (seen: 1.4.0rc3) lets it through as it is, and it
        # ended as a traceback. Wrapped here alike; delete once volt requires hydra-core>=1.4
        # and the entry points catch the constructors' own errors.
        target = node.get("_target_") if isinstance(node, Mapping | DictConfig) else None
        raise InstantiationException(f"Error in call to target '{target}':\n{error!r}") from error


def build_datamodule(
    data: DictConfig, trusted: Sequence[str] = (), **overrides: Any
) -> pl.LightningDataModule:
    return instantiate_checked(data, trusted, **overrides)


def arguments_from_data(
    from_data: Mapping[str, str], datamodule: pl.LightningDataModule, model: DictConfig
) -> dict[str, Any]:
    """{"net.in_shape": "input_shape"} -> {"net.in_shape": datamodule.input_shape}: what one model
    config needs to fit every data set (shapes, class counts, vocabulary sizes). An entry the model
    does not take (neither its config nor its class has that argument: a model of the user's own
    under the default task) is left out; one it takes that the data module lacks is refused."""
    values = {}
    for key, attribute in from_data.items():
        if not _model_takes(model, key):
            continue
        if not hasattr(datamodule, attribute):
            raise ConfigError(
                f"task.from_data.{key}={attribute!r}: {type(datamodule).__name__} has no attribute"
                f" {attribute!r}: drop the entry (task=plain has none), or give the data module"
                " that attribute"
            )
        value = getattr(datamodule, attribute)
        values[key] = list(value) if isinstance(value, tuple) else value
    return values


def _model_takes(model: DictConfig, key: str) -> bool:
    """The model config has `key` (dotted), or the class of the section it lands in takes it.
    (A config that sets what from_data fills is refused earlier: volt.config.keys.)"""
    *parents, name = key.split(".")
    node: Any = model
    for part in parents:
        node = node.get(part) if isinstance(node, DictConfig) else None
        if node is None:
            return False
    if not isinstance(node, DictConfig):
        return False
    if name in node:
        return True
    target = node.get("_target_")
    if not isinstance(target, str):
        return False
    taken = inspect.signature(locate_checked(key, target)).parameters.values()
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in taken)


def build_model(
    model: DictConfig,
    datamodule: pl.LightningDataModule,
    from_data: Mapping[str, str],
    trusted: Sequence[str] = (),
) -> pl.LightningModule:
    """The LightningModule, its nested parts (a net, optimiser partials) built by Hydra, with the
    arguments `from_data` names filled in from the data module."""
    return instantiate_checked(model_with_data(model, datamodule, from_data), trusted)


def build_model_outline(cfg: DictConfig) -> pl.LightningModule:
    """The run's model as build_training makes it (the data module's values filled in; no
    toggles, which change no name or shape), on the meta device: names and shapes, no memory."""
    trusted = cfg.trusted_targets
    datamodule = build_datamodule(cfg.data, trusted)
    with torch.device("meta"):
        return build_model(cfg.model, datamodule, cfg.task.from_data, trusted)


def model_with_data(
    model: DictConfig, datamodule: pl.LightningDataModule, from_data: Mapping[str, str]
) -> DictConfig:
    """A copy of the model config with the arguments `from_data` names filled in: what the run
    really builds, and what its checkpoints store."""
    return model_with_values(model, arguments_from_data(from_data, datamodule, model))


def model_with_values(model: DictConfig, values: Mapping[str, Any]) -> DictConfig:
    """A copy of the model config with `values` (dotted keys) set."""
    model = copy.deepcopy(model)
    with open_dict(model):
        for key, value in values.items():
            OmegaConf.update(model, key, value, force_add=True)
    return model


def set_dotted(tree: dict[str, Any], values: Mapping[str, Any]) -> None:
    """`values` (dotted keys) set in plain nested dicts."""
    for key, value in values.items():
        *parents, last = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value


def toggled_module(model: pl.LightningModule, path: str | None) -> nn.Module:
    """The part of `model` that compile and channels_last act on: `task.module` (e.g. `net`), or
    the whole LightningModule when the path is null or the model has no such submodule (a model
    of the user's own under the default task)."""
    module: Any = model
    for part in path.split(".") if path else []:
        module = getattr(module, part, None)
    if not isinstance(module, nn.Module):
        log.info(
            "task.module=%r: %s has no such submodule; compile and channels_last act on the"
            " whole LightningModule",
            path,
            type(model).__name__,
        )
        return model
    return module


def apply_toggles(cfg: DictConfig, model: pl.LightningModule) -> list[Any]:
    """channels_last -> SyncBatchNorm choice -> float8 -> compile, each in this one place;
    returns the Trainer plugins the choices need (Lightning distributes at fit, after these)."""
    # The part they act on, looked for (and a missing one said) only where one of them acts.
    acting = cfg.get("channels_last") or cfg.get("float8") or cfg.compile.mode
    module = toggled_module(model, cfg.task.module) if acting else model
    if cfg.get("channels_last"):
        # NHWC weights: convolutions on tensor cores run without transposes; an NCHW input is
        # converted by the first convolution.
        module.to(memory_format=torch.channels_last)
    plugins: list[Any] = []
    if OmegaConf.select(cfg, "trainer.sync_batchnorm"):
        # volt's SyncBatchNorm instead of Lightning's (torch's layer waits on the host at every
        # BatchNorm: volt.strategies.sync_batchnorm); Lightning converts the layers at setup.
        plugins.append(SyncBatchNormLayers())
    if cfg.get("float8"):  # checked with the machine (volt.config.validation.check_machine)
        apply_float8(module)  # before compile, which fuses the float8 casts with their neighbours
    apply_compile(module, cfg.compile.mode, cfg.compile.fullgraph, cfg.compile.dynamic)
    return plugins


def build_callbacks(callbacks: DictConfig | None, trusted: Sequence[str]) -> list[Callback]:
    """Named entries (`model_checkpoint: {...}`); an entry set to null is switched off."""
    if not callbacks:
        return []
    return [instantiate_checked(c, trusted) for c in callbacks.values() if c is not None]


def remaker(callbacks: DictConfig | None, built: list[Callback], trusted: Sequence[str]) -> Remake:
    """Builds a callback of `built` (from `callbacks`, as build_callbacks did) again, some of its
    constructor arguments changed; the new one takes the old one's place in `built`."""
    entries = [c for c in (callbacks or {}).values() if c is not None]  # in the order of `built`

    def remake(old: Callback, changes: dict[str, Any]) -> Any:
        at = next(i for i, c in enumerate(built) if c is old)
        built[at] = instantiate_checked(entries[at], trusted, **changes)
        skip_inherited_batch_hooks([built[at]])
        return built[at]

    return remake


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
    built = build_callbacks(cfg.get("callbacks"), trusted)
    # First: it points early stopping and the best checkpoint at what the module logs, or takes
    # them away, before they miss their metric.
    watch = WatchedMetricCheck(
        OmegaConf.select(cfg, "task.watch", default=""),
        OmegaConf.select(cfg, "task.mode", default="max"),
        remake=remaker(cfg.get("callbacks"), built, trusted),
    )
    callbacks = [watch, *built]
    callbacks += extra_callbacks
    # A checkpoint's callback states are data: none may point Lightning at files outside the run.
    callbacks.append(RestoredPathsCheck())
    loggers = build_loggers(cfg.get("logger"), trusted)
    if not loggers:  # Lightning refuses a learning-rate monitor with nothing to log to
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    # What volt adds goes in as instantiate's keyword arguments, the config untouched: hydra-core
    # 1.4 builds a node inside a copy of its parent, where a key added to a copy of the node alone
    # is refused (struct).
    added: dict[str, Any] = {}
    given = cfg.trainer.get("plugins") or []
    given = [instantiate_checked(p, trusted) if OmegaConf.is_config(p) else p for p in given]
    if OmegaConf.select(cfg, "trainer.sync_batchnorm"):
        added["sync_batchnorm"] = False  # volt's layers come as a plugin (apply_toggles)
    # Checkpoints through a temporary file and a rename (a kill never leaves a torn one),
    # loaded with weights_only=True; a CheckpointIO of the user's own is kept instead.
    if not any(isinstance(p, CheckpointIO) for p in given):
        plugins = [*plugins, AtomicCheckpointIO()]
    if cfg.trainer.get("enable_checkpointing") is None:
        # Without volt's checkpoint callbacks (callbacks=none) Lightning would add its own,
        # writing where neither resume nor eval looks.
        added["enable_checkpointing"] = any(isinstance(c, ModelCheckpoint) for c in callbacks)
    if cfg.trainer.get("enable_model_summary") is None and any(
        isinstance(c, ModelSummary) for c in callbacks
    ):
        # Lightning 2.6.6 would add its own summary, find volt's, and say so on every run.
        added["enable_model_summary"] = False
    if cfg.trainer.get("enable_progress_bar") is None and not any(
        isinstance(c, ProgressBar) for c in callbacks
    ):
        # Without volt's bar (callbacks.progress_bar=null) Lightning 2.6.6 would add its own,
        # which reads the metrics shown on it from the GPU after every batch (a host sync).
        added["enable_progress_bar"] = False
    if not cfg.trainer.get("profiler") and not cfg.trainer.get("barebones"):
        added["profiler"] = NoProfiler()  # (barebones=True refuses any profiler, Lightning's own)
    trainer: pl.Trainer = instantiate_checked(
        cfg.trainer,
        trusted,
        callbacks=callbacks,
        logger=loggers or False,
        plugins=given + plugins,
        **added,
    )
    refuse_lightnings_launcher(trainer, cfg.trainer.get("strategy"))
    allow_clipping_fused_optimizers(trainer)
    no_collective_in_sigterm_handler(trainer)
    skip_inherited_batch_hooks(trainer.callbacks)  # type: ignore[attr-defined]
    skip_needless_moves()  # what `self.log` costs the host (volt.loggers.logged_values)
    store_hook_names_directly()  # what naming each hook costs the host (volt.hook_dispatch)
    read_step_signature_once(trainer)
    return trainer


def refuse_lightnings_launcher(trainer: pl.Trainer, strategy: Any) -> None:
    """Lightning's own multi-process strategies (`trainer.strategy=ddp`, `ddp_spawn`, or `auto`
    over several devices) start the other ranks by running the command line again, which under
    Hydra makes a run directory each and fails on rank 0's lock, or by pickling the run, which
    fails on its signal handlers (seen with Lightning 2.6.6). volt's strategies start them from
    the run's config (volt.strategies.launcher); under torchrun or srun Lightning starts none."""
    launcher = trainer.strategy.launcher
    if launcher is None or isinstance(launcher, RunConfigLauncher):
        return
    name = strategy.get("_target_") if isinstance(strategy, DictConfig) else strategy
    raise ConfigError(
        f"trainer.strategy={name!r} over {trainer.world_size} processes: Lightning would start"
        " each rank as a new run of this command; use trainer=ddp"
        f" trainer.devices={trainer.num_devices} (volt's DDP), or trainer=fsdp"
    )


def no_collective_in_sigterm_handler(trainer: pl.Trainer) -> None:
    """Lightning's SIGTERM handler (2.5.2 to 2.6.6, PR #20825) forwards the signal to the ranks it
    started and then broadcasts a tensor from inside the handler: a collective at whatever point
    each rank's handler happens to run. Ranks signalled at different moments (one inside an FSDP
    all-gather of test, the other in its handler's broadcast) wait for each other for good (seen
    on 2 gloo ranks; NCCL the same). volt stops on signals itself: GracefulShutdown agrees at step
    boundaries during the fit, volt.runs.stop_signals stops where the run is elsewhere, and the
    launcher stops the ranks it started. So Lightning's handler only takes note. Remove when
    Lightning no longer communicates inside its handler (#20806 and #21487 are open)."""
    connector = trainer._signal_connector

    def take_note(signum: int, frame: FrameType | None) -> None:
        connector.received_sigterm = True

    connector._sigterm_notifier_fn = take_note  # type: ignore[method-assign,assignment]


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
    whitelist = instantiate_whitelist(["optuna.pruners"])
    built = instantiate(pruner, **whitelist) if pruner else default_pruner()
    return [TrialPruning(watch, link, built)]


def build_training(cfg: DictConfig, resolved: dict[str, Any]) -> TrainingObjects:
    """The run's objects; `resolved` (cfg as plain data) is what every checkpoint will store, so a
    value the run changes later (a tuned batch size or learning rate) is written into it."""
    trusted = cfg.trusted_targets
    # The whole config at once: full key names in the message, and nothing built before it.
    check_targets(cfg, trusted)
    datamodule = build_datamodule(cfg.data, trusted)
    filled = arguments_from_data(cfg.task.from_data, datamodule, cfg.model)
    # Checkpoints store the model as built, the data module's values in place: eval and
    # load_trained_module rebuild it from the file without a task (volt.rebuild).
    set_dotted(resolved.setdefault("model", {}), filled)
    model = instantiate_checked(model_with_values(cfg.model, filled), trusted)
    plugins = apply_toggles(cfg, model)
    # The resolved config in every checkpoint (`volt.eval` rebuilds the run from it alone), and
    # the random generators' states, so a resumed run draws what an unbroken one would.
    extra = [ConfigInCheckpoint(resolved), RNGStateInCheckpoint()]
    if cfg.get("ema") is not None:
        # Validation, the checkpoints and test see the average: volt.callbacks.weight_averaging.
        extra.append(ExponentialMovingAverage(cfg.ema, warmup=cfg.ema_warmup))
    extra += build_trial_pruning(cfg.task.watch)
    trainer = build_trainer(cfg, trusted, extra, plugins)
    if isinstance(trainer.strategy, FSDPStrategy):
        trainer.strategy.check_module(model)  # its `wrap` against this model, before ranks start
    return TrainingObjects(datamodule, model, trainer)
