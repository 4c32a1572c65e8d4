"""volt.data.resumable: what the image and text data modules share (the global batch per process,
the position in the data that checkpoints keep)."""

from collections.abc import Callable
from types import SimpleNamespace

import pytest

from volt.data.resumable import ResumableDataModule


def module(batch_size: int) -> ResumableDataModule:
    data = ResumableDataModule()
    data.batch_size = batch_size
    return data


def test_the_restored_position_is_handed_over_once() -> None:
    data = module(64)
    assert data.take_resume_point() is None  # nothing restored
    data.load_state_dict({"epoch": 3, "batches_done": 7})
    assert data.take_resume_point() == {"epoch": 3, "batches_done": 7}
    assert data.take_resume_point() is None  # a later epoch's batches start afresh
    data.load_state_dict({})  # a checkpoint written without a trainer
    assert data.take_resume_point() is None


def test_state_is_the_epoch_and_the_batches_done_in_it() -> None:
    data = module(64)
    assert data.state_dict() == {}  # no trainer: nothing to say
    progress = SimpleNamespace(current=SimpleNamespace(processed=12))
    fit_loop = SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress))
    data.trainer = SimpleNamespace(current_epoch=2, fit_loop=fit_loop)  # type: ignore[assignment]
    assert data.state_dict() == {"epoch": 2, "batches_done": 12}


def test_a_batch_that_does_not_divide_over_the_processes_is_refused_with_a_fix(
    fake_trainer: Callable[..., SimpleNamespace],
) -> None:
    data = module(64)
    data.trainer = fake_trainer(world_size=4)  # type: ignore[assignment]
    assert data.per_process_batch_size == 16
    data.trainer = fake_trainer(world_size=3)  # type: ignore[assignment]
    fix = r"does not divide over 3 processes; use a multiple of 3, e.g. data.batch_size=63"
    with pytest.raises(ValueError, match=rf"data.batch_size=64 {fix}"):
        _ = data.per_process_batch_size
