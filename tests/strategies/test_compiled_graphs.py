"""How many compiled graphs volt's GPT runs a step under each trainer: each costs host time every
step, and under DDP 13 of them bound the 85M GPT's step on 2 x H200 (docs/many_gpus.md)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from volt.config import PROJECT_ROOT

SCRIPT = Path(__file__).with_name("compiled_graphs.py")
RUN = [
    "experiment=gpt_bytes_tiny",
    "compile=default",
    "trainer.max_steps=3",
    "model.scheduler.warmup_steps=1",
    "trainer.limit_val_batches=0",
    "trainer.num_sanity_val_steps=0",
    "test=false",
    "callbacks.model_checkpoint=null",
    "callbacks.last_checkpoint=null",
    "callbacks.early_stopping=null",
    "callbacks.progress_bar=null",
    "data.batch_size=4",
]
WIDER = ["model.net.n_layer=4", "model.net.n_embd=512"]


def graphs_per_step(tmp_path: Path, overrides: list[str]) -> list[tuple[int, int]]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "run"), *RUN, *overrides],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("STEPS "))
    steps = json.loads(line.removeprefix("STEPS "))
    assert len(steps) == 3 and all(step["loss"] > 0 for step in steps)
    return [(step.get("forward", 0), step.get("backward", 0)) for step in steps]


@pytest.mark.slow  # compiles on the CPU in a fresh interpreter: about 20-60 s each
@pytest.mark.parametrize(
    ("trainer", "graphs"),
    [
        (["trainer=cpu"], 1),
        # FSDP2's hooks on the net run outside its compiled frame: one graph, as on one device
        (["trainer=fsdp", "trainer.devices=1"], 1),
        # DDP splits the net at each bucket: 4 layers of width 512 (50 MB of gradients) fill
        # its first bucket and one of volt's 100 MB; in torch's 25 MB buckets, one more
        (["trainer=ddp", "trainer.devices=1", *WIDER], 2),
        (["trainer=ddp", "trainer.devices=1", *WIDER, "trainer.strategy.bucket_cap_mb=25"], 3),
    ],
    ids=["cpu", "fsdp", "ddp", "ddp-torchs-buckets"],
)
def test_compiled_graphs_a_step(tmp_path: Path, trainer: list[str], graphs: int) -> None:
    counts = graphs_per_step(tmp_path, trainer)
    # the first step compiles; every step after it runs the same graphs, none recompiled
    assert counts[1] == counts[2]
    forward, backward = counts[2]
    assert forward == backward
    assert forward == graphs, counts
