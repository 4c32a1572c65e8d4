"""Hydra's execution whitelist: the second check on what a config may call. volt's own check
(`volt.config.targets` for composed configs, `volt.config.stored` for a checkpoint's) comes
first and explains a refusal; Hydra's is given the same prefixes, so it refuses nothing volt admits.

hydra-core 1.4 (seen: 1.4.0rc3) checks every target `instantiate` resolves, and every callable a
target returns, against the caller's `_execution_whitelist_`, and the callbacks and logging
handlers Hydra builds itself against `hydra.main(execution_whitelist=...)`; without one it warns
at each (an error from 1.5). hydra-core 1.3 takes neither argument. The choice goes by what the
functions take; once volt requires hydra-core>=1.4, pass the whitelists always and drop the
empty branches.
"""

import inspect
from collections.abc import Iterable
from typing import Any

import hydra
from hydra.utils import instantiate

from volt.config.targets import VOLT_PACKAGE

_INSTANTIATE_TAKES_ONE = "_execution_whitelist_" in inspect.signature(instantiate).parameters
_MAIN_TAKES_ONE = "execution_whitelist" in inspect.signature(hydra.main).parameters
# What Hydra builds itself from conf/hydra/: volt's callback (default.yaml) and the logging
# handlers and filter (job_logging/console_and_file.yaml). Hydra adds this list to every
# whitelist passed inside the job; volt's own check still refuses these as `_target_`s of the
# run's config.
HYDRA_BUILDS = (
    f"{VOLT_PACKAGE}.hydra_callbacks.VoltCallback",
    "rich.logging.RichHandler",
    "logging.FileHandler",
    f"{VOLT_PACKAGE}.errors.EscapedText",
)


def patterns(prefixes: Iterable[str]) -> list[str]:
    """Each dotted prefix as Hydra matches one: the name itself, and everything under it (`p.*`)."""
    return [form for prefix in prefixes for form in (prefix, f"{prefix}.*")]


def instantiate_whitelist(prefixes: Iterable[str], names: Iterable[str] = ()) -> dict[str, Any]:
    """`instantiate`'s keyword argument admitting `prefixes` and the exact `names`; none where
    Hydra takes no whitelist."""
    if not _INSTANTIATE_TAKES_ONE:
        return {}
    return {"_execution_whitelist_": [*patterns(prefixes), *names]}


def main_whitelist() -> dict[str, Any]:
    """`hydra.main`'s keyword argument admitting HYDRA_BUILDS; none where it takes no whitelist."""
    return {"execution_whitelist": list(HYDRA_BUILDS)} if _MAIN_TAKES_ONE else {}
