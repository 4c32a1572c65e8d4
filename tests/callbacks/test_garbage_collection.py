"""GarbageCollection: Python's automatic collection off while training, collections at global
steps that are multiples of N (the same steps on every rank), and collection as it was after."""

import gc
import weakref

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from volt.callbacks.garbage_collection import GarbageCollection


class Recorder(pl.LightningModule):
    """Notes, at each training step, whether automatic collection is on."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.automatic: list[bool] = []
        self.frozen: list[int] = []
        self.fail_at = fail_at

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        if self.global_step == self.fail_at:
            raise RuntimeError("failed on purpose")
        self.automatic.append(gc.isenabled())
        self.frozen.append(gc.get_freeze_count())
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(model: Recorder, callback: GarbageCollection, **trainer_args: object) -> None:
    data = DataLoader(TensorDataset(torch.randn(80, 4), torch.randn(80, 1)), batch_size=8)
    trainer = pl.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[callback],
        **({"max_epochs": 2} | trainer_args),  # type: ignore[arg-type]
    )
    trainer.fit(model, data)


def collections(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The generation argument of every gc.collect() call from here on."""
    calls: list[tuple[int, ...]] = []
    real = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *args: calls.append(args) or real(*args))
    return calls


def test_training_runs_without_automatic_collection_and_collects_every_n_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert gc.isenabled()
    calls = collections(monkeypatch)
    model = Recorder()
    fit(model, GarbageCollection(every_n_steps=4))  # 10 steps an epoch, 20 in all
    assert model.automatic == [False] * 20
    assert gc.isenabled()  # as it was before the fit
    # All at the start and at both epochs' ends (steps 10 and 20: 4 or more steps since the
    # last); generations 0-1 at steps 4, 8, 12, 16, 20.
    assert calls == [(), (1,), (1,), (), (1,), (1,), (1,), ()]


def test_an_epoch_end_collects_all_only_once_the_last_full_collection_is_old(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = collections(monkeypatch)
    fit(Recorder(), GarbageCollection(every_n_steps=15), max_epochs=4)  # 10-step epochs
    # Start; epoch ends at 10 (10 < 15 steps: no), 20 (yes), 30 (no), 40 (yes); young at 15, 30.
    assert calls == [(), (1,), (), (1,), ()]


def test_every_twentieth_collection_takes_all_generations(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = collections(monkeypatch)
    fit(Recorder(), GarbageCollection(every_n_steps=1), max_epochs=5)  # 50 steps
    full = [i for i, call in enumerate(calls) if call == ()]
    # At the start; at steps 20 and 40 (the 20th and 40th collections); the epochs' ends (every
    # 10 steps, one step after the last full one at the earliest) add theirs where none just ran.
    assert calls.count((1,)) == 48 and full == [0, 11, 21, 32, 42, 53]


def test_with_gradient_accumulation_it_counts_optimizer_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = collections(monkeypatch)
    fit(Recorder(), GarbageCollection(every_n_steps=2), accumulate_grad_batches=5)  # 4 steps
    assert calls.count((1,)) == 2


def test_a_failing_fit_puts_automatic_collection_back() -> None:
    with pytest.raises(RuntimeError, match="failed on purpose"):
        fit(Recorder(fail_at=3), GarbageCollection(every_n_steps=2))
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


class Cycle:
    """An object that refers to itself: only a collection that walks it frees it."""

    def __init__(self) -> None:
        self.me = self


def test_what_lives_as_training_starts_is_frozen_then_free_again_after() -> None:
    # A full collection walks only what training made (unfrozen, each walked every object of
    # torch and Lightning: 340 ms on an H100, issue #40); what was frozen is collectable after.
    gc.collect()
    model = Recorder()
    before = Cycle()
    alive = weakref.ref(before)
    model.before = before  # type: ignore[assignment]  # alive when training starts: frozen
    fit(model, GarbageCollection(every_n_steps=1))
    assert min(model.frozen) > 1000  # torch's and Lightning's objects, the model among them
    assert gc.get_freeze_count() == 0  # all unfrozen when training ends
    del model.before, before
    assert alive() is not None  # a cycle: only a collection frees it
    gc.collect()
    assert alive() is None


class Maker(Recorder):
    """Makes a long-lived object at steps 2 and 12 and notes, at every step, which of them a
    collection would still walk (gc.get_objects leaves out what is frozen)."""

    def __init__(self) -> None:
        super().__init__()
        self.made: dict[int, list[int]] = {}
        self.walked: list[list[int]] = []

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        if self.global_step in (2, 12):
            self.made[self.global_step] = [self.global_step]  # a tracked container
        ids = {id(o) for o in gc.get_objects()}
        self.walked.append([step for step, made in self.made.items() if id(made) in ids])
        return super().training_step(batch, batch_idx)


def test_what_outlives_the_first_full_collection_of_training_is_frozen_too() -> None:
    # torch.compile builds its graphs in the first steps: each later full collection walked them.
    model = Maker()
    fit(model, GarbageCollection(every_n_steps=4), max_epochs=3)  # 10-step epochs
    # Full collections at the epochs' ends (steps 10, 20): the first one freezes what lives
    # (step 2's object), the second does not (step 12's is still walked after it).
    assert model.walked[3:10] == [[2]] * 7
    assert model.walked[10:12] == [[]] * 2
    assert model.walked[13:30] == [[12]] * 17
    assert gc.get_freeze_count() == 0  # all unfrozen when training ends


def test_a_second_fit_frees_what_the_first_left_frozen() -> None:
    # A sweep's jobs run one after another in one process: the first job's cycles go.
    first = Recorder()
    first.cycle = Cycle()  # type: ignore[assignment]
    fit(first, GarbageCollection(every_n_steps=2))
    gc.disable()  # only the second fit's own start may collect
    try:
        gone = weakref.ref(first.cycle)  # type: ignore[arg-type]
        del first
        second = Recorder()
        fit(second, GarbageCollection(every_n_steps=2))
        assert gone() is None
        assert min(second.frozen) > 1000
    finally:
        gc.enable()


def test_null_leaves_python_in_charge(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = collections(monkeypatch)
    model = Recorder()
    fit(model, GarbageCollection(every_n_steps=None))
    assert all(model.automatic)
    assert not calls


@pytest.mark.parametrize("value", [0, -5, True])
def test_a_bad_interval_is_one_clear_error(value: object) -> None:
    with pytest.raises(ValueError, match=r"every_n_steps=.*must be 1 or more, or null"):
        GarbageCollection(every_n_steps=value)  # type: ignore[arg-type]
