"""benchmarks/trace_steps.py: per step, the host's time and the GPU's busy, collective and idle
time, read from a Chrome trace (here one written by hand, in torch.profiler's format)."""

import gzip
import json
import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def trace_steps(load_benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return load_benchmark("trace_steps")


def launch(ts: float, correlation: int, category: str = "cuda_runtime") -> dict:
    return {
        "ph": "X", "cat": category, "name": "cudaLaunchKernel", "ts": ts, "dur": 5,
        "args": {"correlation": correlation},
    }  # fmt: skip


def kernel(name: str, ts: float, dur: float, correlation: int) -> dict:
    return {
        "ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,
        "args": {"correlation": correlation},
    }  # fmt: skip


def optimizer_step(ts: float, dur: float, category: str = "user_annotation") -> dict:
    return {"ph": "X", "cat": category, "name": "Optimizer.step#AdamW.step", "ts": ts, "dur": dur}


# Optimizer steps ending at 1000, 2000 and 5000 µs: two whole steps; a fourth, still open when
# recording stopped at 6000, ends there cut short and is none. The first (before 1000) launches
# a matmul run at 200-1200: where the GPU's time of the next starts. The second launches a matmul
# (runtime API) and an all-reduce (driver API, as Triton's and some NCCL launches are) that
# overlaps it; the third's host is slow (a host-bound step): a kernel launched as the second
# ended (at 2000) runs at 2650-2700, one launched just after runs at 2550-2620 beside the
# all-reduce (only 2600-2620 is the third's time), and one launched at its end runs at 5000-5500.
# The GPU's copy of an annotation (gpu_user_annotation) is no optimizer step of the host's.
EVENTS = [
    optimizer_step(0, 1000),
    launch(100, 1),
    kernel("sm90_bf16_gemm", 200, 1000, 1),
    optimizer_step(1000, 1000),
    optimizer_step(1200, 1500, category="gpu_user_annotation"),
    launch(1100, 2),
    kernel("sm90_bf16_gemm", 1300, 1000, 2),
    launch(1150, 3, category="cuda_driver"),
    kernel("ncclDevKernel_AllReduce_Sum_bf16", 2000, 600, 3),
    optimizer_step(2000, 3000),
    launch(4900, 4),
    kernel("elementwise_kernel", 5000, 500, 4),
    kernel("not_launched_in_the_trace", 5000, 100, 99),
    launch(5100, 5),  # after the last whole optimizer step: no whole step's
    kernel("elementwise_kernel", 5600, 100, 5),
    launch(2000, 6),
    kernel("elementwise_kernel", 2650, 50, 6),
    launch(2010, 7),
    kernel("elementwise_kernel", 2550, 70, 7),
    optimizer_step(5200, 800),
    {"ph": "i", "name": "Record Window End", "ts": 6000},
]


def test_each_step_gets_the_gpu_work_its_host_launched(
    trace_steps: ModuleType, tmp_path: Path
) -> None:
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as file:
        json.dump({"traceEvents": EVENTS, "distributedInfo": {"rank": 1}}, file)
    events, rank = trace_steps.load(path)
    assert rank == 1
    first, second = trace_steps.steps(events)
    assert first == pytest.approx(
        {
            "host_ms": 1.0,
            "gpu_ms": 1.4,  # from 1200 (the step before's last work) to 2600
            "busy_ms": 1.3,  # 1300-2600: the overlap counted once
            "nccl_ms": 0.6,
            "nccl_alone_ms": 0.3,  # 2300-2600: nothing else ran
            "idle_ms": 0.1,
        }
    )
    assert second == pytest.approx(
        {
            "host_ms": 3.0,
            "gpu_ms": 2.9,  # 2600 to 5500
            "busy_ms": 0.57,  # 2600-2620, 2650-2700, 5000-5500
            "nccl_ms": 0.0,
            "nccl_alone_ms": 0.0,
            "idle_ms": 2.33,  # waiting for its host
        }
    )
    lines = trace_steps.report(path).splitlines()
    assert lines[0] == "trace.json.gz (rank 1): ms a whole step"
    assert len(lines) == 2 + 2 + 1  # the header lines, two whole steps, their means
    assert lines[-1].split() == ["2.00", "2.15", "0.94", "0.30", "0.15", "1.22", "(mean)"]


def test_a_cpu_trace_gives_the_host_time_alone(trace_steps: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "cpu.json"
    marks = [optimizer_step(0, 10), optimizer_step(10, 10), optimizer_step(20, 30)]
    path.write_text(json.dumps({"traceEvents": marks}))
    rows = trace_steps.steps(trace_steps.load(path)[0])
    assert [row["host_ms"] for row in rows] == [0.01, 0.03]
    assert all(math.isnan(row[key]) for row in rows for key in trace_steps.GPU_KEYS)
    path.write_text(json.dumps({"traceEvents": marks[:1]}))
    with pytest.raises(ValueError, match="fewer than two optimizer steps"):
        trace_steps.report(path)
