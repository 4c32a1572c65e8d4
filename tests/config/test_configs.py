"""Every option of every config group composes, passes validation and instantiates."""

from collections.abc import Callable
from pathlib import Path

import lightning.pytorch as pl
import pytest
from omegaconf import DictConfig, OmegaConf

from volt.build import build_training
from volt.config import CONF_DIR
from volt.config.keys import check_target_arguments
from volt.config.validation import check_config, check_resolves
from volt.errors import ConfigError

GROUPS = (
    "data",
    "model",
    "trainer",
    "compile",
    "callbacks",
    "logger",
    "debug",
    "experiment",
    "hparams_search",
)


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


CASES = [f"{group}={option}" for group in GROUPS for option in options(group)]


def test_every_group_has_options() -> None:
    assert all(options(g) for g in GROUPS)


@pytest.mark.parametrize("override", CASES)
def test_option_composes_and_builds(
    override: str, compose_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    # trainer=gpu needs a GPU to build a Trainer; composing and validating it still must work.
    extra = ["trainer.accelerator=cpu"] if override == "trainer=gpu" else []
    cfg = compose_config("train", [override, f"paths.data_dir={tmp_path}", *extra])
    check_config(cfg)
    check_resolves(cfg)
    check_target_arguments(cfg)  # every key of every `_target_` section is an argument it takes
    run = build_training(cfg, OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]
    assert isinstance(run.trainer, pl.Trainer)
    assert run.model.net is not None
    assert run.datamodule.batch_size == cfg.data.batch_size


def test_eval_config_composes(compose_config: Callable[..., DictConfig]) -> None:
    cfg = compose_config("eval", ["ckpt_path=some.ckpt"])
    check_resolves(cfg)
    assert cfg.mode == "test"


def test_a_misspelt_key_in_a_config_file_is_named(
    compose_config: Callable[..., DictConfig],
) -> None:
    """The check reads the composed config, wherever a key came from (conf/ or the command line)."""
    cfg = compose_config("train", ["+callbacks.early_stopping.patiense=3"])
    with pytest.raises(ConfigError, match=r"did you mean callbacks\.early_stopping\.patience\?"):
        check_target_arguments(cfg)
