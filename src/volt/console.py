"""What volt prints: the config tree at start (verbose=true; always in config_tree.txt), one line
naming the hardware set-up, the result; and `Terminal`, the rich Console every table and print
of volt goes through."""

import contextlib
import copy
import io
import logging
import os
import re
import signal
import sys
import traceback
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import yaml
from hydra.errors import InstantiationException

# Lightning's own rank_zero_only (it sets `.rank` on import), from the package that holds it
# without importing torch: a composition error reaches exit_on_config_error before either.
from lightning_utilities.core.rank_zero import rank_zero_only
from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from volt.errors import ConfigError, TrainingInterrupted, controls_escaped, on_one_line
from volt.folder_files import write_replacing

if TYPE_CHECKING:
    import lightning.pytorch as pl

log = logging.getLogger("volt")
FIRST_GROUPS = ("data", "model", "trainer", "compile", "callbacks", "logger")


class Terminal(Console):
    """The rich Console volt prints through, every one of them (tables, trees, lines): text from a
    file (a handed-over run's metric names, a sweep job's overrides) may hold a terminal escape
    sequence that erases the line above and prints a green "passed". Here every control character
    but line breaks and tabs is shown escaped (`\\x1b`), whichever renderable it comes through, so
    no caller escapes its own: texts and tables before they are laid out, other renderables'
    segments as they are made. A line break stays in a text (volt's own have them); in a table's
    header or cell, where a file's names and values go, it is escaped too (`\\n`)."""

    def render(
        self, renderable: RenderableType, options: ConsoleOptions | None = None
    ) -> Iterable[Segment]:
        for segment in super().render(_escaped(renderable), options):
            # Segments of other renderables (Syntax's, say), escaped as they are made; control
            # segments are rich's own (cursor moves of a live display).
            if segment.control or _printable(segment.text):
                yield segment
            else:
                yield Segment(controls_escaped(segment.text), segment.style)


def _escaped(renderable: RenderableType, kept: str = "\n\t") -> RenderableType:
    """A text (its control characters but those in `kept`), or a table's headers and cells (all
    of them), escaped before they are laid out: a column is as wide as the escaped text, which is
    shown whole. The caller's objects are left as they are."""
    if isinstance(renderable, str):
        return controls_escaped(renderable, kept)
    if isinstance(renderable, Text) and not _printable(renderable.plain, kept):
        text = renderable.copy()
        text.plain = controls_escaped(text.plain, kept)
        return text
    if isinstance(renderable, Table):
        table = copy.copy(renderable)
        # `_cells` is the column's dataclass field, which rich's own Column.copy replaces so.
        table.columns = [
            replace(c, header=_escaped(c.header, ""), _cells=[_escaped(x, "") for x in c.cells])
            for c in renderable.columns
        ]
        return table
    return renderable


def _printable(text: str, kept: str = "\n\t") -> bool:
    return controls_escaped(text, kept) == text


def route_lightning_logs() -> None:
    """Send Lightning's messages through the run's handlers (console and log file).

    Lightning attaches its own stream handler at import when the root logger has none yet, which
    is always the case before Hydra configures logging, so its lines would miss the log file.
    Its tips start with an emoji, which a console in a non-UTF-8 locale cannot print.
    """
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    # A logger's filters see only the records logged through it: the ones that say these lines.
    for name in (
        "lightning.pytorch.utilities.rank_zero",
        "lightning.fabric.utilities.seed",
        "lightning.fabric.utilities.distributed",
        "lightning.pytorch.trainer.connectors.checkpoint_connector",
    ):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _LightningChatter) for f in logger.filters):
            logger.addFilter(_LightningChatter())
    escape_what_the_console_cannot_print()
    stop_when_the_console_is_closed()


class _LightningChatter(logging.Filter):
    """Lightning 2.6.6's lines that concern no volt user. Its tip to install litlogger (and
    litmodels), logged on every run that does not use its cloud products: dropped. Which
    accelerators it found (volt's own line names the one used), the seed (in the config), each
    checkpoint it restores (volt says what it resumes and tests; the learning-rate finder's own
    with a note on `weights_only`), and each rank joining and the backend (8 lines under DDP;
    volt's line names the processes): debug lines, which the log
    file keeps and the console, at INFO (conf/hydra/job_logging), leaves out. Matched by how the
    lines begin, as Lightning 2.6.6 words them: a line it rewords shows on the console again, and
    tests/test_console.py's default run, which allows no Lightning line at INFO but the fit's
    end, fails. Delete a prefix when Lightning stops saying the line."""

    FOR_THE_LOG_FILE = (
        "GPU available:",
        "TPU available:",
        "Seed set to",
        "Restoring states from the checkpoint path at",
        "Restored all states from the checkpoint at",
        "Loaded model weights from the checkpoint at",
        "`weights_only` was not set",
        "Initializing distributed:",
        "distributed_backend=",  # under a line of dashes
    )

    def filter(self, record: logging.LogRecord) -> bool:
        # "[rank: 1] " starts the seed's line on ranks past 0
        text = re.sub(r"^\[rank: \d+\] ", "", str(record.msg)).lstrip("-\n")
        if text.startswith("💡 Tip:"):
            return False
        if text.startswith(self.FOR_THE_LOG_FILE):
            _for_the_log_file(record)
        return True


@contextlib.contextmanager
def lightning_info_for_the_log_file() -> Iterator[None]:
    """What Lightning says at INFO while the block runs goes to the log file only. For its
    finders (volt.tuning): each short fit of theirs ends in a line ("`Trainer.fit` stopped:
    `max_steps=100` reached.", one per batch size tried), besides their trials' own; what they
    found, volt says in a line of its own."""
    loggers = [
        logging.getLogger(name)
        for name in (
            "lightning.pytorch.utilities.rank_zero",
            "lightning.pytorch.tuner.batch_size_scaling",
            "lightning.pytorch.tuner.lr_finder",
        )
    ]
    for logger in loggers:
        logger.addFilter(_for_the_log_file)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(_for_the_log_file)


def _for_the_log_file(record: logging.LogRecord) -> bool:
    """A logger's filter that keeps every record, an INFO one at DEBUG: the log file keeps it, the
    console, at INFO (conf/hydra/job_logging), leaves it out."""
    if record.levelno == logging.INFO:
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
    return True


def escape_what_the_console_cannot_print() -> None:
    """Characters that the locale's encoding lacks print as escapes (`\\U0001f4a1`), as on
    Python's own stderr, where they raised UnicodeEncodeError and ended the run: Lightning's
    tips start with an emoji, rich cuts a long table cell with an ellipsis. Seen in an ASCII
    locale (LANG=C with Python's UTF-8 mode off); Latin-1 ones lack both characters too."""
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="backslashreplace")


def stop_when_the_console_is_closed() -> None:
    """`python train.py | head`: once the reader of stdout is gone, rich (13 to 15.0 seen) sends
    stdout to /dev/null and raises SystemExit(1) from the print that met the closed pipe
    (`Console.on_broken_pipe`): the run ended mid-step, exit 1, no word, no record. That print
    now stops the run as SIGPIPE would: recorded as interrupted, said in its log file, exit 141,
    as a shell reports `git log | head`. Rich documents the method as the one to replace; it is
    replaced on the class, for every console of the process: Lightning's progress bar remakes
    rich's shared one (`rich.reconfigure` swaps its `__dict__`, dropping an instance's own)."""
    Console.on_broken_pipe = _stop_at_closed_console  # type: ignore[method-assign,assignment]


def _stop_at_closed_console(console: Console) -> NoReturn:
    console.quiet = True  # as rich's own: later prints go nowhere
    stdout_to_devnull()
    log.warning("Stopped: the console's reader went away (stdout closed, as by `| head`)")
    raise TrainingInterrupted(signal.SIGPIPE, None, "printing to a closed console")


def stdout_to_devnull() -> None:
    """stdout's reader went away: what is still written to it goes nowhere, so that neither a later
    print nor the interpreter's last flush of its buffer at exit meets the closed pipe again."""
    with contextlib.suppress(OSError, ValueError):  # stdout without a descriptor: nothing to do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


ONE_BY_ONE_STRIDES = (
    r"Grad strides do not match bucket view strides\.[^\n]*\n"
    r"grad\.sizes\(\) = \[(\d+), (\d+), 1, 1\], strides\(\) = \[\2, 1, \2, \2\]\n"
    r"bucket_view\.sizes\(\) = \[\1, \2, 1, 1\], strides\(\) = \[\2, 1, 1, 1\](?: |\Z)"
)


def silence_known_warnings() -> None:
    """Lightning 2.6 calls a torch pytree API that torch 2.10+ deprecates; the warning is about
    Lightning's code, says nothing to a volt user, and shows once per run. Only that one goes."""
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    # A module with no validation_step: volt.callbacks.watched_metric says so in its own line,
    # with what that turns off.
    warnings.filterwarnings("ignore", message="You passed in a `val_dataloader` but have no `valid")
    # Under DDP Lightning 2.6.6 advises sync_dist=True for a value logged per epoch without it;
    # volt's own such values need none: the best-so-far metrics come from torchmetrics'
    # compute(), synced across ranks already, and the throughput is rank 0's by design.
    for name in ("val/acc_best", "val/bpb_best", "perf/train_samples_per_s"):
        warnings.filterwarnings("ignore", message=rf"It is recommended to use `self.log\('{name}'")
    # Under DDP with torch.compile, inductor gives a 1x1 convolution's weight gradient (O, I, 1, 1)
    # the strides (I, 1, I, I) where the parameter has (I, 1, 1, 1): the same bytes in the same
    # order (strides of size-1 dimensions are never used), which torch's own gradient layout
    # contract accepts but DDP's reducer compares exactly, and it warns once per rank that this
    # "may impair performance" (seen with torch 2.14 on the CPU; the compiled ResNet's DDP runs
    # on H200s, torch 2.11, warned of strides too, whether of this case is not recorded;
    # pytorch/pytorch#47163). It does not: without gradient_as_bucket_view the reducer copies
    # every gradient into its bucket anyway. Only that exact case is silenced (the
    # backreferences). torch warns once per process, at the first mismatch: a later, real one
    # (channels_last 3x3 weights) goes unreported behind a silenced 1x1, as it did behind the
    # shown one before. Remove if torch's reducer ignores the strides of size-1 dimensions.
    warnings.filterwarnings("ignore", message=ONE_BY_ONE_STRIDES)


def config_tree(config: Mapping[str, Any]) -> Tree:
    """The resolved config as a tree of its groups (values read from the environment as their
    `${oc.env:...}`, as `prepare_run` hands them over)."""
    tree = Tree("config", style="dim")
    keys = [k for k in FIRST_GROUPS if k in config] + [k for k in config if k not in FIRST_GROUPS]
    for key in keys:
        value = config[key]
        text = yaml.safe_dump(value, sort_keys=False) if isinstance(value, Mapping) else str(value)
        tree.add(f"[bold]{key}[/bold]").add(Syntax(text, "yaml", theme="ansi_dark"))
    return tree


@rank_zero_only
def save_config_tree(tree: Tree, path: Path) -> None:
    text = io.StringIO()
    Terminal(file=text, width=120).print(tree)
    write_replacing(path, path.parent, text.getvalue())  # a link at its name is not followed


@rank_zero_only
def print_config_tree(tree: Tree) -> None:
    Terminal().print(tree)


def describe_setup(trainer: "pl.Trainer", compile_mode: str | None) -> str:
    import torch  # imported already by then (volt.console is imported before torch)

    device = trainer.strategy.root_device
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return (
        f"accelerator={type(trainer.accelerator).__name__.removesuffix('Accelerator').lower()} "
        f"({where}) devices={trainer.num_devices} nodes={trainer.num_nodes} "
        f"precision={trainer.precision} strategy={type(trainer.strategy).__name__} "
        f"compile={compile_mode or 'off'}"
    )


@rank_zero_only
def print_result(metrics: Mapping[str, float], run_dir: Path) -> None:
    """The final metrics. They may come from a finished run's metrics.json, which a handed-over
    run directory brings: names and values are shown as text, never read as rich markup (and
    their control characters escaped by the Terminal). None, where nothing was validated or
    tested (no training batches, test=false; mode=predict): one line says so, not an empty table."""
    console = Terminal()
    if metrics:
        console.print(_result_table(metrics))
    else:
        console.print("Result: no metric was logged")
    console.print(f"Run directory: [bold]{run_dir}[/bold]")


def _result_table(metrics: Mapping[str, float]) -> Table:
    table = Table(title="Result")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in sorted(metrics.items(), key=lambda item: str(item[0])):
        number = isinstance(value, int | float) and not isinstance(value, bool)
        shown = f"{value:.4f}" if number else repr(value)
        table.add_row(Text(str(name)), Text(shown))
    return table


def exit_on_config_error(error: Exception) -> NoReturn:
    """One line, exit status 2; VOLT_TRACEBACK=1 prints the traceback before it. Never re-raised:
    inside a Hydra callback that would become a warning, and the run would go on."""
    if os.environ.get("VOLT_TRACEBACK"):
        _print_traceback(error)
    kind = "config error" if isinstance(error, ConfigError) else "error"
    print(f"volt: {kind}: {one_line(error)}", file=sys.stderr)
    sys.exit(2)


def exit_on_unexpected_error(error: Exception) -> NoReturn:
    """An error volt did not foresee (a defect, volt's or a library's): its traceback, then its
    one line, exit status 1. In place of Hydra 1.3's report, which ends in a hint to set
    HYDRA_FULL_ERROR=1 (VOLT_TRACEBACK=1 is volt's switch, for the errors that are one line)."""
    _print_traceback(error)
    print(f"volt: error: {one_line(error)}", file=sys.stderr)
    sys.exit(1)


def _print_traceback(error: Exception) -> None:
    # Its messages may quote a handed-over file's text: an escape sequence there stays inert.
    print(controls_escaped("".join(traceback.format_exception(error))), end="", file=sys.stderr)


def one_line(error: Exception) -> str:
    """The message of `error` on one line; for a constructor that refused its arguments, the key
    of its section, the callable, and its own error, without Hydra's wrapping."""
    if isinstance(error, InstantiationException) and error.__cause__ is not None:
        cause, text = error.__cause__, str(error)
        key = re.search(r"full_key: (\S+)", text)
        target = re.search(r"'([^']+)'", text)
        where = f"{key.group(1)}: " if key else ""
        what = f"{target.group(1)} refused its arguments: " if target else ""
        return on_one_line(f"{where}{what}{type(cause).__name__}: {cause}")
    # volt's own errors are written for the user; another's needs its type to make sense.
    own = type(error).__module__.startswith(__name__.split(".")[0] + ".")
    return on_one_line(str(error) if own else f"{type(error).__name__}: {error}")
