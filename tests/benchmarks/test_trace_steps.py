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


def launch(ts: float, correlation: int) -> dict:
    return {
        "ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 5,
        "args": {"correlation": correlation},
    }  # fmt: skip


def kernel(name: str, ts: float, dur: float, correlation: int) -> dict:
    return {
        "ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,
        "args": {"correlation": correlation},
    }  # fmt: skip


def step(n: int, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": ts, "dur": dur}


# Step 7's host runs 0-1000 µs and launches a matmul and an all-reduce that overlaps it by half;
# step 8's host runs 1000-4000 µs (slow: a host-bound step) and launches one kernel at its end,
# run at 4000-4500 after the GPU has idled since 1600.
EVENTS = [
    step(7, 0, 1000),
    launch(100, 1),
    kernel("ampere_bf16_gemm", 200, 1000, 1),
    launch(150, 2),
    kernel("ncclDevKernel_AllReduce_Sum_bf16", 700, 900, 2),
    step(8, 1000, 3000),
    launch(3900, 3),
    kernel("elementwise_kernel", 4000, 500, 3),
    kernel("not_launched_in_a_step", 5000, 100, 99),
]


def test_each_step_gets_the_gpu_work_its_host_launched(
    trace_steps: ModuleType, tmp_path: Path
) -> None:
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as file:
        json.dump({"traceEvents": EVENTS}, file)
    first, second = trace_steps.steps(trace_steps.load(path))
    assert first["step"] == 7 and first["host_ms"] == 1.0
    assert math.isnan(first["gpu_ms"])  # no step before it to measure from
    assert first["busy_ms"] == pytest.approx(1.4)  # 200-1600: the overlap counted once
    assert first["nccl_ms"] == pytest.approx(0.9)
    assert first["nccl_alone_ms"] == pytest.approx(0.4)  # 1200-1600: nothing else ran
    assert second["step"] == 8 and second["host_ms"] == 3.0
    assert second["gpu_ms"] == pytest.approx(2.9)  # from 1600 to 4500
    assert second["busy_ms"] == pytest.approx(0.5) and second["nccl_ms"] == 0
    assert second["idle_ms"] == pytest.approx(2.4)  # waiting for its host
    report = trace_steps.report(path)
    assert report.splitlines()[0].startswith("trace.json.gz: ms a step")
    assert report.splitlines()[-1].split() == ["8", "3.00", "2.90", "0.50", "0.00", "0.00", "2.40"]
