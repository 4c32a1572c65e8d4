"""What Lightning's Trainer refuses only when it is built (after the run directory exists), asked
of Lightning's own registries and device parsers beforehand: the accelerator's name and whether
this machine has it, the device count for it, the strategy's name."""

import difflib
from typing import Any

from lightning.pytorch.accelerators import AcceleratorRegistry
from omegaconf import DictConfig, OmegaConf

from volt.errors import ConfigError


def check_trainer_flags(cfg: DictConfig) -> None:
    """Raise ConfigError for an accelerator this machine lacks, devices its accelerator refuses,
    or a strategy name Lightning does not know. Train reads trainer.*, eval its top-level keys."""
    prefix = "trainer." if isinstance(cfg.get("trainer"), DictConfig) else ""
    accelerator = OmegaConf.select(cfg, f"{prefix}accelerator", default="auto")
    if not isinstance(accelerator, str):
        return  # the value rules name the problem
    name = _used_accelerator(f"{prefix}accelerator", accelerator)
    if prefix:
        _check_devices(OmegaConf.select(cfg, "trainer.devices", default="auto"), name)
        _check_strategy(OmegaConf.select(cfg, "trainer.strategy", default="auto"))


def _available() -> list[str]:
    names = AcceleratorRegistry.available_accelerators()
    return sorted(n for n in names if AcceleratorRegistry[n]["accelerator"].is_available())


def _used_accelerator(key: str, accelerator: str) -> str:
    """The registry name of the accelerator Lightning would pick for `accelerator`."""
    available = _available()
    if accelerator == "auto":
        # Lightning's order (lightning.fabric.utilities.device_parser._select_auto_accelerator)
        return next(n for n in ("tpu", "mps", "cuda", "cpu") if n in available)
    wanted = {"gpu": ("mps", "cuda")}.get(accelerator, (accelerator,))
    found = [n for n in wanted if n in available]
    if not found:
        raise ConfigError(
            f"{key}={accelerator!r} but this machine has no such device (Lightning finds only"
            f" {', '.join(available)}): use {key}=auto, or one of {', '.join(available)}"
        )
    return found[0]


def _check_devices(devices: Any, accelerator: str) -> None:
    fix = "e.g. trainer.devices=1, or trainer.devices=auto"
    value = OmegaConf.to_container(devices) if OmegaConf.is_config(devices) else devices
    if value in (0, "0", []) or isinstance(value, bool):
        raise ConfigError(f"trainer.devices={value!r} is not valid: use at least one, {fix}")
    if value == "auto":
        return
    try:
        AcceleratorRegistry[accelerator]["accelerator"].parse_devices(value)
    except Exception as error:  # Lightning's own verdict (TypeError, MisconfigurationException)
        raise ConfigError(
            f"trainer.devices={value!r} is not valid on {accelerator}: {error} ({fix})"
        ) from error


def _check_strategy(strategy: Any) -> None:
    fix = "use trainer=ddp or trainer=dp, or trainer.strategy=auto"
    if isinstance(strategy, DictConfig):
        if "_target_" in strategy:
            return  # its keys are checked against its class (volt.config.keys)
        raise ConfigError(
            f"trainer.strategy={OmegaConf.to_container(strategy)} is neither a strategy's name"
            f" nor a section with a _target_: {fix}"
        )
    if not isinstance(strategy, str) or strategy.lower() == "auto":
        return
    from lightning.pytorch.strategies import StrategyRegistry

    known = sorted(StrategyRegistry.available_strategies())
    if strategy.lower() in known:
        return
    close = difflib.get_close_matches(strategy.lower(), known, n=3)
    hint = (
        f"did you mean {' or '.join(close)}? or" if close else f"Lightning's: {', '.join(known)};"
    )
    raise ConfigError(
        f"trainer.strategy={strategy!r} is not a strategy Lightning knows: {hint} {fix}"
    )
