"""Step by step, what torch.profiler's Chrome traces say of where a training step's time went:
the host's time from one optimizer step's end to the next's, the GPU's time from the end of the
step before's GPU work to the end of this one's, how much of that it was busy (kernels, copies
and fills on any stream, overlaps counted once), of which collectives (NCCL kernels) and
collectives no other work overlapped, and how long it sat idle. A step whose GPU idles is bound
by its host (or waits on another rank); one whose GPU is busy throughout is bound by the GPU.

    python benchmarks/trace_steps.py run/tensorboard/profiler/*.pt.trace.json other.json.gz

Steps are cut at the ends of the `Optimizer.step#...` annotations, which a Lightning run and a
plain loop both record (Lightning's own `ProfilerStep` marks fall between forward and backward): N
optimizer steps that end inside the recording give N - 1 whole steps (with several optimizers,
manual optimisation or gradient accumulation, a row is an optimizer step, not a batch). The GPU's
work is given to the step whose host launched it (CUDA's correlation ids; runtime and driver
launches alike: compiled Triton kernels go through the driver), so queued work that runs during the
next step's host time still counts for its own step. The traces of `gpu_checks.sh gpt-trace`
(volt's runs and the plain loop) are read this way there.
"""

import argparse
import bisect
import gzip
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

LAUNCHES = {"cuda_runtime", "cuda_driver"}
GPU_KEYS = ("gpu_ms", "busy_ms", "nccl_ms", "nccl_alone_ms", "idle_ms")
GPU_WORK = {"kernel", "gpu_memcpy", "gpu_memset"}
Interval = tuple[float, float]


def load(path: Path) -> tuple[list[dict[str, Any]], int | None]:
    """A trace's events, and the rank that wrote it where it says (torch.distributed's)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as file:
        trace = json.load(file)
    return trace["traceEvents"], trace.get("distributedInfo", {}).get("rank")


def union(intervals: list[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def length(intervals: list[Interval]) -> float:
    return sum(end - start for start, end in intervals)


def minus(these: list[Interval], those: list[Interval]) -> float:
    """The time in `these` that `those` do not cover (both merged and sorted)."""
    return length(these) - sum(
        max(0.0, min(a_end, b_end) - max(a_start, b_start))
        for a_start, a_end in these
        for b_start, b_end in those
    )


def steps(events: list[dict[str, Any]]) -> list[dict[str, float]]:
    """One row a whole traced step, in milliseconds (the trace's times are microseconds)."""
    # An optimizer step still open when recording stopped ends at the window's end, cut short:
    # Lightning's profiler stops inside the last one (its closure runs the training step).
    stop = min((e["ts"] for e in events if e.get("name") == "Record Window End"), default=math.inf)
    ends = sorted(
        e["ts"] + e["dur"]
        for e in events
        if e.get("cat") == "user_annotation"
        and str(e.get("name")).startswith("Optimizer.step#")
        and e["ts"] + e["dur"] < stop
    )
    launched_in = {}  # correlation id -> the step (index into ends) whose host launched it
    for event in events:
        if event.get("cat") in LAUNCHES and "correlation" in event.get("args", {}):
            # Step n: launched after the end of optimizer step n - 1, up to the end of step n.
            launched_in[event["args"]["correlation"]] = bisect.bisect_right(ends, event["ts"])
    collectives: dict[int, list[Interval]] = defaultdict(list)
    others: dict[int, list[Interval]] = defaultdict(list)
    for event in events:
        step = launched_in.get(event.get("args", {}).get("correlation"))
        if event.get("cat") not in GPU_WORK or step is None:
            continue
        kind = collectives if "nccl" in event["name"].lower() else others
        kind[step].append((event["ts"], event["ts"] + event["dur"]))
    rows = []
    for n in range(1, len(ends)):
        host_ms = (ends[n] - ends[n - 1]) / 1e3
        before = union(collectives[n - 1] + others[n - 1])
        work = union(collectives[n] + others[n])
        if not before or not work:  # no GPU work to measure from or to (a CPU run's trace)
            rows.append({"host_ms": host_ms} | dict.fromkeys(GPU_KEYS, math.nan))
            continue
        start, end = before[-1][1], work[-1][1]
        busy = clipped(work, start, end)
        nccl = clipped(union(collectives[n]), start, end)
        rows.append(
            {
                "host_ms": host_ms,
                "gpu_ms": (end - start) / 1e3,
                "busy_ms": length(busy) / 1e3,
                "nccl_ms": length(nccl) / 1e3,
                "nccl_alone_ms": minus(nccl, clipped(union(others[n]), start, end)) / 1e3,
                "idle_ms": (end - start - length(busy)) / 1e3,
            }
        )
    return rows


def clipped(intervals: list[Interval], start: float, end: float) -> list[Interval]:
    return [(max(a, start), min(b, end)) for a, b in intervals if b > start and a < end]


def mean_of(values: list[float]) -> float:
    """The mean of those that are numbers (NaN: a step with no GPU work to measure)."""
    numbers = [v for v in values if not math.isnan(v)]
    return sum(numbers) / len(numbers) if numbers else math.nan


def report(path: Path) -> str:
    events, rank = load(path)
    rows = steps(events)
    if not rows:
        raise ValueError("fewer than two optimizer steps (Optimizer.step# annotations)")
    keys = ("host_ms", *GPU_KEYS)
    lines = [f"{path.name}{f' (rank {rank})' if rank is not None else ''}: ms a whole step"]
    lines.append("  " + " ".join(f"{key.removesuffix('_ms'):>11}" for key in keys))
    for row in rows:
        lines.append("  " + " ".join(f"{row[key]:>11.2f}" for key in keys))
    means = {key: mean_of([row[key] for row in rows]) for key in keys}
    lines.append("  " + " ".join(f"{means[key]:>11.2f}" for key in keys) + "  (mean)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("traces", nargs="+", type=Path, help="Chrome traces, .json or .json.gz")
    failed = False
    for path in parser.parse_args().traces:
        try:
            print(report(path))
        except (OSError, ValueError, KeyError) as error:
            print(f"{path}: not read: {error}", file=sys.stderr)
            failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
