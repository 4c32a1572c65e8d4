import re
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch
from sklearn.datasets import load_digits
from torch import Tensor

from volt.data.batches import BatchOrder, Split
from volt.data.digits import DigitsDataModule

# conf/data/digits.yaml: 270 test (round(0.15 * 1797)), then 269 of the remaining 1527 for
# validation (round(1527 * 0.15 / 0.85)), leaving 1258 to train on.
SPLIT = {"val_fraction": 0.15, "test_fraction": 0.15, "split_seed": 1234}
SIZES = {"train": 1258, "val": 269, "test": 270}


def digits(**kwargs: object) -> DigitsDataModule:
    return DigitsDataModule(**{"batch_size": 64, **SPLIT, **kwargs})


@pytest.fixture(scope="module")
def ready() -> DigitsDataModule:
    dm = digits()
    dm.setup("fit")
    return dm


def splits(dm: DigitsDataModule) -> dict[str, Split]:
    sets = {"train": dm.train_set, "val": dm.val_set, "test": dm.test_set}
    assert all(isinstance(s, Split) for s in sets.values())
    return sets  # type: ignore[return-value]


def rows(images: Tensor, labels: Tensor) -> list[tuple[float, ...]]:
    """Each sample as one hashable row (64 pixels, label), to compare splits as multisets."""
    flat = torch.cat([images.flatten(1), labels.unsqueeze(1).float()], dim=1)
    return sorted(map(tuple, flat.tolist()))


def test_split_sizes_add_up_to_the_whole_set(ready: DigitsDataModule) -> None:
    assert {name: len(s) for name, s in splits(ready).items()} == SIZES
    assert sum(SIZES.values()) == 1797


def test_splits_partition_the_data_set(ready: DigitsDataModule) -> None:
    # The digits set holds some duplicate images, so compare multisets of (pixels, label)
    # rows: equal multisets with sizes adding up to 1,797 means no sample is in two splits.
    raw = load_digits()
    everything = rows(
        torch.as_tensor(raw.images, dtype=torch.float32).unsqueeze(1) / 16.0,
        torch.as_tensor(raw.target),
    )
    sets = splits(ready).values()
    assert sorted(row for s in sets for row in rows(s.images, s.labels)) == everything


def test_split_is_fixed_by_split_seed_not_by_the_global_seed() -> None:
    torch.manual_seed(0)
    first = digits()
    first.setup()
    torch.manual_seed(1)
    second = digits()
    second.setup()
    other_seed = digits(split_seed=99)
    other_seed.setup()

    for name, s in splits(first).items():
        assert torch.equal(s.images, splits(second)[name].images), name
        assert torch.equal(s.labels, splits(second)[name].labels), name
    assert not torch.equal(splits(first)["test"].labels, splits(other_seed)["test"].labels)


def test_setup_twice_keeps_the_same_datasets(ready: DigitsDataModule) -> None:
    before = splits(ready)
    ready.setup("test")
    assert splits(ready) == before


def test_training_statistics_normalise_the_training_split(ready: DigitsDataModule) -> None:
    train = splits(ready)["train"]
    images = ready.transform(train=True)(train.images)
    assert images.mean().item() == pytest.approx(0.0, abs=1e-4)
    assert images.std().item() == pytest.approx(1.0, abs=1e-3)


def test_batches_are_float_images_and_long_labels(ready: DigitsDataModule) -> None:
    for loader in (ready.train_dataloader(), ready.val_dataloader(), ready.test_dataloader()):
        x, y = next(iter(loader))
        assert x.shape == (64, 1, 8, 8)
        assert x.dtype == torch.float32
        assert y.shape == (64,)
        assert y.dtype == torch.long
        assert y.min() >= 0 and y.max() <= 9


def test_train_drops_the_last_partial_batch_and_val_test_keep_it(
    ready: DigitsDataModule,
) -> None:
    train, val, test = ready.train_dataloader(), ready.val_dataloader(), ready.test_dataloader()
    assert (train.order.shuffle, val.order.shuffle, test.order.shuffle) == (True, False, False)

    train_sizes = [len(y) for _, y in train]
    assert train_sizes == [64] * (1258 // 64)  # 19 full batches; the 42 left over are dropped
    assert [len(y) for _, y in val] == [64] * 4 + [269 - 4 * 64]
    assert [len(y) for _, y in test] == [64] * 4 + [270 - 4 * 64]


def test_drop_last_false_keeps_the_partial_training_batch() -> None:
    dm = digits(drop_last=False)
    dm.setup()
    assert [len(y) for _, y in dm.train_dataloader()][-1] == 1258 % 64


def test_train_set_smaller_than_a_batch_still_yields_a_batch() -> None:
    dm = digits(batch_size=2048)
    dm.setup()
    assert [len(y) for _, y in dm.train_dataloader()] == [1258]


def test_global_batch_size_is_divided_over_processes(
    ready: DigitsDataModule, fake_trainer: Callable[..., SimpleNamespace]
) -> None:
    ready.trainer = fake_trainer(world_size=2)  # type: ignore[assignment]
    try:
        assert ready.per_process_batch_size == 32
        x, _ = next(iter(ready.train_dataloader()))
        assert x.shape == (32, 1, 8, 8)
        assert ready.val_dataloader().order.batch_size == 32
    finally:
        ready.trainer = None


@pytest.mark.parametrize(
    ("batch_size", "world_size", "suggestion"),
    [(65, 2, "data.batch_size=64"), (10, 4, "data.batch_size=8"), (3, 4, "data.batch_size=4")],
)
def test_batch_size_that_does_not_divide_says_what_to_use(
    fake_trainer: Callable[..., SimpleNamespace],
    batch_size: int,
    world_size: int,
    suggestion: str,
) -> None:
    dm = digits(batch_size=batch_size)
    dm.setup()
    dm.trainer = fake_trainer(world_size=world_size)  # type: ignore[assignment]
    with pytest.raises(ValueError, match=re.escape(f"data.batch_size={batch_size} ")) as error:
        dm.train_dataloader()
    assert f"{world_size} processes" in str(error.value)
    assert suggestion in str(error.value)


@pytest.mark.parametrize(
    ("pin_memory", "device", "expected"),
    [
        (None, None, False),  # no trainer: plain CPU use
        (None, "cpu", False),
        (None, "cuda", True),  # pinned memory only pays off when batches go to a GPU
        (True, "cpu", True),
        (False, "cuda", False),
    ],
)
def test_pin_memory_follows_the_setting_and_the_device(
    ready: DigitsDataModule,
    fake_trainer: Callable[..., SimpleNamespace],
    pin_memory: bool | None,
    device: str | None,
    expected: bool,
) -> None:
    ready.pin_memory, ready.on_device = pin_memory, False
    ready.trainer = None if device is None else fake_trainer(device=device)  # type: ignore[assignment]
    try:
        loaders = (ready.train_dataloader(), ready.val_dataloader(), ready.test_dataloader())
        assert [loader.loader.pin_memory for loader in loaders if loader.loader] == [expected] * 3
    finally:
        ready.pin_memory, ready.on_device, ready.trainer = None, "auto", None


def test_worker_settings_apply_only_with_workers() -> None:
    dm = digits(num_workers=0, persistent_workers=True, prefetch_factor=4)
    dm.setup()
    loader = dm.train_dataloader().loader
    assert loader is not None
    assert (loader.persistent_workers, loader.prefetch_factor) == (False, None)

    dm.num_workers = 2
    loader = dm.train_dataloader().loader  # constructing a DataLoader starts no worker yet
    assert loader is not None
    assert (loader.num_workers, loader.persistent_workers, loader.prefetch_factor) == (2, True, 4)


def test_batch_order_is_a_seeded_shuffle_that_can_start_part_way() -> None:
    def order(epoch: int) -> list[int]:
        o.set_epoch(epoch)
        return [i for _, batch in o for i in batch.tolist()]

    o = BatchOrder(100, 10, seed=7, shuffle=True, drop_last=True)
    epoch3 = order(3)
    assert sorted(epoch3) == list(range(100)) and epoch3 != list(range(100))
    assert order(3) == epoch3  # a pure function of (seed, epoch)
    assert order(4) != epoch3
    o.resume_at(3, 4)  # resumed after 4 steps of epoch 3
    o.set_epoch(3)
    assert [step for step, _ in o] == list(range(4, 10))
    assert order(3) == epoch3  # the skip applies to one pass only
    o.resume_at(3, 4)
    assert order(3) == epoch3[40:]
