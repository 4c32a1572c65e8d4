"""The GPT task through volt's entry points: experiment=gpt_bytes_tiny trained, its checkpoint
tested and sampled by volt.eval, tokens/s and samples in its TensorBoard events."""

import csv
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from volt.evaluation import evaluate
from volt.training import train

# The byte-frequency (order-0) entropy of the corpus is 4.54 bits: a model that learnt nothing
# about context gets no lower.
BYTE_FREQUENCY_BITS = 4.54
SHORT = [
    "experiment=gpt_bytes_tiny",
    "trainer=cpu",
    "trainer.max_steps=50",
    "data.steps_per_epoch=25",
    "model.scheduler.max_steps=-1",  # no decay: the rate stays where learning is fastest
    "trainer.limit_val_batches=4",
    "trainer.limit_test_batches=8",
    "model.max_new_tokens=16",
    "callbacks.text_samples.max_new_tokens=16",
    "callbacks.progress_bar=null",
    "callbacks.model_summary=null",
]


@pytest.fixture
def one_thread() -> Iterator[None]:
    # On a loaded 2-core machine a second thread spins waiting for a core (tests/models).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_a_short_tiny_run_learns_context_and_eval_tests_and_samples_its_checkpoint(
    compose_config: Callable[..., DictConfig],
) -> None:
    cfg = compose_config("train", SHORT)
    metrics = train(cfg)
    run_dir = Path(cfg.paths.output_dir)
    assert metrics["test/bpb"] < BYTE_FREQUENCY_BITS  # 3.9 here; the full 200 steps reach 3.27

    events = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("perf/train_tokens_per_s")] == [9, 19, 29, 39, 49]
    assert all(e.value > 0 for e in events.Scalars("perf/train_tokens_per_s"))
    assert "perf/mfu" not in events.Tags()["scalars"]  # no peak for a CPU
    assert [e.step for e in events.Tensors("samples/0/text_summary")] == [25, 50]

    best = json.loads((run_dir / "metrics.json").read_text())["best_checkpoint"]
    eval_cfg = compose_config(
        "eval",
        [f"ckpt_path={best}", "mode=predict", "trainer.limit_test_batches=8", "callbacks=none"],
    )
    evaluated = evaluate(eval_cfg)
    # The same weights on the same test batches: what the training run's own test measured.
    assert evaluated["test/bpb"] == metrics["test/bpb"]
    with (Path(eval_cfg.paths.output_dir) / "predictions.csv").open() as file:
        (row,) = list(csv.DictReader(file))
    assert len(json.loads(row["continuation"])) == 16
    assert len(json.loads(row["prompt"])) == 64  # block_size // 2 of the test split
    assert row["text"]


@pytest.mark.slow  # about 2 minutes on 2 idle cores, more on a loaded machine
@pytest.mark.timeout(900)
def test_the_tiny_experiment_reaches_the_target_on_the_held_out_split(
    run_volt: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    started = time.perf_counter()
    result = run_volt(["experiment=gpt_bytes_tiny", "trainer=cpu"], timeout=840)
    seconds = time.perf_counter() - started
    assert result.returncode == 0, result.stderr[-3000:]
    (record,) = (tmp_path / "outputs" / "train" / "runs").glob("*/metrics.json")
    metrics = json.loads(record.read_text())["metrics"]
    print(f"experiment=gpt_bytes_tiny: test/bpb {metrics['test/bpb']:.3f} in {seconds:.0f} s")
    assert metrics["test/bpb"] <= 3.6
    assert metrics["val/bpb"] <= 3.6
