"""Unknown keys are refused before anything starts, naming the keys that would be read.

A section with `_target_` is handed to that callable, so its keys must be arguments the callable
takes (its signature; a volt class's `**kwargs` go on to its base class, and a few library
callables' `**kwargs` to one known callable, checked in turn). Any other section (the top level,
`compile`, `paths`) is read by volt: there a key that `+key=value` adds and conf/ does not define
would be read by nothing.
"""

import difflib
import inspect
from collections.abc import Iterator
from typing import Any

from hydra._internal.utils import _locate
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.types import RunMode
from omegaconf import DictConfig, ListConfig, OmegaConf

from volt.config.redaction import typed_overrides
from volt.config.targets import check_targets
from volt.errors import ConfigError

TARGET = "_target_"
HYDRA_KEYS = (TARGET, "_partial_", "_args_", "_recursive_", "_convert_")
PACKAGE = __name__.split(".")[0]
# Arguments volt.build passes the Trainer itself (keep in step with it); the model's come from
# the data module as `task.from_data` says (`passed_by_build`).
TRAINER_ARGUMENTS_FROM_BUILD = ("callbacks", "logger")


def passed_by_build(cfg: DictConfig) -> dict[str, tuple[str, ...]]:
    """{section: arguments volt.build fills in}: never missing from the config, and refused in it
    (build's value would silently win)."""
    passed: dict[str, list[str]] = {"trainer": list(TRAINER_ARGUMENTS_FROM_BUILD)}
    from_data = OmegaConf.select(cfg, "task.from_data", default=None) or {}
    for key in from_data:
        section, _, argument = f"model.{key}".rpartition(".")
        passed.setdefault(section, []).append(argument)
    return {section: tuple(arguments) for section, arguments in passed.items()}


# Library callables whose **kwargs volt can follow: (the callable that receives them, or None;
# names the owner reads itself). Any other library **kwargs are passed on unchecked.
KWARGS_GO_TO = {
    "lightning.pytorch.loggers.tensorboard.TensorBoardLogger": (
        "torch.utils.tensorboard.writer.SummaryWriter",
        (),
    ),
    "lightning.pytorch.strategies.ddp.DDPStrategy": (
        "torch.nn.parallel.distributed.DistributedDataParallel",
        (),
    ),
    "lightning.pytorch.profilers.pytorch.PyTorchProfiler": (
        "torch.profiler.profiler.profile",
        ("export_to_flame_graph", "metric"),
    ),
    "lightning.pytorch.callbacks.rich_model_summary.RichModelSummary": (None, ("header_style",)),
}
KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def check_target_arguments(cfg: DictConfig) -> None:
    """Every `_target_` section's keys against its callable: no key it does not take, none it
    needs missing (unless `_partial_`, completed later, or passed by volt.build)."""
    trusted = _trusted(cfg)
    passed = passed_by_build(cfg)
    for path, node in _target_sections(cfg, ""):
        _check_section(path, node, trusted, passed.get(path, ()))


def check_added_keys(cfg: DictConfig) -> None:
    """`+key=value` / `++key=value` on the command line may add only a key something reads: an
    argument of the `_target_` section it lands in, or an entry of a section of named entries
    (`callbacks`, `logger`). The config without those overrides is composed again to tell which
    keys conf/ defines; that costs a few tenths of a second, and only when there are any."""
    choices = set(cfg.hydra.runtime.choices)
    added = [
        o
        for o in OverridesParser.create().parse_overrides(typed_overrides(cfg))
        if (o.is_add() or o.is_force_add()) and o.key_or_group not in choices
    ]
    if not added:
        return
    reference = _compose_without(cfg, added)
    for override in added:
        _check_in(reference, override.key_or_group, str(cfg.hydra.job.config_name), _trusted(cfg))


def accepted_arguments(target: Any) -> tuple[dict[str, bool], bool]:
    """({argument: required}, open): open when **kwargs go where volt cannot follow them, or
    when Python cannot read a signature (a C extension's): those keys reach it unchecked."""
    arguments: dict[str, bool] = {}
    try:
        chain = list(_own_signatures(target))
    except (TypeError, ValueError):
        return arguments, True
    for owner, parameters in chain:
        for p in parameters:
            if p.kind in KEYWORD:
                arguments.setdefault(p.name, p.default is inspect.Parameter.empty)
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            return arguments, False
        if owner.startswith(PACKAGE + "."):
            continue  # volt's classes pass **kwargs to their base class
        if owner not in KWARGS_GO_TO:
            return arguments, True
        receiver, read_by_owner = KWARGS_GO_TO[owner]
        arguments.update(dict.fromkeys(read_by_owner, False))
        if receiver is None:
            return arguments, False
        try:
            received = inspect.signature(_locate(receiver)).parameters.values()
        except (ImportError, TypeError, ValueError):
            return arguments, True
        # The owner supplies what the receiver requires (the module, the log directory).
        arguments.update({p.name: False for p in received if p.kind in KEYWORD})
        return arguments, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in received)
    return arguments, False


def _own_signatures(target: Any) -> Iterator[tuple[str, list[inspect.Parameter]]]:
    """(owner's dotted name, parameters): a function's own; a class's `__init__`s along its MRO,
    `self` dropped (or, for a class without one, what inspect makes of its `__new__`)."""
    inits = [c for c in getattr(target, "__mro__", ()) if "__init__" in vars(c) and c is not object]
    if not inits:
        yield _dotted(target), list(inspect.signature(target).parameters.values())
    for cls in inits:
        parameters = list(inspect.signature(vars(cls)["__init__"]).parameters.values())
        yield _dotted(cls), parameters[1:]


def _dotted(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def _target_sections(node: Any, path: str) -> Iterator[tuple[str, DictConfig]]:
    """(key, section) for every mapping with a `_target_`, read without resolving values."""
    if isinstance(node, DictConfig):
        if TARGET in node:
            yield path, node
        for key in map(str, node):
            if (not path and key == "hydra") or OmegaConf.is_interpolation(node, key):
                continue
            yield from _target_sections(node._get_node(key), f"{path}.{key}" if path else key)
    elif isinstance(node, ListConfig):
        for i in range(len(node)):
            if not OmegaConf.is_interpolation(node, i):
                yield from _target_sections(node._get_node(i), f"{path}[{i}]")


def _trusted(cfg: DictConfig) -> Any:
    trusted = cfg.get("trusted_targets") or ()
    return OmegaConf.to_container(trusted) if OmegaConf.is_config(trusted) else trusted


def _callable(path: str, target: Any, trusted: Any) -> Any:
    """What `target` names, once the allow-list (volt.config.targets) admits it: locating it
    imports its module, which runs that module's code."""
    check_targets({path or "config": {TARGET: target}}, trusted)
    return _locate(target)


def _check_section(path: str, node: DictConfig, trusted: Any, passed: tuple[str, ...]) -> None:
    target = node[TARGET]
    arguments, is_open = accepted_arguments(_callable(path, target, trusted))
    keys = [str(k) for k in node if k not in HYDRA_KEYS]
    for key in keys:
        # model.net is the blueprint of what build passes as `net`; a plain value would be ignored.
        if key in passed and not _is_section(node._get_node(key)):
            raise ConfigError(
                f"{path}.{key} is set by volt ({', '.join(passed)} come from volt.build: the"
                f" data module's attributes named in task.from_data, or the Trainer's callbacks"
                f" and loggers): remove {path}.{key} from the config"
            )
        if not is_open and key not in arguments:
            raise ConfigError(
                _unknown(
                    f"{path}.{key}",
                    f"{target} takes no argument {key!r}",
                    key,
                    sorted(arguments),
                    path,
                )
            )
    if node.get("_partial_") or "_args_" in node:
        return
    missing = [a for a, required in arguments.items() if required and a not in [*keys, *passed]]
    if missing:
        raise ConfigError(
            f"{path}.{missing[0]} has no value: {target} needs it; set it, e.g."
            f" +{path}.{missing[0]}=..."
        )


def _compose_without(cfg: DictConfig, added: list[Override]) -> DictConfig:
    """The config as conf/ and the other overrides make it: what `added` adds is absent."""
    lines = {o.input_line for o in added}
    overrides = [o for o in typed_overrides(cfg) if o not in lines]
    overrides += list(cfg.hydra.overrides.hydra)
    loader = GlobalHydra.instance().config_loader()
    # Unset (None) where a job's config was composed without Hydra's run (volt.config.composition).
    mode = RunMode.RUN if cfg.hydra.mode is None else RunMode(cfg.hydra.mode)
    return loader.load_configuration(str(cfg.hydra.job.config_name), overrides, run_mode=mode)


def _check_in(reference: DictConfig, key: str, config_name: str, trusted: Any) -> None:
    """`key` leads through sections `reference` has to a `_target_` section (checked by its
    signature), a section of named entries, or a key that exists."""
    node: Any = reference
    parts = key.split(".")
    for i, part in enumerate(parts):
        path = ".".join(parts[:i])
        if not isinstance(node, DictConfig) or _holds_entries(node):
            return
        if TARGET in node:
            arguments, is_open = accepted_arguments(_callable(path, node[TARGET], trusted))
            if not is_open and part not in arguments and part not in HYDRA_KEYS:
                where = f"{node[TARGET]} takes no argument {part!r}"
                raise ConfigError(_unknown(key, where, part, sorted(arguments), path))
            return
        if part not in node:
            known = sorted(str(k) for k in node if path or k != "hydra")
            where = (
                f"{path} has no key {part!r}"
                if path
                else f"the {config_name} config has no top-level key {part!r}, so nothing reads it"
            )
            raise ConfigError(_unknown(key, where, part, known, path))
        node = node._get_node(part)


def _is_section(node: Any) -> bool:
    return isinstance(node, DictConfig) and TARGET in node


def _holds_entries(node: DictConfig) -> bool:
    """A section of named entries, each a `_target_` section or null (callbacks, logger)."""
    entries = [node._get_node(k) for k in node]
    return bool(entries) and all(
        _is_section(e) or e._is_none()  # type: ignore[union-attr]
        for e in entries
    )


def _unknown(key: str, problem: str, name: str, known: list[str], path: str) -> str:
    prefix = f"{path}." if path else ""
    close = difflib.get_close_matches(name, known, n=3)
    if close:
        return f"{key}: {problem}; did you mean {' or '.join(prefix + c for c in close)}?"
    return f"{key}: {problem}; known: {', '.join(known)}"
