"""Hydra's execution whitelist (hydra-core 1.4) holds volt's allow-list again: a run builds without
a warning from Hydra, OmegaConf or volt, and Hydra refuses what volt's list lacks. On a Hydra that
takes no whitelist (1.3) the build is silent too."""

import warnings
from collections.abc import Callable
from pathlib import Path

import hydra
import omegaconf
import pytest
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig

import volt
from volt.build import build_training
from volt.config.execution_whitelist import instantiate_whitelist
from volt.config.targets import allowed_prefixes

Compose = Callable[..., DictConfig]
ORIGINS = tuple(Path(str(m.__file__)).resolve().parent for m in (volt, hydra, omegaconf))
takes_a_whitelist = pytest.mark.skipif(
    not instantiate_whitelist([]), reason="this Hydra takes no execution whitelist (< 1.4)"
)


def from_the_libraries(seen: list[warnings.WarningMessage]) -> list[str]:
    """The warnings pointing into volt, Hydra or OmegaConf, one line each."""
    return [
        f"{w.filename}:{w.lineno}: {str(w.message).splitlines()[0]}"
        for w in seen
        if any(Path(w.filename).resolve().is_relative_to(origin) for origin in ORIGINS)
    ]


# debug=profiler: its targets return functions, which Hydra 1.4 checks as well.
@pytest.mark.parametrize("override", ["callbacks=default", "debug=profiler"])
def test_a_run_builds_without_a_warning(override: str, compose_config: Compose) -> None:
    cfg = compose_config("train", [override])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        build_training(cfg, {})
    assert from_the_libraries(seen) == [], f"hydra-core {hydra.__version__}"


@takes_a_whitelist
def test_hydra_refuses_a_target_outside_volts_list() -> None:
    with pytest.raises(InstantiationException, match="not in the Hydra execution whitelist"):
        instantiate({"_target_": "os.getcwd"}, **instantiate_whitelist(allowed_prefixes([])))
