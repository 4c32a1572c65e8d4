import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

from volt.config import PROJECT_ROOT
from volt.nets.gpt import GPT

TINY = "--n-layer 1 --n-head 2 --n-embd 32 --block-size 32 --batch-size 8 --lr 3e-3"


@pytest.mark.slow  # a fresh interpreter importing torch and Lightning: ~20 s on 2 cores
def test_runs_on_the_cpu_with_tiny_sizes_and_reports_tokens_per_second() -> None:
    steps = "--steps 20 --warmup-steps 2 --max-bytes 100000 --device cpu"
    result = subprocess.run(
        [sys.executable, "benchmarks/gpt_plain.py", *TINY.split(), *steps.split()],
        cwd=PROJECT_ROOT,
        # One thread: on a loaded 2-core machine a second one spins waiting for a core.
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["device"] == "cpu" and report["precision"] == "fp32"
    assert report["tokens_per_s"] > 0 and report["ms_per_step"] > 0
    assert report["mfu"] is None  # no peak for a CPU
    assert report["loss_last"] < report["loss_first"]  # it trains, on real bytes
    assert "tokens/s" in result.stdout and "MFU n/a" in result.stdout


def test_the_loop_times_the_steps_after_the_warm_up(
    load_benchmark: Callable[[str], ModuleType],
) -> None:
    plain = load_benchmark("gpt_plain")
    torch.manual_seed(0)
    net = GPT(block_size=16, n_layer=1, n_head=2, n_embd=32)
    corpus = torch.randint(0, 8, (4096,), dtype=torch.uint8)  # 8 symbols: quick to learn
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in net.parameters()]
    seconds, losses = plain.train(
        net, optimizer, corpus, 4, 16, bf16=False, clip=1.0, warmup=2, steps=10
    )
    assert seconds > 0 and len(losses) == 12  # a loss for every step, warm-up ones too
    assert losses[-1] < losses[0]
    assert all(not torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))


def test_a_traced_loop_records_the_steps_after_those_it_skips(
    load_benchmark: Callable[[str], ModuleType], tmp_path: Path
) -> None:
    """The plain side's trace (gpt_scaling.py --trace) covers the steps after the warm-up, as
    volt's runs are traced: TRACED_STEPS of them, none of the warm-up (compilation on a GPU)."""
    plain = load_benchmark("gpt_plain")
    net = GPT(block_size=16, n_layer=1, n_head=2, n_embd=32)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
    corpus = torch.randint(0, 8, (4096,), dtype=torch.uint8)
    profiler = plain.traced_steps(corpus.device, 3)
    plain.train(
        net, optimizer, corpus, 4, 16, bf16=False, clip=1.0, warmup=3, steps=8,
        after_step=profiler.step,
    )  # fmt: skip
    profiler.stop()
    trace = tmp_path / "traces" / "plain-1-rank0"
    plain.write_trace(profiler, trace)
    events = json.loads(trace.with_suffix(".pt.trace.json").read_text())["traceEvents"]
    steps = sorted(
        e["name"]
        for e in events
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    )
    assert steps == [f"ProfilerStep#{n}" for n in range(3, 8)]  # the 4th to 8th steps: timed
    assert "aten::mm" in trace.with_suffix(".txt").read_text()
    with pytest.raises(ValueError, match="skipped=0"):
        plain.traced_steps(corpus.device, 0)
