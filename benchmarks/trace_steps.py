"""Step by step, what torch.profiler's Chrome traces say of where a step's time went: the host's
time in each profiled step, the GPU's time from the end of the step before to the end of this
one, how much of that it was busy (kernels, copies and fills on any stream, overlaps counted
once), of which collectives (NCCL kernels) and collectives no other work overlapped, and how
long it sat idle. A step whose GPU idles is bound by its host (or waits on another rank); one
whose GPU is busy throughout is bound by the GPU.

    python benchmarks/trace_steps.py run/tensorboard/profiler/*.pt.trace.json other.json.gz

The GPU's work is given to the step whose host launched it (CUDA's correlation ids), so queued
work that runs during the next step's host time still counts for its own step. The traces of
`gpu_checks.sh gpt-trace` (volt's runs and the plain DDP loop) are read this way there.
"""

import argparse
import gzip
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

STEP = re.compile(r"ProfilerStep#(\d+)")
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
Interval = tuple[float, float]


def load(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as file:
        return json.load(file)["traceEvents"]


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
    """One row a profiled step, in milliseconds (the trace's times are microseconds)."""
    marks = sorted(
        (e for e in events if e.get("ph") == "X" and STEP.fullmatch(str(e.get("name")))),
        key=lambda e: e["ts"],
    )
    launched_in = {}  # correlation id -> the step whose host launched it
    for event in events:
        if event.get("cat") != "cuda_runtime" or "correlation" not in event.get("args", {}):
            continue
        for n, mark in enumerate(marks):
            if mark["ts"] <= event["ts"] < mark["ts"] + mark["dur"]:
                launched_in[event["args"]["correlation"]] = n
                break
    work: dict[int, list[Interval]] = defaultdict(list)
    collectives: dict[int, list[Interval]] = defaultdict(list)
    for event in events:
        if event.get("cat") not in GPU_CATEGORIES:
            continue
        n = launched_in.get(event.get("args", {}).get("correlation"))
        if n is None:
            continue
        span = (event["ts"], event["ts"] + event["dur"])
        work[n].append(span)
        if "nccl" in event["name"].lower():
            collectives[n].append(span)
    rows, gpu_end = [], None
    for n, mark in enumerate(marks):
        busy, nccl = union(work[n]), union(collectives[n])
        others = union([s for s in work[n] if s not in collectives[n]])
        end = busy[-1][1] if busy else None
        span = end - gpu_end if end is not None and gpu_end is not None else None
        rows.append(
            {
                "step": int(STEP.fullmatch(mark["name"])[1]),  # type: ignore[index]
                "host_ms": mark["dur"] / 1e3,
                "gpu_ms": span / 1e3 if span is not None else float("nan"),
                "busy_ms": length(busy) / 1e3,
                "nccl_ms": length(nccl) / 1e3,
                "nccl_alone_ms": minus(nccl, others) / 1e3,
                "idle_ms": (span - length(busy)) / 1e3 if span is not None else float("nan"),
            }
        )
        gpu_end = end if end is not None else gpu_end
    return rows


def report(path: Path) -> str:
    rows = steps(load(path))
    lines = [f"{path.name}: ms a step (gpu: from the step before's last GPU work to this one's)"]
    keys = ("host_ms", "gpu_ms", "busy_ms", "nccl_ms", "nccl_alone_ms", "idle_ms")
    lines.append("  step " + " ".join(f"{key.removesuffix('_ms'):>10}" for key in keys))
    for row in rows:
        lines.append(f"  {row['step']:>4} " + " ".join(f"{row[key]:>10.2f}" for key in keys))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("traces", nargs="+", type=Path, help="Chrome traces, .json or .json.gz")
    for path in parser.parse_args().traces:
        try:
            print(report(path))
        except (OSError, ValueError, KeyError) as error:
            print(f"{path}: not read: {error}", file=sys.stderr)


if __name__ == "__main__":
    main()
