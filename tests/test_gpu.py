"""What volt says when the GPU runs out of memory, checked without a GPU."""

from types import SimpleNamespace

import pytest
import torch

from volt import gpu
from volt.train import TrainingOutOfMemoryError, fit_and_test


def test_oom_message_names_batch_peak_total_and_fixes(monkeypatch: pytest.MonkeyPatch) -> None:
    gib = 1024**3
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 70 * gib)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=80 * gib)
    )
    message = gpu.explain_oom(512, torch.device("cuda", 0))
    assert "data.batch_size=512" in message
    assert "peak 70.0 GiB allocated of 80.0 GiB" in message
    assert "data.batch_size=256" in message
    assert "precision=bf16-mixed" in message
    assert "tune=batch_size" in message


def test_oom_during_fit_becomes_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def fit(*args: object, **kwargs: object) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    trainer = SimpleNamespace(
        fit=fit, strategy=SimpleNamespace(root_device=torch.device("cuda", 0))
    )
    run = SimpleNamespace(trainer=trainer, model=None, datamodule=SimpleNamespace(batch_size=64))
    monkeypatch.setattr(
        "volt.train.explain_oom", lambda batch, device: f"OOM at {batch} on {device}"
    )
    with pytest.raises(TrainingOutOfMemoryError, match="OOM at 64 on cuda:0"):
        fit_and_test(run, test=True, resume_from=None)  # type: ignore[arg-type]
