"""Which callables a config may name. Hydra's `instantiate` calls every `_target_` in a config,
nested ones included, so a config read from a file (a checkpoint's, the one a DDP rank starts
from) would run whatever it names: volt rebuilds objects only from an allow-list.

A `_target_` passes when its dotted path has no private part and lies in an allowed package (or is
an allowed name), and when the object Hydra resolves it to is a class or function of that name
whose home is that package. Hydra's `_locate` walks attributes with getattr, so the path alone
proves nothing: `torch.optim.optimizer.torch.save` lies in `torch.optim` but is `torch.save`.
"""

import importlib.util
import inspect
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from hydra._internal.utils import _locate
from omegaconf import OmegaConf

from volt.config import PROJECT_ROOT
from volt.errors import ConfigError

TARGET_KEY = "_target_"
# Packages (every public class and function in them) or single names. Matched at dots:
# `torch.optim` admits `torch.optim.lr_scheduler.StepLR`, never `torch.optimx.f`.
VOLT_PACKAGE = __name__.split(".")[0]  # volt itself, under whatever name the package was renamed to
ALLOWED = (
    # volt's rooms of buildable parts; never its entry points and build functions (`volt.build`,
    # `volt.training`, `volt.eval`, ...): a config naming one would pass its own arguments to them.
    *(
        f"{VOLT_PACKAGE}.{room}"
        for room in ("callbacks", "data", "loggers", "models", "nets", "strategies")
    ),
    "torch.optim",  # optimisers and learning-rate schedulers
    "lightning.pytorch.Trainer",
    "lightning.pytorch.callbacks",
    "lightning.pytorch.loggers",
    "lightning.pytorch.profilers",
    "torch.profiler.schedule",  # debug=profiler
    "torch.profiler.tensorboard_trace_handler",
)
# What allowed functions return, by the names Hydra checks a returned callable by (hydra-core 1.4;
# volt's own check reads targets only): debug=profiler's schedule and trace handler, closures
# inside the functions ALLOWED names (seen: torch 2.14).
RETURNED_CALLABLES = (
    "torch.profiler.profiler.schedule.<locals>.schedule_fn",
    "torch.profiler.profiler.tensorboard_trace_handler.<locals>.handler_fn",
)
# The interpolations a stored config may hold: environment reads, which volt writes there itself
# (`volt.config.redaction` stores `${oc.env:NAME}`, never the value), also under oc.decode. Each
# gives a value from the reader's own environment, and what it gives is checked again as it is
# built. Nothing else: another resolver (oc.create of literal text builds a `_target_` that no
# walk of the file sees) or a reference to another key.
_ENV_READ = r"\$\{\s*oc\.env\s*:\s*[A-Za-z_][A-Za-z0-9_]*\s*(?:,[^$\\{}]*)?\}"
STORED_INTERPOLATION = re.compile(rf"{_ENV_READ}|\$\{{\s*oc\.decode\s*:\s*{_ENV_READ}\s*\}}")
DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
FIX = "(add its package to trusted_targets=[{}] if you trust it)"


def check_stored_config(config: Any, trusted: Iterable[Any]) -> None:
    """A config read back from a file: no interpolation but the environment reads volt writes
    there itself, and only allowed targets. `trusted` must come from the command line or conf/,
    never from the file: a file cannot widen its own allow-list."""
    data = OmegaConf.to_container(config, resolve=False) if OmegaConf.is_config(config) else config
    for key, value in _strings(data, ""):
        refused = _refused_interpolation(value)
        if refused is not None:
            raise ConfigError(
                f"{key}: {refused!r} is not allowed: a stored config holds resolved values (and"
                " ${oc.env:NAME}), and this interpolation would run when the file is read back"
            )
    check_targets(data, trusted)


def check_targets(config: Any, trusted: Iterable[Any]) -> None:
    """Raise ConfigError for the first `_target_` in `config` that is not allowed.

    `config` is a DictConfig / ListConfig (resolved here, as `instantiate` would) or plain dicts
    and lists; `trusted` holds the user's extra packages (the `trusted_targets` key).
    """
    allowed = allowed_prefixes(trusted)
    data = OmegaConf.to_container(config, resolve=True) if OmegaConf.is_config(config) else config
    targets = list(_targets(data, ""))
    # Every path is checked as text before any is resolved: resolving imports modules.
    for key, target in targets:
        check_path(key, target, allowed)
    for key, target in targets:
        locate_checked(key, target)


def allowed_prefixes(trusted: Iterable[Any]) -> tuple[str, ...]:
    """What a composed config's targets may lie in: ALLOWED, the user's `trusted_targets` and the
    checkout's own packages. Volt's check and Hydra's execution whitelist both read it."""
    return (*ALLOWED, *trusted_prefixes(trusted), *checkout_packages())


@cache
def checkout_packages(root: Path = PROJECT_ROOT) -> tuple[str, ...]:
    """The top-level packages and modules of the checkout being run, found in its `src/` folder and
    beside `train.py` (a folder holding Python files, or a `.py` file): the user runs this code
    already, so configs may name it without `trusted_targets`. Each counts only where Python
    imports it from inside the checkout (`_from_checkout`): a package of the same name installed
    elsewhere stays refused. volt itself is not among them (only its rooms are, in ALLOWED), nor
    Hydra's plugin namespace."""
    found = set()
    for folder in (root / "src", root):
        if not folder.is_dir():
            continue
        for entry in folder.iterdir():
            name = entry.stem if entry.suffix == ".py" else entry.name
            is_code = entry.suffix == ".py" or (entry.is_dir() and any(entry.glob("*.py")))
            if is_code and name.isidentifier() and _from_checkout(name, root):
                found.add(name)
    # volt's tests and benchmarks are folders of the checkout but no user's model code: their
    # test doubles (a data set of any size, a module that fails on purpose) are never trusted.
    not_models = {
        VOLT_PACKAGE,
        "hydra_plugins",
        "train",
        "setup",
        "conftest",
        "tests",
        "benchmarks",
    }
    return tuple(sorted(found - not_models))


def _from_checkout(name: str, root: Path) -> bool:
    """Python finds top-level `name` inside `root` (found, not imported: nothing runs here)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    places = [spec.origin] if spec.origin else list(spec.submodule_search_locations or [])
    return bool(places) and all(_inside(Path(place), root) for place in places)


def _inside(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())


def trusted_prefixes(trusted: Iterable[Any]) -> tuple[str, ...]:
    """`trusted_targets` as dotted names, trailing dots dropped (`mypkg.` is `mypkg`)."""
    example = "e.g. trusted_targets=[mypkg] or trusted_targets=[mypkg.models]"
    if isinstance(trusted, str | bytes) or not isinstance(trusted, Iterable):
        raise ConfigError(
            f"trusted_targets={trusted!r} is not valid: use a list of packages, {example}"
        )
    prefixes = []
    for entry in trusted:
        name = entry.rstrip(".") if isinstance(entry, str) else entry
        if not isinstance(name, str) or not DOTTED.fullmatch(name):
            raise ConfigError(
                f"trusted_targets entry {entry!r} is not valid: use dotted package names, {example}"
            )
        prefixes.append(name)
    return tuple(prefixes)


def check_path(
    key: str,
    target: Any,
    allowed: tuple[str, ...],
    names: str = "volt builds only its own callbacks, data, loggers, models, nets and"
    " strategies, torch.optim's, and Lightning's Trainer, callbacks, loggers and profilers",
) -> None:
    """`target` as text: a public dotted path inside one of the `allowed` prefixes."""
    where = f"{key or 'config'}: _target_={target}"
    if not isinstance(target, str) or not DOTTED.fullmatch(target):
        raise ConfigError(
            f"{key or 'config'}: _target_={target!r} is not allowed: a target is the dotted path"
            " of a class or function"
        )
    private = [part for part in target.split(".") if part.startswith("_")]
    if private:
        raise ConfigError(
            f"{where} is not allowed: {private[0]!r} is private; name a public class or function"
        )
    if not _admitted(target, allowed) and target.split(".")[0] == VOLT_PACKAGE:
        raise ConfigError(
            f"{where} is not allowed: {names}; volt's entry points, build, record and console"
            " functions are never buildable from a config"
        )
    if not _admitted(target, allowed):
        raise ConfigError(f"{where} is not allowed: {names} " + FIX.format(target.split(".")[0]))


def locate_checked(key: str, target: str) -> Any:
    """The class or function `target` names, once it is shown to be defined where the path says
    (see the module docstring); a target from the checkout must be defined inside it."""
    where = f"{key or 'config'}: _target_={target}"
    try:
        found = _locate(target)  # what instantiate itself calls for a string target
    except Exception as error:
        cause = error.__cause__ or error  # _locate's own message spans several lines
        raise ConfigError(f"{where} cannot be found: {cause!r}") from error
    if not (inspect.isclass(found) or inspect.isfunction(found)):
        raise ConfigError(
            f"{where} is not allowed: it is {article(type(found).__name__)}, not a class or"
            " function"
        )
    package, _, name = target.rpartition(".")
    module, qualname = str(getattr(found, "__module__", "")), found.__qualname__
    # The object must be defined under the path's package with the path's last name: the path is
    # its home or a re-export from a parent package (`torch.optim.AdamW` lives in
    # `torch.optim.adamw`). With `package` inside an allowed prefix, so is the object's home.
    if "." in qualname:
        raise ConfigError(
            f"{where} is not allowed: it is {module}.{qualname}, not a module-level class or"
            " function"
        )
    if qualname != name or not (module == package or module.startswith(package + ".")):
        raise ConfigError(
            f"{where} is not allowed: it is {module}.{qualname}, reached through another module"
            f" or name; name it by that path {FIX.format(module.split('.')[0])}"
        )
    top = target.split(".")[0]
    if top in checkout_packages():
        file = getattr(sys.modules.get(module), "__file__", None)
        if file is None or not _inside(Path(file), PROJECT_ROOT):
            raise ConfigError(
                f"{where} is not allowed: it was imported from {file}, outside this checkout"
                f" ({PROJECT_ROOT}) {FIX.format(top)}"
            )
    return found


def _admitted(path: str, allowed: tuple[str, ...]) -> bool:
    return any(path == prefix or path.startswith(prefix + ".") for prefix in allowed)


def _targets(node: Any, key: str) -> Iterator[tuple[str, Any]]:
    """(key, target) for every mapping that has a `_target_`, at any depth: under `_args_`, in
    lists, and below `_recursive_: false` too (the callable it reaches may instantiate them)."""
    if isinstance(node, Mapping):
        if TARGET_KEY in node:
            yield key, node[TARGET_KEY]
        for k, value in node.items():
            if k != TARGET_KEY:
                yield from _targets(value, f"{key}.{k}" if key else str(k))
    elif isinstance(node, list | tuple):
        for i, value in enumerate(node):
            yield from _targets(value, f"{key}[{i}]")


def _refused_interpolation(text: str) -> str | None:
    """`text` from its first interpolation that is not an environment read; None if none is."""
    start = text.find("${")
    while start != -1:
        backslashes = len(text[:start]) - len(text[:start].rstrip("\\"))
        if backslashes % 2:  # `\${` is a literal `${` (and `\\${` a backslash, then a real one)
            start = text.find("${", start + 2)
            continue
        read = STORED_INTERPOLATION.match(text, start)
        if read is None:
            return text[start:]
        start = text.find("${", read.end())
    return None


def _strings(node: Any, key: str) -> Iterator[tuple[str, str]]:
    """(key, value) for every string value in `node` (OmegaConf never resolves keys)."""
    if isinstance(node, Mapping):
        for k, value in node.items():
            yield from _strings(value, f"{key}.{k}" if key else str(k))
    elif isinstance(node, list | tuple):
        for i, value in enumerate(node):
            yield from _strings(value, f"{key}[{i}]")
    elif isinstance(node, str):
        yield key, node


def article(noun: str) -> str:
    return f"an {noun}" if noun[:1].lower() in "aeiou" else f"a {noun}"
