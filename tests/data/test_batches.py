"""Whole-batch data paths: the global sample order, its shards, both paths' equal batches."""

import copy
import pickle
import threading
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor

from volt.data import batches as batches_module
from volt.data.batches import BatchOrder, HostLoading, ImageBatches, Split
from volt.data.digits import DigitsDataModule
from volt.data.image_transform import ImageTransform

CIFAR_LIKE = ImageTransform((0.5, 0.4, 0.3), (0.2, 0.25, 0.3), crop_padding=4, flip=True)


def steps(order: BatchOrder, epoch: int = 0) -> list[list[int]]:
    order.set_epoch(epoch)
    return [indices.tolist() for _, indices in order]


def images(n: int = 103) -> Split:
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8, generator=generator)
    return Split(pixels, torch.arange(n))


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_split_each_global_batch_of_one_process(world: int) -> None:
    one = steps(BatchOrder(100, 12, seed=5, shuffle=True, drop_last=True), epoch=2)
    ranks = [
        steps(
            BatchOrder(100, 12 // world, seed=5, shuffle=True, drop_last=True, rank=r, world=world),
            2,
        )
        for r in range(world)
    ]
    assert len(one) == 100 // 12 and all(len(r) == len(one) for r in ranks)
    for step, batch in enumerate(one):
        assert [i for r in ranks for i in r[step]] == batch


def test_an_epoch_s_order_is_torch_s_shuffle_made_on_one_cpu_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same order as before (a run resumed from an older checkpoint draws the same batches),
    made without torch's other CPU threads, whose count is back afterwards."""
    threads_at_shuffle = []
    shuffle = torch.randperm

    def counting(*args: Any, **kwargs: Any) -> Tensor:
        threads_at_shuffle.append(torch.get_num_threads())
        return shuffle(*args, **kwargs)

    monkeypatch.setattr(torch, "randperm", counting)
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # (where torch already runs on one, the test would prove nothing)
    try:
        order = BatchOrder(40_000, 1_000, seed=7, shuffle=True, drop_last=True)
        expected = shuffle(
            40_000, generator=torch.Generator().manual_seed(batches_module.shuffle_seed(7, 3))
        )
        assert [i for batch in steps(order, epoch=3) for i in batch] == expected.tolist()
        assert threads_at_shuffle == [1]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_copied_order_leaves_its_gpu_staging_behind() -> None:
    order = BatchOrder(10, 2, seed=1, shuffle=True, drop_last=True)
    # Stand-ins for the pinned buffer and its CUDA event: a lock cannot be pickled either.
    order._pinned = torch.empty(10, dtype=torch.long)
    order._copied = threading.Lock()  # type: ignore[assignment]
    for copied in (pickle.loads(pickle.dumps(order)), copy.deepcopy(order)):
        assert copied._pinned is None and copied._copied is None
        assert steps(copied, 2) == steps(order, 2)


def test_evaluation_keeps_every_sample_and_gives_each_rank_as_many_steps() -> None:
    ranks = [
        steps(BatchOrder(11, 2, seed=0, shuffle=False, drop_last=False, rank=r, world=2))
        for r in range(2)
    ]
    seen = [i for r in ranks for batch in r for i in batch]
    assert sorted(set(seen)) == list(range(11))
    assert len(seen) == 12  # one sample repeated so both ranks take 6
    assert [len(b) for b in ranks[0]] == [len(b) for b in ranks[1]] == [2, 2, 2]
    assert len(BatchOrder(11, 2, seed=0, shuffle=False, drop_last=False, world=2)) == 3


def test_a_resumed_epoch_goes_on_with_the_steps_it_would_have_drawn_on_any_rank() -> None:
    for rank in range(2):
        whole = BatchOrder(64, 4, seed=9, shuffle=True, drop_last=True, rank=rank, world=2)
        resumed = BatchOrder(64, 4, seed=9, shuffle=True, drop_last=True, rank=rank, world=2)
        resumed.resume_at(epoch=1, steps_done=3)
        resumed.set_epoch(1)
        whole.set_epoch(1)
        assert [(s, i.tolist()) for s, i in resumed] == [(s, i.tolist()) for s, i in whole][3:]
        assert steps(resumed, 1) == steps(whole, 1)  # the next pass is a whole epoch again


def batches_of(path: ImageBatches, epoch: int) -> list[tuple[Tensor, Tensor]]:
    path.order.set_epoch(epoch)
    return list(path)


def steps_at_once(monkeypatch: pytest.MonkeyPatch, steps: int, batch_size: int) -> None:
    """Makes the device path prepare `steps` batches of `images()` at a time."""
    monkeypatch.setattr(batches_module, "STEPS_AT_ONCE_BYTES", steps * batch_size * 3 * 8 * 8 * 4)


@pytest.mark.parametrize(("workers", "at_once"), [(0, 4), (2, 4), (0, 1), (0, 100)])
def test_dataloader_path_gives_the_on_device_path_s_batches_bit_for_bit(
    workers: int, at_once: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps_at_once(monkeypatch, at_once, 16)  # 4: two runs of steps in an epoch of 6, one short

    def path(loading: HostLoading | None) -> ImageBatches:
        order = BatchOrder(103, 16, seed=3, shuffle=True, drop_last=True)
        return ImageBatches(images(), order, CIFAR_LIKE, torch.device("cpu"), loading)

    on_device, host = path(None), path(HostLoading(num_workers=workers))
    for epoch in (0, 1):
        ours, theirs = batches_of(on_device, epoch), batches_of(host, epoch)
        assert len(ours) == len(theirs) == 103 // 16
        for (x, y), (x2, y2) in zip(ours, theirs, strict=True):
            assert x.dtype == torch.float32 and x.shape == (16, 3, 8, 8)
            assert torch.equal(x, x2) and torch.equal(y, y2)
    # and the augmentation draws afresh each epoch
    assert not torch.equal(batches_of(on_device, 0)[0][0], batches_of(on_device, 1)[0][0])


def test_evaluation_batches_are_the_same_prepared_one_or_several_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    evaluation = ImageTransform((0.5, 0.4, 0.3), (0.2, 0.25, 0.3))

    def batches(at_once: int) -> list[tuple[Tensor, Tensor]]:
        steps_at_once(monkeypatch, at_once, 16)
        order = BatchOrder(103, 16, seed=3, shuffle=False, drop_last=False)
        return list(ImageBatches(images(), order, evaluation, torch.device("cpu")))

    one, several = batches(1), batches(3)
    assert [len(y) for _, y in several] == [16] * 6 + [7]  # the last batch short
    for (x, y), (x2, y2) in zip(one, several, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2)


def test_the_device_path_prepares_a_run_of_steps_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    steps_at_once(monkeypatch, 4, 16)
    prepared: list[int] = []
    original = ImageTransform.apply

    def counted(self: ImageTransform, images: Tensor, draws: Any) -> Tensor:
        prepared.append(len(images))
        return original(self, images, draws)

    monkeypatch.setattr(ImageTransform, "apply", counted)
    order = BatchOrder(103, 16, seed=3, shuffle=True, drop_last=True)
    path = ImageBatches(images(), order, CIFAR_LIKE, torch.device("cpu"))
    assert path.steps_at_once == 4
    assert [len(y) for _, y in path] == [16] * 6
    assert prepared == [64, 32]  # steps 0-3, then 4-5


@pytest.mark.parametrize("steps_done", [2, 5])
def test_a_resumed_epoch_on_the_device_path_gets_the_unbroken_epoch_s_batches(
    steps_done: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps_at_once(monkeypatch, 4, 8)  # resumed inside the first run of steps, then the second

    def path(resumed: bool) -> ImageBatches:
        order = BatchOrder(103, 8, seed=3, shuffle=True, drop_last=True, rank=1, world=2)
        if resumed:
            order.resume_at(epoch=2, steps_done=steps_done)
        return ImageBatches(images(), order, CIFAR_LIKE, torch.device("cpu"))

    whole, resumed = batches_of(path(False), 2), batches_of(path(True), 2)
    assert len(resumed) == len(whole) - steps_done == 103 // 16 - steps_done
    for (x, y), (x2, y2) in zip(whole[steps_done:], resumed, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2)


def test_the_dataloader_fetches_a_whole_batch_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    fetches: list[int] = []
    original = Split.__getitem__

    def counted(self: Split, step_and_indices: tuple[int, Tensor]) -> tuple[int, Tensor, Tensor]:
        fetches.append(len(step_and_indices[1]))
        return original(self, step_and_indices)

    monkeypatch.setattr(Split, "__getitem__", counted)
    order = BatchOrder(103, 16, seed=3, shuffle=True, drop_last=True)
    path = ImageBatches(images(), order, CIFAR_LIKE, torch.device("cpu"), HostLoading())
    assert len(list(path)) == 6
    assert fetches == [16] * 6


def test_normalisation_scales_uint8_to_unit_range_first() -> None:
    stored = torch.tensor([0, 255], dtype=torch.uint8).view(2, 1, 1, 1)
    out = ImageTransform((0.5,), (0.5,))(stored)
    assert out.flatten().tolist() == pytest.approx([-1.0, 1.0])
    floats = torch.tensor([0.0, 1.0]).view(2, 1, 1, 1)
    assert ImageTransform((0.5,), (0.5,))(floats).flatten().tolist() == pytest.approx([-1.0, 1.0])


@pytest.mark.parametrize(("free_bytes", "expected"), [(10**9, True), (10**5, False)])
def test_auto_keeps_data_on_the_gpu_when_it_fits_in_a_share_of_free_memory(
    monkeypatch: pytest.MonkeyPatch, free_bytes: int, expected: bool
) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free_bytes, 2 * free_bytes))
    dm = DigitsDataModule(batch_size=64, val_fraction=0.15, test_fraction=0.15)
    dm.setup()
    stored = sum(s.nbytes for s in (dm.train_set, dm.val_set, dm.test_set) if s)
    assert (stored <= batches_module.AUTO_SHARE * free_bytes) == expected  # the case is as named
    assert dm._keep_on(torch.device("cuda")) is expected
    assert dm._keep_on(torch.device("cpu")) is False


@pytest.mark.parametrize("value", [True, False])
def test_on_device_true_or_false_is_taken_as_said_on_any_device(value: bool) -> None:
    dm = DigitsDataModule(batch_size=64, on_device=value)
    assert dm._keep_on(torch.device("cpu")) is value


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_on_device_refuses_other_values_naming_the_key(value: object) -> None:
    with pytest.raises(ValueError, match=r"data\.on_device=.* must be auto, true or false"):
        DigitsDataModule(batch_size=64, on_device=value)  # type: ignore[arg-type]


@pytest.mark.gpu
def test_batches_copied_ahead_on_a_side_stream_equal_the_host_batches() -> None:
    device = torch.device("cuda")
    order = BatchOrder(103, 16, seed=3, shuffle=True, drop_last=True)
    host = ImageBatches(images(), order, CIFAR_LIKE, device, HostLoading(pin_memory=True))
    on_gpu = ImageBatches(images().to(device), order, CIFAR_LIKE, device)
    for (x, y), (x2, y2) in zip(batches_of(host, 0), batches_of(on_gpu, 0), strict=True):
        assert x.device.type == x2.device.type == "cuda"
        assert torch.equal(x, x2) and torch.equal(y, y2)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("shuffle", "world", "rank"),
    [(True, 1, 0), (False, 3, 1)],  # evaluation's, padded: a copy
)
def test_each_epoch_s_order_reaches_the_gpu_through_one_pinned_buffer_intact(
    shuffle: bool, world: int, rank: int
) -> None:
    device = torch.device("cuda")
    order = BatchOrder(103, 8, seed=3, shuffle=shuffle, drop_last=shuffle, rank=rank, world=world)
    kept = []
    for epoch in range(4):
        order.set_epoch(epoch)
        # Work queued ahead of the copy keeps it pending while the next epoch is shuffled: the
        # buffer must not be overwritten before the copy out of it has run.
        torch.cuda._sleep(100_000_000)  # about 50 ms of GPU clock cycles
        kept.append([indices for _, indices in order.on(device)])
        buffer = order._pinned
        assert buffer is not None and buffer.is_pinned()
        if epoch == 0:
            first = buffer.data_ptr()
        assert buffer.data_ptr() == first  # the same memory every epoch
    for epoch, on_gpu in enumerate(kept):
        assert [i.device.type for i in on_gpu] == ["cuda"] * len(on_gpu)
        assert [i.tolist() for i in on_gpu] == steps(order, epoch)  # the host's order, unspoiled


class SeenLabels(pl.Callback):
    def __init__(self) -> None:
        self.by_epoch: dict[int, list[int]] = {}

    def on_train_batch_start(
        self, trainer: pl.Trainer, module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.by_epoch.setdefault(trainer.current_epoch, []).extend(batch[1].tolist())


class Linear(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(64, 10)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x.flatten(1)), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def labels_seen_in_a_fit(on_device: bool) -> dict[int, list[int]]:
    seen = SeenLabels()
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[seen],
    )
    torch.manual_seed(4)
    data = DigitsDataModule(
        batch_size=256, val_fraction=0.15, test_fraction=0.15, on_device=on_device
    )
    trainer.fit(Linear(), datamodule=data)
    return seen.by_epoch


def test_a_lightning_fit_draws_a_fresh_shuffle_each_epoch_on_either_path() -> None:
    on_device, host = labels_seen_in_a_fit(True), labels_seen_in_a_fit(False)
    assert on_device == host
    assert sorted(on_device) == [0, 1, 2]
    assert len({tuple(labels) for labels in on_device.values()}) == 3


def test_any_torch_seed_gives_a_valid_augmentation_seed() -> None:
    order = BatchOrder(64, 8, seed=2**31 - 1, shuffle=True, drop_last=True, rank=3, world=4)
    order.set_epoch(10_000)
    path = ImageBatches(images(64), order, CIFAR_LIKE, torch.device("cpu"))
    assert len(list(path)) == 2  # seeding each batch's generator raised OverflowError
