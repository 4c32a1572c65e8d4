"""The table of a sweep: one row per job, its overrides, how it ended and its final metrics, best
first by the task's watched metric. Written as summary.csv and summary.md in the sweep directory
after every job and at the end of the sweep (with, for a search, the objective against each
searched parameter in search.png), and on demand, also while the sweep runs:

    python -m volt.sweeps.summary outputs/train/multiruns/<sweep>
"""

import csv
import io
import math
import os
import re
import sys
from pathlib import Path

from rich.table import Table
from rich.text import Text

from volt.console import Terminal, escape_what_the_console_cannot_print, exit_on_config_error
from volt.errors import ConfigError, escaped
from volt.folder_files import read_overrides, read_yaml, write_replacing
from volt.metric_names import followed
from volt.runs import read_record

CSV_FILE = "summary.csv"
MARKDOWN_FILE = "summary.md"
LOCK_FILE = ".lock"  # volt.runs.lock's: held by the process that runs the job


def job_status(job_dir: Path) -> str:
    """completed / failed / pruned from the job's metrics.json; without one, running while a
    process holds the job's lock, else interrupted (killed before it could say)."""
    record = read_record(job_dir, job_dir.parent)
    if record is not None:
        return str(record.get("status", "completed"))
    return "running" if _lock_held(job_dir / LOCK_FILE) else "interrupted"


def _lock_held(lock_file: Path) -> bool:
    """Whether a process on this machine holds an flock on `lock_file`, read from /proc/locks:
    trying the lock would take it for a moment, and a job starting then would be refused."""
    try:
        inode = os.lstat(lock_file).st_ino
        locks = Path("/proc/locks").read_text()
    except OSError:
        return False
    # `1: FLOCK  ADVISORY  WRITE 4242 08:01:1234567 0 EOF`: the sixth field is dev:dev:inode.
    return any(
        line.split()[1] == "FLOCK" and line.split()[5].rsplit(":", 1)[-1] == str(inode)
        for line in locks.splitlines()
        if len(line.split()) > 5 and "->" not in line
    )


def collect_jobs(sweep_dir: Path) -> list[dict[str, str]]:
    """One row per job directory (those holding .hydra/overrides.yaml), in job order."""
    rows = []
    for overrides_file in sweep_dir.glob("*/.hydra/overrides.yaml"):
        job_dir = overrides_file.parent.parent
        overrides = read_overrides(overrides_file, sweep_dir)
        row = {"job": job_dir.name.split("_", 1)[0], "status": job_status(job_dir)}
        row.update((k, v) for k, _, v in (o.partition("=") for o in overrides if "=" in o))
        record = read_record(job_dir, sweep_dir)
        if record is not None:
            row.update({str(k): _number(v) for k, v in record.get("metrics", {}).items()})
            if "error" in record:
                row["error"] = str(record["error"])
        row["dir"] = str(job_dir)
        rows.append(row)
    return sorted(rows, key=lambda r: int(r["job"]) if r["job"].isdigit() else 0)


def sweep_watch(sweep_dir: Path) -> tuple[str | None, str]:
    """The sweep's watched metric and its mode, from the multirun.yaml Hydra's sweepers write at
    its start. Read as plain YAML, nothing resolved: a sweep directory may come from someone else
    (`python -m volt.sweeps.summary DIR`), and an interpolation there would read your environment
    into the table. A value that is not a plain word counts as absent."""
    path = sweep_dir / "multirun.yaml"
    config = read_yaml(path, sweep_dir) if os.path.lexists(path) else None
    task = config.get("task") if isinstance(config, dict) else None
    task = task if isinstance(task, dict) else {}
    watch, mode = task.get("watch"), task.get("mode", "max")
    plain = isinstance(watch, str) and "${" not in watch
    return (watch if plain else None), (mode if mode in ("max", "min") else "max")


def objective(sweep_dir: Path, rows: list[dict[str, str]]) -> tuple[str | None, str]:
    """The column to rank jobs by, and max|min: the watched metric's best where jobs kept one
    (what a search optimises), else its last value."""
    watch, mode = sweep_watch(sweep_dir)
    if watch is None:
        return None, mode
    # What the jobs' best checkpoints followed: the name their module logs it by (`val_loss` for
    # `val/loss`), else its validation loss (volt.metric_names).
    watch, mode = followed({k for r in rows for k in r}, watch, mode) or (watch, mode)
    column = f"{watch}_best" if any(f"{watch}_best" in r for r in rows) else watch
    return column, mode


def rank_rows(rows: list[dict[str, str]], column: str | None, mode: str) -> list[dict[str, str]]:
    """Best first; jobs without a value (failed, running) after them, in job order."""
    if column is None:
        return rows

    def key(row: dict[str, str]) -> tuple[bool, float]:
        try:
            value = float(row[column])
        except (KeyError, ValueError):
            return True, 0.0
        if math.isnan(value):
            return True, 0.0
        return False, -value if mode == "max" else value

    return sorted(rows, key=key)  # stable: ties and the rest stay in job order


def write_sweep_summary(sweep_dir: Path) -> list[dict[str, str]]:
    """(Re)write summary.csv and summary.md from the job directories; rewritten after every job,
    so a sweep that is killed or ends with a failed job still has them."""
    rows = collect_jobs(sweep_dir)
    if not rows:
        return rows
    rows = rank_rows(rows, *objective(sweep_dir, rows))
    columns = _columns(rows)
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    # summary.md, for reading: an override every job shares is said once, under the table
    # (summary.csv keeps every column).
    shared = [c for c in columns if _is_override(c) and len(rows) > 1 and _same(rows, c)]
    shown = [c for c in columns if c not in shared]
    lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    lines += ["| " + " | ".join(_cell(_shown(row, c)) for c in shown) + " |" for row in rows]
    if shared:
        lines += ["", "Every job: " + ", ".join(_cell(f"{c}={rows[0].get(c, '')}") for c in shared)]
    # Staged beside and renamed over: a reader (this CLI while the sweep writes) sees the old
    # file or the new one, and a link in a handed-over sweep folder is replaced, not written.
    write_replacing(sweep_dir / CSV_FILE, sweep_dir, table.getvalue())
    write_replacing(sweep_dir / MARKDOWN_FILE, sweep_dir, "\n".join(lines) + "\n")
    return rows


def _is_override(column: str) -> bool:
    metric = column.startswith(("val/", "test/", "train/", "perf/"))
    return not metric and column not in ("job", "status", "dir", "error")


def _shown(row: dict[str, str], column: str) -> str:
    """A cell for reading: a float a search sampled (8 decimals or more, as no one types them) as
    its job's folder names it, 0.0006573 for 0.0006573214670265974; summary.csv keeps it whole."""
    value = row.get(column, "")
    if not _is_override(column) or not re.fullmatch(r"-?\d*\.\d{8,}(e-?\d+)?", value):
        return value
    return f"{float(value):.4g}"


def _same(rows: list[dict[str, str]], column: str) -> bool:
    return len({row.get(column, "") for row in rows}) == 1


def _number(value: object) -> str:
    """A metric as the table shows it; a value that is no number (a handed-over file) as text."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:.6g}"
    return escaped(str(value))


def _cell(value: str) -> str:
    return value.replace("|", "\\|").replace("\n", " ")


def _columns(rows: list[dict[str, str]]) -> list[str]:
    columns = list(dict.fromkeys(k for row in rows for k in row))
    # the run directory last, after the metrics
    return [c for c in columns if c != "dir"] + ["dir"]


def print_sweep_summary(sweep_dir: Path) -> None:
    """Write the summary files (and search.png for a search), then print the table: the
    overrides that differ between jobs, how each ended, validation and test metrics."""
    rows = write_sweep_summary(sweep_dir)
    if not rows:
        return
    column, mode = objective(sweep_dir, rows)
    from volt.sweeps.plots import plot_search  # matplotlib only here

    plot = plot_search(sweep_dir)
    varying = {k for k in _columns(rows) if len({r.get(k) for r in rows}) > 1 or len(rows) == 1}
    shown = [
        c
        for c in _columns(rows)
        if c not in ("dir", "error")
        and (c in ("job", "status") or c.startswith(("val/", "test/")) or c in varying)
        and not c.startswith("val/loss")
    ]
    ranked = f", best {mode} {column} first" if column else ""
    title = f"Sweep summary ({len(rows)} jobs{ranked}) -> {sweep_dir}"
    table = Table(title=title)
    # Names and values come from the jobs' files, which a handed-over sweep folder brings: shown
    # as text (never rich markup), control characters escaped by the Terminal.
    for name in shown:
        table.add_column(Text(name), style="bold" if name == column else None)
    for row in rows:
        table.add_row(*(Text(_shown(row, c)) for c in shown))
    escape_what_the_console_cannot_print()  # in a sweep's own process, which trains nothing
    console = Terminal()
    if not console.is_terminal:  # a log file or a pipe: as wide as the table, no cell cut short
        console = Terminal(
            width=max(
                console.width,
                console.measure(table, options=console.options.update_width(10_000)).maximum,
            )
        )
    console.print(table)
    files = [sweep_dir / CSV_FILE, sweep_dir / MARKDOWN_FILE, *([plot] if plot else [])]
    console.print("Written: " + ", ".join(str(f) for f in files))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_dir():
        print(
            f"usage: python -m volt.sweeps.summary <sweep directory> (got {args})", file=sys.stderr
        )
        return 2
    sweep_dir = Path(args[0])
    try:
        if not collect_jobs(sweep_dir):
            print(f"{sweep_dir}: no sweep jobs here (no */.hydra/overrides.yaml)", file=sys.stderr)
            return 2
        print_sweep_summary(sweep_dir)
    except ConfigError as error:  # a file of the folder volt will not read: one line, exit 2
        exit_on_config_error(error)
    return 0


if __name__ == "__main__":
    sys.exit(main())
