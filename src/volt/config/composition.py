"""An override Hydra cannot compose ends as volt's one line, before Hydra makes a run directory.

`@hydra.main` reports such an error in several lines and exits 1; for a misspelt key it advises
`+key=value`, which volt then refuses (nothing reads a key conf/ does not set). `hydra_main`
first composes the config the command line asks for, with Hydra's compose API, and turns an
error there into one line: the override as typed, what is wrong, the close matches, what to type.
A multirun is composed once per option of its longest config-group sweep (each option names a
file; a key's values change no key), so that no job fails for a typo after the sweep directory
is made. The check costs one composition (a few tenths of a second) per run.

Seen with hydra-core 1.3.8 and 1.4.0rc3, which report and exit alike: `hydra.main` has no hook
for an application to report a composition error itself. With one, `hydra_main` could hand
`explain` the error Hydra meets instead of composing first (but for a multirun's jobs, which
Hydra composes only after it has made the sweep directory).
"""

import argparse
import difflib
import functools
import gc
import os
import re
import signal
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import hydra
from hydra import compose, initialize_config_dir

# Hydra's own command-line parser, so that argv is read as `hydra.main` reads it (1.3.8, 1.4.0rc3).
from hydra._internal.utils import get_args_parser
from hydra.core.config_loader import ConfigLoader
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, Override, ValueType
from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException
from hydra.types import RunMode, TaskFunction
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from volt.config import CONF_DIR, SWEPT_KEYS
from volt.config.execution_whitelist import main_whitelist
from volt.config.keys import check_added_keys
from volt.console import stdout_to_devnull
from volt.errors import ConfigError

# hydra-core 1.3 needs version_base="1.3" (without it, it warns and behaves as 1.1); 1.4 (seen:
# 1.4.0rc3) has no behaviour that depends on it and warns each time it is passed. Drop this, and
# pass nothing, once volt requires hydra-core >= 1.4.
_HYDRA_MINOR = tuple(int(part) for part in hydra.__version__.split(".")[:2])
VERSION_BASE: dict[str, str] = {} if _HYDRA_MINOR >= (1, 4) else {"version_base": "1.3"}


def hydra_main(
    config_name: str, on_config_error: Callable[[ConfigError], NoReturn]
) -> Callable[[TaskFunction], Callable[..., Any]]:
    """`@hydra.main` on conf/, except that a command line whose config does not compose ends in
    `on_config_error` instead of Hydra's report."""

    def decorate(task: TaskFunction) -> Callable[..., Any]:
        on_conf = hydra.main(
            config_path=str(CONF_DIR), config_name=config_name, **VERSION_BASE, **main_whitelist()
        )
        run_hydra = on_conf(task)

        @functools.wraps(task)
        def main(cfg_passthrough: DictConfig | None = None) -> Any:
            # What the imports made (torch, Lightning, Hydra: about 480k objects) lives as long
            # as the process: frozen, Python's full garbage collections stop walking it. In the
            # default run on a 2-core CPU (Python 3.11) that saved 0.3 s in the config checks,
            # where one such collection fell, and about 1.3 s in the interpreter's exit.
            gc.freeze()
            if cfg_passthrough is None:  # a config handed in was composed already
                try:
                    swept = check_command_line(config_name, sys.argv[1:])
                except ConfigError as error:
                    on_config_error(error)
                # Sweep jobs' directories are named by these (volt.config.job_dirname); the
                # environment reaches jobs that a launcher runs in processes of their own.
                os.environ[SWEPT_KEYS] = ",".join(swept)
            try:
                result = run_hydra(cfg_passthrough)
                sys.stdout.flush()  # what is still buffered meets a closed pipe here, not at exit
            except BrokenPipeError:
                _end_at_closed_pipe()
            gc.freeze()  # what is left lives until exit (training unfroze its own objects)
            return result

        return main

    return decorate


def _end_at_closed_pipe() -> NoReturn:
    """The reader of stdout went away (`python train.py --help | head -3`): end quietly, with the
    status a shell reports for a program that SIGPIPE ended (`git log | head`), not with the
    BrokenPipeError's traceback. Python ignores SIGPIPE, so the write raised instead. (A run
    whose console meets it stops the same way: volt.console.stop_when_the_console_is_closed.)"""
    stdout_to_devnull()
    sys.exit(128 + signal.SIGPIPE)


def check_command_line(config_name: str, argv: list[str]) -> list[str]:
    """Compose the config that `argv` asks Hydra for (each job's, for a multirun); a ConfigError
    names the override at fault. What else Hydra does (`_left_to_hydra`) is Hydra's to report.
    Returns the keys a sweep on the command line varies (`model.optimizer.lr=1e-3,1e-2`)."""
    args = get_args_parser().parse_args(argv)
    if _left_to_hydra(args):
        return []
    name = args.config_name or config_name
    with initialize_config_dir(config_dir=str(CONF_DIR), **VERSION_BASE):
        loader = GlobalHydra.instance().config_loader()
        overrides = [_parsed(line, loader) for line in args.overrides]
        configs = [_composed(name, overrides, lines) for lines in _jobs(overrides, loader)]
        # Here too, not only in volt's Hydra callback: a key added to nothing (`+foo=1`) is
        # refused before torch is imported. A key of a `_target_` section imports its target.
        for composed in configs:
            check_added_keys(composed)
    sweeps = [o for o in overrides if o.is_sweep_override()]
    # Hydra runs a sweep without -m where the config asks for it (hparams_search sets hydra.mode).
    if sweeps and not args.multirun and configs and configs[0].hydra.mode != RunMode.MULTIRUN:
        raise ConfigError(_needs_multirun(sweeps[0]))
    return [o.key_or_group for o in sweeps]


def _left_to_hydra(args: argparse.Namespace) -> bool:
    """Hydra's help, info and shell completion, a rerun of a pickled config, and a config found
    elsewhere than conf/ (--config-dir, --config-path)."""
    hydra_commands = args.help or args.hydra_help or args.info or args.shell_completion
    return bool(hydra_commands or args.experimental_rerun or args.config_dir or args.config_path)


def explain(
    error: ConfigCompositionException, overrides: list[Override], lines: list[str], config_name: str
) -> str:
    """volt's line for Hydra's `error` in composing `lines` (`overrides` as typed, each sweep at
    one of its values): the override at fault as typed, what is wrong with it, what to type."""
    if isinstance(error, MissingConfigException) and error.options is not None:
        return _missing_option(error, overrides, lines)
    at = _at_fault(error, overrides)
    if at is None:
        return _hydra_says(error)
    typed = overrides[at]
    hydra_says = f"{typed.input_line}: {_reason(error)}"
    try:
        reference = compose(config_name, lines[:at] + lines[at + 1 :], return_hydra_config=True)
    except ConfigCompositionException:  # another override is wrong too: Hydra's words for this one
        return hydra_says
    return _against(reference, typed, config_name) or hydra_says


def _parsed(line: str, loader: ConfigLoader) -> Override:
    try:
        override = OverridesParser.create().parse_override(line)
    except HydraException as error:
        raise ConfigError(
            f"{line}: Hydra cannot read this override ({error}); write key=value, a list as"
            " key=[a,b], and quote a value that holds brackets, commas or spaces, the shell's"
            " quotes outside Hydra's: 'key=\"...\"'"
        ) from error
    override.config_loader = loader  # what a glob(...) sweep matches against
    return override


def _jobs(overrides: list[Override], loader: ConfigLoader) -> list[list[str]]:
    """The override lines of each composition to check, aligned with `overrides`: job j takes
    the j-th value of each config-group sweep (its last, past its end) and the first of each
    sweep over a key's values."""
    values = [_values(o, loader) for o in overrides]
    if not all(values):
        return []  # a glob that matches no option: Hydra runs no job
    count = max((len(v) for v in values), default=1)
    return [[v[min(j, len(v) - 1)] for v in values] for j in range(count)]


def _values(override: Override, loader: ConfigLoader) -> list[str]:
    if not override.is_sweep_override():
        return [str(override.input_line)]
    line = override.input_line
    if override.is_hydra_override():
        raise ConfigError(f"{line}: Hydra's own settings cannot be swept; give one value")
    key = override.get_key_element()
    sweep = override.value()
    if isinstance(sweep, IntervalSweep):  # sampled by a sweeper; any value in it has the key
        return [f"{key}={sweep.start}"]
    values = [f"{key}={value}" for value in override.sweep_string_iterator()]
    parent, _, name = override.key_or_group.rpartition("/")
    return values if name in loader.list_groups(parent) else values[:1]


def _composed(config_name: str, overrides: list[Override], lines: list[str]) -> DictConfig:
    try:
        return compose(config_name, lines, return_hydra_config=True)
    except ConfigCompositionException as error:
        raise ConfigError(explain(error, overrides, lines, config_name)) from error


def _missing_option(
    error: MissingConfigException, overrides: list[Override], lines: list[str]
) -> str:
    group, _, option = str(error.missing_cfg_file).rpartition("/")
    options = list(error.options or ())
    close = difflib.get_close_matches(option, options, n=3)
    listed = ", ".join(options)
    fix = (
        f"did you mean {' or '.join(f'{group}={c}' for c in close)}? (options: {listed})"
        if close
        else f"options: {listed}"
    )
    for typed, line in zip(overrides, lines, strict=True):
        if typed.key_or_group == group and line.partition("=")[2] == option:
            return f"{typed.input_line}: config group {group} has no option {option!r}; {fix}"
    # Chosen in a config's defaults list, which Hydra's message names.
    return f"{_hydra_says(error)}; {fix}"


def _at_fault(error: ConfigCompositionException, overrides: list[Override]) -> int | None:
    """The first override whose key Hydra's message names (a whole name, not part of a longer)."""
    text = str(error)
    for i, override in enumerate(overrides):
        key = re.escape(override.key_or_group)
        if re.search(rf"(?<![\w./-]){key}(?![\w/-]|\.\w)", text):
            return i
    return None


def _against(reference: DictConfig, typed: Override, config_name: str) -> str | None:
    """What is wrong with `typed` in the config composed without it; None where volt cannot
    tell (Hydra's message stands)."""
    line, key = str(typed.input_line), typed.key_or_group
    choices = reference.hydra.runtime.choices
    found = _first_missing(reference, key)
    if typed.is_add() and key in choices:
        chosen = "null" if choices[key] is None else choices[key]
        return (
            f"{line}: the defaults list chooses {key} already ({key}: {chosen}); write {line[1:]}"
        )
    if typed.is_add() and found is None:
        return f"{line}: {key} is set already; write {line[1:]} to change it"
    if typed.is_add() or typed.is_force_add() or key in choices or found is None:
        return None
    return _unknown_key(typed, *found, choices, config_name)


def _unknown_key(
    typed: Override, path: str, name: str, known: list[str], choices: Any, config_name: str
) -> str:
    """`typed` names `name` under `path`, which has only `known`: the close ones as fixes."""
    line = str(typed.input_line)
    if not path:  # a misspelt group is a top-level name too: `modle=mlp`
        known = sorted({*known, *(g for g in choices if "/" not in g)})
    prefix = f"{path}." if path else ""
    where = (
        f"{path} has no key {name!r}"
        if path
        else f"the {config_name} config has no key or config group {name!r}"
    )
    close = difflib.get_close_matches(name, [k for k in known if k != name], n=3)
    fixes = [line.replace(prefix + name, prefix + c, 1) for c in close]
    hint = f"did you mean {' or '.join(fixes)}?" if fixes else f"known: {', '.join(known)}"
    # A key that conf/ does not set may still be one the section's class takes (volt checks that
    # for `+key`); a new top-level key is read by nothing.
    if path and not typed.is_delete():
        hint += f" (to add a key that conf/ does not set: +{line})"
    return f"{line}: {where}; {hint}"


def _first_missing(reference: DictConfig, key: str) -> tuple[str, str, list[str]] | None:
    """(the part of `key` that exists, the first name that does not, the names beside it); None
    when all of `key` exists or it leads through a value that is not a section."""
    node: Any = OmegaConf.to_container(reference, resolve=False)
    parts = key.split(".")
    for i, part in enumerate(parts):
        if not isinstance(node, dict):
            return None
        if part not in node:
            return ".".join(parts[:i]), part, sorted(str(k) for k in node)
        node = node[part]
    return None


def _hydra_says(error: ConfigCompositionException) -> str:
    """Hydra's message up to its first blank line (before the search path it lists), on one line."""
    return " ".join(str(error).split("\n\n")[0].split())


def _reason(error: ConfigCompositionException) -> str:
    """What Hydra says is wrong with an override: OmegaConf's error where one is under Hydra's
    (`Error merging override ...` says only which override, and volt's line names it first)."""
    cause = error.__cause__
    if isinstance(cause, OmegaConfBaseException):
        return str(cause).splitlines()[0]
    return _hydra_says(error)


def _needs_multirun(sweep: Override) -> str:
    line, key = str(sweep.input_line), sweep.get_key_element()
    text = f"{line}: several values make a sweep, which runs only with -m (--multirun)"
    if sweep.value_type != ValueType.SIMPLE_CHOICE_SWEEP:  # choice(...), range(...), glob(...)
        return text
    value = line.partition("=")[2]
    return (
        f"{text}; as one value, a list is {key}=[{value}], a string is quoted: '{key}=\"{value}\"'"
    )
