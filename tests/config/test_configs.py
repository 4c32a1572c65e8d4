"""Every option of every config group composes, passes validation and builds objects that hold
what it says: the data module and model it names (a net that maps the data's inputs to its
classes), the optimiser and learning rate, the Trainer's settings, callbacks, loggers, strategy
and profiler, compile. eval.yaml evaluates a real checkpoint."""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from hydra._internal.utils import _locate
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.callbacks import LearningRateMonitor
from omegaconf import DictConfig, OmegaConf

from volt.build import TrainingObjects, build_training, toggled_module
from volt.config import CONF_DIR
from volt.config.keys import check_target_arguments
from volt.config.validation import check_config, check_resolves
from volt.errors import ConfigError
from volt.evaluation import evaluate
from volt.training import train

Compose = Callable[..., DictConfig]
GROUPS = (
    "data",
    "model",
    "task",
    "trainer",
    "compile",
    "callbacks",
    "logger",
    "debug",
    "experiment",
    "hparams_search",
)
USER_TASK_CONF = Path(__file__).parents[1] / "user_task_conf"
# Options that build only together: each is tested with the others.
LANGUAGE_MODEL = ["data=text_bytes", "model=gpt", "task=language_model"]
EXTRA = {
    # trainer=gpu needs a GPU to build a Trainer; composing and validating it still must work.
    "trainer=gpu": ["trainer.accelerator=cpu"],
    # task=plain is for a LightningModule of the user's own: the one tests/user_task.py holds.
    "task=plain": [
        f"hydra.searchpath=[file://{USER_TASK_CONF}]",
        "model=line",
        "data=line",
        "trusted_targets=[tests]",
    ],
    **{option: [o for o in LANGUAGE_MODEL if o != option] for option in LANGUAGE_MODEL},
    # trainer=fsdp shards the GPT's blocks (trainer.strategy.wrap): the default MLP has none.
    "trainer=fsdp": LANGUAGE_MODEL,
    # Its 24 blocks of width 2048 (1.2B parameters) took 22 s to initialise on a 2-core CPU;
    # two blocks of that width build the same objects.
    "experiment=gpt_1b": ["model.net.n_layer=2"],
}


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


CASES = [f"{group}={option}" for group in GROUPS for option in options(group)]


def named(target: str) -> type:
    located = _locate(target)
    assert isinstance(located, type), target
    return located


def entries(section: DictConfig | None) -> list[DictConfig]:
    """The switched-on entries of a `name: {_target_: ...}` section (callbacks, logger)."""
    return [entry for entry in (section or {}).values() if entry is not None]


def test_every_group_has_options() -> None:
    assert all(options(g) for g in GROUPS)


def assert_data_and_model(cfg: DictConfig, run: TrainingObjects) -> None:
    assert type(run.datamodule) is named(cfg.data._target_)
    assert run.datamodule.batch_size == cfg.data.batch_size  # type: ignore[attr-defined]
    assert type(run.model) is named(cfg.model._target_)
    if "net" in cfg.model:
        assert type(run.model.net) is named(cfg.model.net._target_)
    if "optimizer" in cfg.model:
        configured = run.model.configure_optimizers()
        optimizer = configured["optimizer"] if isinstance(configured, dict) else configured
        assert type(optimizer) is named(cfg.model.optimizer._target_)
        # The constructor's value: a warm-up schedule has already scaled the group's lr.
        assert optimizer.defaults["lr"] == cfg.model.optimizer.lr
    module = toggled_module(run.model, cfg.task.module)
    # compile replaces the module's call; running it here would compile for seconds (test_build).
    compiled = getattr(module, "_compiled_call_impl", None) is not None
    assert compiled is (cfg.compile.mode is not None)
    shape = getattr(run.datamodule, "input_shape", None)
    if shape is not None and not compiled:
        run.model.eval()
        with torch.no_grad():
            logits = run.model(torch.zeros(2, *shape))
        assert logits.shape == (2, run.datamodule.num_classes)  # type: ignore[attr-defined]


def expected_trainer_settings(trainer: DictConfig) -> dict[str, Any]:
    """What Lightning's Trainer holds once built from `trainer` (its debugging flags win)."""
    if trainer.get("fast_dev_run"):
        # One batch of each loop, once, whatever else the config says.
        return {"fast_dev_run": True, "max_epochs": 1, "max_steps": 1, "num_sanity_val_steps": 0}
    settings = {
        key: trainer[key]
        for key in (
            "max_epochs",
            "max_steps",
            "accumulate_grad_batches",
            "gradient_clip_val",
            "log_every_n_steps",
            "check_val_every_n_epoch",
            "num_sanity_val_steps",
        )
    }
    settings["limit_test_batches"] = trainer.limit_test_batches or 1.0
    if trainer.get("overfit_batches"):
        settings["overfit_batches"] = trainer.overfit_batches
    else:
        settings["limit_train_batches"] = trainer.limit_train_batches or 1.0
        settings["limit_val_batches"] = trainer.limit_val_batches or 1.0
    return settings


def assert_trainer(cfg: DictConfig, trainer: pl.Trainer) -> None:
    held = {key: getattr(trainer, key) for key in expected_trainer_settings(cfg.trainer)}
    assert held == expected_trainer_settings(cfg.trainer)
    assert trainer.precision == cfg.precision
    assert trainer.num_devices == cfg.trainer.devices
    if OmegaConf.is_dict(cfg.trainer.strategy):
        assert isinstance(trainer.strategy, named(cfg.trainer.strategy._target_))
    if cfg.trainer.get("profiler"):
        assert type(trainer.profiler) is named(cfg.trainer.profiler._target_)
    callbacks = {type(c) for c in trainer.callbacks}  # type: ignore[attr-defined]
    for entry in entries(cfg.get("callbacks")):
        wanted = named(entry._target_)
        if wanted is LearningRateMonitor and not entries(cfg.get("logger")):
            assert wanted not in callbacks  # nothing to log to: Lightning would refuse it
        else:
            assert wanted in callbacks, entry._target_
    if not cfg.trainer.get("fast_dev_run"):  # which swaps the loggers for a dummy
        loggers = sorted((type(x) for x in trainer.loggers), key=str)
        assert loggers == sorted(map(named, targets(cfg.logger)), key=str)


def targets(section: DictConfig | None) -> list[str]:
    return [entry._target_ for entry in entries(section)]


def assert_sweep(cfg: DictConfig) -> None:
    """Every parameter an hparams_search sweeps is a key of the run's config."""
    params = HydraConfig.get().sweeper.get("params") or {}
    for key in params:
        assert OmegaConf.select(cfg, key) is not None, f"sweeps {key}, which the config lacks"


@pytest.mark.parametrize("override", CASES)
def test_option_composes_and_builds(override: str, compose_config: Compose, tmp_path: Path) -> None:
    cfg = compose_config(
        "train", [override, f"paths.data_dir={tmp_path}", *EXTRA.get(override, [])]
    )
    if override.startswith("hparams_search="):
        assert_sweep(cfg)
    check_config(cfg)
    check_resolves(cfg)
    check_target_arguments(cfg)  # every key of every `_target_` section is an argument it takes
    run = build_training(cfg, OmegaConf.to_container(cfg, resolve=True))
    assert_data_and_model(cfg, run)
    assert_trainer(cfg, run.trainer)


@pytest.fixture
def checkpoint(compose_config: Compose, fast: list[str]) -> tuple[Path, dict[str, float]]:
    """A real run's best checkpoint: one short epoch of the default run."""
    cfg = compose_config(
        "train",
        [*fast, "trainer.max_epochs=1", "trainer.limit_train_batches=5", "logger=none"],
    )
    metrics = train(cfg)
    record = json.loads((Path(cfg.paths.output_dir) / "metrics.json").read_text())
    return Path(record["best_checkpoint"]), metrics


def test_eval_config_evaluates_a_checkpoint(
    checkpoint: tuple[Path, dict[str, float]], compose_config: Compose
) -> None:
    best, trained = checkpoint
    cfg = compose_config("eval", [f"ckpt_path={best}", "callbacks.progress_bar=null"])
    assert cfg.mode == "test"
    check_resolves(cfg)
    evaluated = evaluate(cfg)
    # The same weights on the same test split: what the training run's own test measured.
    assert evaluated["test/acc"] == trained["test/acc"]
    assert evaluated["test/loss"] == trained["test/loss"]
    record = json.loads((Path(cfg.paths.output_dir) / "metrics.json").read_text())
    assert record["checkpoint"] == str(best.resolve())
    assert (Path(cfg.paths.output_dir) / "csv" / "metrics.csv").is_file()  # eval's logger=csv


def test_a_misspelt_key_in_a_config_file_is_named(compose_config: Compose) -> None:
    """The check reads the composed config, wherever a key came from (conf/ or the command line)."""
    cfg = compose_config("train", ["+callbacks.early_stopping.patiense=3"])
    with pytest.raises(ConfigError, match=r"did you mean callbacks\.early_stopping\.patience\?"):
        check_target_arguments(cfg)
