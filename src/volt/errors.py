"""volt's own exceptions: a leaf, so whichever module detects a problem can raise it and
whichever module reports it can catch it, without importing each other. Also how text read from
a file (a handed-over run's names and keys) is put into a message."""

import logging
import signal
from collections.abc import Mapping
from pathlib import Path


class ConfigError(ValueError):
    """A config value volt cannot run with; str(error) is the whole message for the user."""


class TrainingInterrupted(SystemExit):
    """Training stopped on a signal; the process exits 128 + signum.

    `checkpoint` is what was saved on the way out (volt.callbacks.graceful_shutdown, mid-fit), or
    None where there was nothing to save at that moment (`where`: the run's start, the ranks'
    start-up, test; volt.runs.stop_signals).

    A `SystemExit` so that nothing between the raiser and the interpreter has to know about
    it, and the exit status follows the shell's convention for a job ended by that signal
    (143 for SIGTERM, 130 for SIGINT): schedulers and scripts see that it did not finish.
    """

    def __init__(self, signum: int, checkpoint: Path | None, where: str = "training") -> None:
        super().__init__(128 + signum)
        self.signum = signum
        self.checkpoint = checkpoint
        self.where = where

    def __str__(self) -> str:  # SystemExit's own is just the exit status
        saved = f"saved {self.checkpoint}" if self.checkpoint else "nothing saved"
        return f"stopped on {signal.Signals(self.signum).name} while {self.where}; {saved}"


class VerdictOfAllRanksError(RuntimeError):
    """Raised on every rank at the same step, from a verdict the ranks all-reduced.

    Each rank fails with it, so another rank's failure is no news beside it: volt's DDP
    launcher reports rank 0's error alone instead of blaming the rank that exited first.
    """


class RankFailedError(RuntimeError):
    """Another rank of the run exited with an error; str(error) says which and, where the rank
    said it, why (its traceback, if any, is in its log). `user_facing`: the rank's error was one
    written for the user (out of memory, a config value): the run ends with its one line."""

    def __init__(self, message: str, user_facing: bool = False) -> None:
        super().__init__(message)
        self.user_facing = user_facing


class TrainingOutOfMemoryError(RuntimeError):
    """CUDA ran out of memory during training; str(error) says what to change."""


def escaped(text: str) -> str:
    """`text` as it is, or, where it holds a control character (a newline that would forge a
    line of train.log, say), its escaped repr."""
    return text if text.isprintable() else ascii(text)


def controls_escaped(text: str, kept: str = "\n\t") -> str:
    """`text` with every control character but those in `kept` escaped (`\\x1b`): what a
    message volt writes itself, several lines long, keeps; a terminal escape sequence read from a
    file (one that erases the line above and prints a green "passed") does not. `kept=""` for
    text that must stay on its line (a table's cell)."""
    if all(c.isprintable() or c in kept for c in text):
        return text
    return "".join(c if c.isprintable() or c in kept else ascii(c)[1:-1] for c in text)


def on_one_line(text: str) -> str:
    """`text` as the one line an error ends with: line breaks as spaces, other control
    characters escaped (an error may quote a handed-over file's text, and a terminal escape
    there could erase the line)."""
    return controls_escaped(" ".join(text.split()))


class EscapedText(logging.Filter):
    """On every handler of volt's log (conf/hydra/job_logging): the values a message is formatted
    with, which may come from a handed-over file (a key, a name, a path), are escaped whole
    (`escaped`), and the message's own control characters but its line breaks. One place for
    all log calls, volt's and the libraries' it routes there (Lightning's)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_escaped_value(value) for value in record.args)
        elif isinstance(record.args, Mapping):
            record.args = {key: _escaped_value(value) for key, value in record.args.items()}
        if isinstance(record.msg, str):
            record.msg = controls_escaped(record.msg)
        return True


def _escaped_value(value: object) -> object:
    if isinstance(value, int | float):  # kept for %d and %.3f
        return value
    text = str(value)
    return value if text.isprintable() else escaped(text)
