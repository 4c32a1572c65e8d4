"""What the benchmarks beside this file share: each side in a fresh process of its own, bounded and
logged; warm-up and timed windows; medians and spreads; results saved after every side; markdown
tables, and a docs page's table rewritten between its markers. (Imported as `harness` by the
scripts beside it: running one puts this folder first on sys.path.) It imports no torch: a parent
that only starts processes keeps its memory and start-up out of what they measure."""

import contextlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

RESULT = "benchmark result: "  # the line a side's process hands its numbers over on
PROJECT = Path(__file__).resolve().parents[1]  # the repository root, where volt's sides run from


# ------------------------------------------------------------------- a side in a fresh process


@dataclass(frozen=True)
class Finished:
    """How a side's process ended: its exit status (None: stopped at its timeout), wall time, the
    CPU time (user + system) of it and its children, and the log of its stdout and stderr."""

    status: int | None
    wall_s: float
    cpu_s: float
    log: Path
    timeout_s: float | None

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def failure(self) -> str | None:
        """Why the side failed, in a line or a log's tail; None if it did not."""
        if self.status is None:
            return f"timed out after {self.timeout_s:.0f} s"
        if self.status == 0:
            return None
        text = self.text()
        if "CUDA out of memory" in text:  # torch's words, in volt's one-line error too
            return "out of memory"
        tail = "\n    ".join(text.splitlines()[-15:])
        return f"exit status {self.status}; the end of its log:\n    {tail}"

    def result(self) -> dict[str, Any] | None:
        """The last result line the side printed (`result_line`); None if it printed none."""
        lines = [line for line in self.text().splitlines() if line.startswith(RESULT)]
        return json.loads(lines[-1].removeprefix(RESULT)) if lines else None

    def check(self, command: Sequence[str]) -> "Finished":
        """Itself if the side succeeded; else raises RuntimeError with the reason."""
        if reason := self.failure():
            raise RuntimeError(f"{' '.join(command)}: {reason} (log: {self.log})")
        return self


def run_fresh(
    command: Sequence[str],
    log: Path,
    timeout_s: float | None = None,
    *,
    cwd: Path,
    env: dict[str, str] | None = None,
    grace_s: float = 0.0,
    watch: Callable[[], None] | None = None,
) -> Finished:
    """`command` from `cwd`, its stdout and stderr into `log`, until it exits or `timeout_s` ends.
    It runs in a session of its own, so whatever it started (DDP ranks, data workers, a sweep's
    jobs) ends with it: at the timeout, or if this process is stopped, the group gets SIGTERM and
    `grace_s` to stop (0: none), then SIGKILL, as it does once it exits. `watch` is called every
    half second while it runs (to follow its log)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    before = children_cpu_s()
    started = time.perf_counter()
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    status: int | None = None
    try:
        while status is None and (timeout_s is None or time.perf_counter() - started < timeout_s):
            with contextlib.suppress(subprocess.TimeoutExpired):
                status = process.wait(0.5 if watch else timeout_s)
            if watch:
                watch()
    finally:
        stop(process, grace_s)
    return Finished(
        status, time.perf_counter() - started, children_cpu_s() - before, log, timeout_s
    )


def stop(process: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM to the process group and `grace_s` to end, then SIGKILL to what is left of it."""
    if grace_s and process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def result_line(result: dict[str, Any]) -> str:
    """The line a side prints its result on, for `Finished.result` to read back."""
    return RESULT + json.dumps(result)


class LogTail:
    """A `run_fresh` watch: each call hands `show` every whole line the log gained since the last
    (a line still being written waits for the next call)."""

    def __init__(self, log: Path, show: Callable[[str], None]) -> None:
        self.log, self.show, self.offset = log, show, 0

    def __call__(self) -> None:
        with self.log.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        whole = data[: data.rfind(b"\n") + 1]
        self.offset += len(whole)
        for line in whole.decode(errors="replace").splitlines():
            self.show(line)


# --------------------------------------------------------------------------- timing and stats


class Windows:
    """Marks the end of `warmup` untimed steps and of `repeats` timed windows of `steps` steps,
    calling `sync` (the device's synchronise) only there, so the steps between run unhindered.
    Call `step_done(0)` before the first step and `step_done(n)` after the n-th."""

    def __init__(self, warmup: int, steps: int, repeats: int, sync: Callable[[], None]) -> None:
        self.steps, self.sync = steps, sync
        self.first, self.last = warmup, warmup + steps * repeats
        self.total = self.last
        self.marks: list[float] = []

    def step_done(self, step: int) -> bool:
        """True if `step` ended the warm-up or a window (the clock was read)."""
        if step < self.first or (step - self.first) % self.steps or step > self.last:
            return False
        self.sync()
        self.marks.append(time.perf_counter())
        return True

    def seconds(self) -> list[float]:
        return [b - a for a, b in zip(self.marks, self.marks[1:], strict=False)]

    def ms_per_step(self) -> list[float]:
        return [1e3 * s / self.steps for s in self.seconds()]


def summary(values: Sequence[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)} | {
        "samples": list(values)
    }


def spread(values: Sequence[float]) -> float:
    """(max - min) / median: how far apart the windows were."""
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle else 0.0


# ------------------------------------------- in a side's process (torch and volt imported on call)


def compose(overrides: Sequence[str]) -> Any:
    """volt's config (`conf/train.yaml`) with `overrides`, as `python train.py` composes it."""
    import hydra

    from volt.config import CONF_DIR

    with hydra.initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return hydra.compose("train", overrides=list(overrides))


def synchronize(device: Any) -> None:
    """Wait for the work queued on `device` (a torch.device): only a GPU runs behind the CPU."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"


def trainer_stand_in(device: Any, world: int = 1, rank: int = 0) -> Any:
    """What volt's data modules ask of a trainer, for a plain loop that has none (set its
    `current_epoch` each epoch: volt's batches reshuffle by it)."""
    strategy = SimpleNamespace(root_device=device)
    return SimpleNamespace(
        world_size=world, global_rank=rank, strategy=strategy, overfit_batches=0, current_epoch=0
    )


def plain_step(
    net: Any, optimizer: Any, device: Any, precision: str, smoothing: float, clip: float | None
) -> Callable[[Any, Any], None]:
    """A hand-written loop's training step on a batch (x, y), as Lightning runs one: autocast for
    `precision`, cross-entropy, a gradient scaler under float16, clipping at `clip` (None: none)."""
    import torch
    from torch.nn import functional as F

    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)  # else a no-op

    def step(x: Any, y: Any) -> None:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            logits = net(x)  # (B, classes) or (B, T, vocabulary)
            loss = F.cross_entropy(logits.flatten(0, -2), y.flatten(), label_smoothing=smoothing)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if clip:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        scaler.step(optimizer)
        scaler.update()

    return step


# ------------------------------------------------------------------------------------- results


def save_json(path: Path, data: Any) -> None:
    """`data` to `path` through a partial file: a benchmark killed mid-write leaves the last whole
    one. Benchmarks call it after every side, so a cut-off run keeps what it measured."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=2, default=str) + "\n")
    partial.replace(path)


class Console:
    """Lines for the console, each with the seconds since the benchmark started."""

    def __init__(self) -> None:
        self.started = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def say(self, text: str) -> None:
        print(f"[{self.elapsed():4.0f} s] {text}", flush=True)


def versions() -> dict[str, str]:
    """What was measured with, and when."""
    import lightning.pytorch as pl  # here, not at the top: see the module's docstring
    import torch

    return {"torch": torch.__version__, "lightning": pl.__version__} | {
        "date": time.strftime("%Y-%m-%d")
    }


# ------------------------------------------------------------------------------ markdown tables


def markdown_table(columns: Sequence[str], align: str, rows: Iterable[Sequence[str]]) -> list[str]:
    """A markdown table's lines; `align` holds an l or an r per column."""
    rule = {"l": "---", "r": "---:"}
    lines = [row_line(columns), "| " + " | ".join(rule[a] for a in align) + " |"]
    return lines + [row_line(row) for row in rows]


def row_line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


@dataclass(frozen=True)
class Page:
    """A docs page that holds a generated table between `<!-- begin -->` and `<!-- end -->` lines,
    so that a rerun replaces the table and leaves the prose around it alone."""

    path: Path
    begin: str
    end: str

    def with_table(self, text: str, table: str) -> str:
        """`text` with `table` in place of whatever stood between the markers."""
        begin, end = self.begin, self.end
        if begin not in text or end not in text or text.index(begin) > text.index(end):
            raise ValueError(f"no {begin} ... {end} lines to write the table between: add them")
        before, rest = text.split(begin, 1)
        return f"{before}{begin}\n{table}\n{end}{rest.split(end, 1)[1]}"

    def check(self, program: str) -> None:
        """Exit before anything is measured if the page has no place for the table."""
        try:
            self.with_table(self.path.read_text(), "")
        except (OSError, ValueError) as error:
            sys.exit(f"{program}: {self.path}: {error}")

    def write(self, table: str) -> None:
        self.path.write_text(self.with_table(self.path.read_text(), table))
