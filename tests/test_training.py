"""volt.training: a CUDA out-of-memory inside a training step ends the run with volt's one-line
error (TrainingOutOfMemoryError: the batch size, the GPU's peak and total, what to change) and a
run record that says so. The OutOfMemoryError is raised from a real model's training_step, and
on a GPU by a real allocation."""

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import DictConfig
from torch import Tensor

from volt.errors import TrainingOutOfMemoryError
from volt.models.classifier import Classifier
from volt.training import train

GIB = 1024**3
HERE = "tests.test_training"
Batch = tuple[Tensor, Tensor]


class OutOfMemoryInSecondStep(Classifier):
    """Trains one step, then fails the second as the CUDA caching allocator does when a block
    does not fit (the error torch raises, with its own message)."""

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        if batch_idx == 1:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of"
                " 79.19 GiB of which 1.06 GiB is free."
            )
        return super().training_step(batch, batch_idx)


class ExhaustsGPUMemory(Classifier):
    """Asks the GPU for a petabyte in its first training step: a real CUDA out-of-memory."""

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        torch.empty(2**50, dtype=torch.uint8, device=self.device)
        return super().training_step(batch, batch_idx)


def test_oom_in_a_training_step_becomes_one_clear_error(
    compose_config: Callable[..., DictConfig], fast: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # No GPU here: the memory numbers torch would read from an 80 GiB card.
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 70 * GIB)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=80 * GIB)
    )
    cfg = compose_config(
        "train",
        [
            *fast,
            "trainer=cpu",
            f"model._target_={HERE}.OutOfMemoryInSecondStep",
            "trusted_targets=[tests]",
            "logger=none",
        ],
    )
    with pytest.raises(TrainingOutOfMemoryError) as stopped:
        train(cfg)

    message = str(stopped.value)
    assert "\n" not in message
    assert message.startswith("CUDA out of memory on cpu with data.batch_size=64:"), message
    assert "peak 70.0 GiB allocated of 80.0 GiB" in message
    assert "(data.batch_size=32)" in message
    assert isinstance(stopped.value.__cause__, torch.OutOfMemoryError)
    record = json.loads((Path(cfg.paths.output_dir) / "run.json").read_text())
    assert record["status"] == "failed"
    assert record["error"] == f"TrainingOutOfMemoryError: {message}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_real_cuda_oom_ends_train_py_with_one_line(
    run_volt: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    result = run_volt(
        [
            "trainer=gpu",
            "trainer.devices=1",
            f"model._target_={HERE}.ExhaustsGPUMemory",
            "trusted_targets=[tests]",
            "callbacks.progress_bar=null",
        ],
        timeout=240,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("volt: error: ")]
    assert "CUDA out of memory on cuda:0 with data.batch_size=64: peak " in line
    assert "(data.batch_size=32)" in line


def test_a_run_that_took_a_step_keeps_its_directory(tmp_path: Path) -> None:
    from volt.training import nothing_to_keep

    before_any_step = RuntimeError("a defect in the module's first training_step")
    assert nothing_to_keep(before_any_step, tmp_path)  # nothing trained: nothing to keep
    after_three = RuntimeError("a defect at step 3")
    after_three.steps_taken = 3  # type: ignore[attr-defined]  # as train_run notes it
    assert not nothing_to_keep(after_three, tmp_path)  # its log tells what happened
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert not nothing_to_keep(before_any_step, tmp_path)
