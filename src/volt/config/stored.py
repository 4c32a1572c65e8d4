"""What volt rebuilds from a stored config: the `model` and `data` sections of a checkpoint's
config (eval, predict, `load_trained_module`), checked as data a stranger may have written.

A checkpoint can be downloaded from anywhere, so this path is narrower than the one for configs
the user composes (`volt.config.targets`):

- Only two sections are read: `model` and `data`. Everything else in the file (trainer,
  callbacks, loggers, paths, task, trusted_targets, hydra) is never built, resolved or read.
- Every `_target_` is a class, never a function: the model a LightningModule, the data a
  LightningDataModule, and a nested one an `nn.Module`, or, as a partial, an optimiser or a
  learning-rate scheduler. They come from volt's models, data and nets, from `torch.nn`'s layers
  and `torch.optim`, from the checkout being run, or from packages the user's command or local
  config trusts; the file's own `trusted_targets` does not count.
- No `_args_`, `_recursive_` or `_convert_`; `_partial_` only on an optimiser or scheduler.
- No interpolation, except `${oc.env:NAME}` at a key named like a secret (where volt's own
  redaction wrote it) and only for a NAME the user's command lists in `allow_env`.
- A string that names a place on disk (absolute, `~`, `..`, a URL, or an existing relative path)
  must lie inside the local data folder: a data module writes caches and downloads there.

What the objects then cost is checked in `volt.rebuild` (shapes on the meta device first).
"""

import inspect
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from volt.config.redaction import says_secret
from volt.config.targets import (
    FIX,
    TARGET_KEY,
    VOLT_PACKAGE,
    article,
    check_path,
    checkout_packages,
    locate_checked,
    trusted_prefixes,
)
from volt.errors import ConfigError

SECTIONS = ("model", "data")
# The text prefixes a stored target may start with, and where the class must be defined: a path
# through `torch.nn` reaches `torch.nn.parallel.DistributedDataParallel` too, a home in
# `torch.nn.modules` does not.
_VOLT_ROOMS = tuple(f"{VOLT_PACKAGE}.{room}" for room in ("models", "data", "nets"))
STORED_PREFIXES = (*_VOLT_ROOMS, "torch.nn", "torch.optim")
STORED_HOMES = (*_VOLT_ROOMS, "torch.nn.modules", "torch.optim")
SECTION_KINDS: dict[str, type] = {"model": pl.LightningModule, "data": pl.LightningDataModule}
PARTIAL_KINDS = (Optimizer, LRScheduler)
PRECISIONS = frozenset(
    {"64-true", "64", "32-true", "32", "16-mixed", "bf16-mixed", "16-true", "bf16-true"}
)
ENV_READ = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)\}")
REFUSED_KEYS = ("_args_", "_recursive_", "_convert_")
STORED_NAMES = (
    "a stored config names only volt's models, data and nets, torch.nn's layers, torch.optim and"
    " this checkout's packages"
)


def check_stored_sections(
    stored: Mapping[str, Any],
    trusted: Iterable[Any],
    allow_env: Iterable[str],
    data_dir: Path,
    sections: Iterable[str] = SECTIONS,
) -> None:
    """Raise ConfigError, naming the key, for the first thing in the stored `sections` that volt
    would not rebuild (see the module docstring). `trusted` and `allow_env` come from the user's
    command line or local config, never from the file."""
    prefixes = stored_prefixes(trusted)
    homes = (*STORED_HOMES, *trusted_prefixes(trusted), *checkout_packages())
    allowed_env = set(allow_env)
    for section in sections:
        node = stored.get(section)
        if not isinstance(node, Mapping) or TARGET_KEY not in node:
            raise ConfigError(
                f"{section}: the checkpoint's config holds no {section} section with a"
                f" {TARGET_KEY}: it was not written by volt's training"
            )
        for key, target_node in _target_nodes(node, section):
            found = _check_target_node(key, target_node, section, prefixes, homes)
            for argument in _path_arguments(found) & set(target_node):
                for place in _as_list(target_node[argument]):
                    _check_place(f"{key}.{argument}", place, data_dir)
        for key, value in _strings(node, section):
            _check_string(key, value, allowed_env, data_dir)


def stored_prefixes(trusted: Iterable[Any]) -> tuple[str, ...]:
    """What a stored config's targets may lie in: STORED_PREFIXES, the user's `trusted_targets`
    and the checkout's own packages. Volt's check and Hydra's execution whitelist both read it."""
    return (*STORED_PREFIXES, *trusted_prefixes(trusted), *checkout_packages())


def check_stored_precision(value: Any) -> None:
    if value is not None and str(value) not in PRECISIONS:
        raise ConfigError(
            f"precision: the checkpoint's {value!r} is not one of {sorted(PRECISIONS)}:"
            " give precision=... on the command line"
        )


def _check_target_node(
    key: str, node: Mapping[str, Any], section: str, prefixes: tuple, homes: tuple
) -> type:
    """The class `node` builds, once it may be built from a file."""
    target = node[TARGET_KEY]
    where = f"{key}: _target_={target}"
    if "device" in node:
        # An explicit device beats `with torch.device("meta")`: the twin volt sizes the model
        # with would be built for real (volt.rebuild).
        raise ConfigError(
            f"{key}.device is not allowed in a stored config: volt places the model itself"
        )
    for special in REFUSED_KEYS:
        if special in node:
            raise ConfigError(
                f"{key}.{special} is not allowed in a stored config: volt rebuilds a stored model"
                " and data from keyword arguments only"
            )
    check_path(key, target, prefixes, STORED_NAMES)
    found = locate_checked(key, target)
    module = str(getattr(found, "__module__", ""))
    if not any(module == home or module.startswith(home + ".") for home in homes):
        raise ConfigError(
            f"{where} is not allowed: it is defined in {module}; {STORED_NAMES}"
            f" {FIX.format(module.split('.')[0])}"
        )
    if not inspect.isclass(found):
        raise ConfigError(
            f"{where} is not allowed: it is a function; a stored config builds classes only"
        )
    partial = node.get("_partial_", False)
    if key == section:
        kinds: tuple[type, ...] = (SECTION_KINDS[section],)
    elif partial is True:
        kinds = PARTIAL_KINDS
    else:
        kinds = (nn.Module,)
    if partial not in (True, False) or (partial and key == section):
        raise ConfigError(f"{key}._partial_={partial!r} is not allowed here")
    if not issubclass(found, kinds):
        names = " or ".join(kind.__name__ for kind in kinds)
        raise ConfigError(
            f"{where} is not allowed: a stored config builds {article(names)} here, and it is"
            " not one"
        )
    return found


def _path_arguments(found: type) -> set[str]:
    """The constructor arguments annotated as paths (`root: str | Path`): a relative or empty
    value there is a place too, where a data module creates folders and writes files."""
    try:
        parameters = inspect.signature(found).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {p.name for p in parameters if "Path" in str(p.annotation)}


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _check_place(key: str, value: Any, data_dir: Path) -> None:
    if isinstance(value, str) and not _inside(value, data_dir):
        raise ConfigError(
            f"{key}={value!r} is not allowed: it lies outside this project's data folder"
            f" {data_dir}, and a stored config may only name places inside it; pass"
            " data_root=... or data=<a local data config> on the command line"
        )


def _check_string(key: str, value: str, allowed_env: set[str], data_dir: Path) -> None:
    if "${" in value:
        read = ENV_READ.fullmatch(value)
        last = key.rsplit(".", 1)[-1].split("[", 1)[0]
        if read is None or not says_secret(last):
            raise ConfigError(
                f"{key}: {value!r} is not allowed: a stored config holds plain values (an"
                " environment read only at a secret's key, as volt writes one)"
            )
        if read.group(1) not in allowed_env:
            raise ConfigError(
                f"{key}: the checkpoint asks for ${{oc.env:{read.group(1)}}}: add"
                f" allow_env=[{read.group(1)}] to your command if you mean to give it that variable"
            )
        return
    if _names_a_place(value):
        _check_place(key, value, data_dir)


def _names_a_place(value: str) -> bool:
    """Absolute, `~`, `..`, a URL, or a relative path that exists (from the working directory):
    what a data module would read or write. `val/loss` or `auto` are not places."""
    if "://" in value or value.startswith("~") or os.path.isabs(value):
        return True
    return ".." in Path(value).parts or (value != "" and os.path.lexists(value))


def _inside(value: str, data_dir: Path) -> bool:
    if "://" in value:
        return False
    path = Path(value).expanduser().resolve()
    return path.is_relative_to(data_dir.resolve())


def _target_nodes(node: Any, key: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    if isinstance(node, Mapping):
        if TARGET_KEY in node:
            yield key, node
        for k, value in node.items():
            yield from _target_nodes(value, f"{key}.{k}")
    elif isinstance(node, list | tuple):
        for i, value in enumerate(node):
            yield from _target_nodes(value, f"{key}[{i}]")


def _strings(node: Any, key: str) -> Iterator[tuple[str, str]]:
    """(key, value) for every string in `node`, keys included (a key is refused if not a plain
    word: OmegaConf would otherwise read `${...}` in it later); a value that is no config value
    (a set, a tensor) is refused."""
    if isinstance(node, Mapping):
        for k, value in node.items():
            if not isinstance(k, str) or "${" in k or not k.isprintable():
                raise ConfigError(f"{key}: the key {k!r} is not allowed in a stored config")
            yield from _strings(value, f"{key}.{k}")
    elif isinstance(node, list | tuple):
        for i, value in enumerate(node):
            yield from _strings(value, f"{key}[{i}]")
    elif isinstance(node, str):
        yield key, node
    elif not isinstance(node, int | float | None):  # bool is an int
        # weights_only loads sets, tensors and bytes too, which no config holds (OmegaConf
        # fails on them with a traceback, after eval's folder was made)
        raise ConfigError(
            f"{key}: the checkpoint's config holds a {type(node).__name__}, which no config"
            " holds: it was not written by volt's training; give a checkpoint a run wrote"
        )
