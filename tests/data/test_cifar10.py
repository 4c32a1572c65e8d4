import pickle
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
import torchvision.datasets.cifar
from torch import Tensor

from volt.data.cifar10 import (
    FOLDER,
    MEAN,
    STD,
    TEST_FILE,
    TRAIN_FILES,
    CIFAR10DataModule,
)
from volt.data.downloads import DataNotFoundError
from volt.data.image_transform import ImageTransform

PER_BATCH, N_TEST = 4, 10  # 5 training batches of 4 images: 20 training images in all
N_TRAIN = PER_BATCH * len(TRAIN_FILES)
TOP_ROW, LEFT_COLUMN = 250, 251
LABEL_NAMES = [b"airplane", b"automobile", b"bird", b"cat", b"deer"]
LABEL_NAMES += [b"dog", b"frog", b"horse", b"ship", b"truck"]


def base_value(index: int, train: bool) -> int:
    """Channel c of image `index` is filled with base + c; training images < 160 <= test."""
    return 8 * index + (0 if train else 160)


def image(index: int, train: bool) -> np.ndarray:
    """(3, 32, 32) uint8: a flat value per channel, a top row and a left column to catch a
    transpose or a flip."""
    pixels = np.empty((3, 32, 32), dtype=np.uint8)
    for c in range(3):
        pixels[c] = base_value(index, train) + c
    pixels[:, 0, :] = TOP_ROW
    pixels[:, :, 0] = LEFT_COLUMN
    return pixels


def write_batch(path: Path, indices: range, train: bool) -> None:
    # The "python version" row: 1024 red, then 1024 green, then 1024 blue values, each row-major.
    data = np.stack([np.concatenate([c.ravel() for c in image(i, train)]) for i in indices])
    batch = {
        b"batch_label": path.name.encode(),
        b"labels": [i % 10 for i in indices],
        b"data": data,
        b"filenames": [f"{i}.png".encode() for i in indices],
    }
    path.write_bytes(pickle.dumps(batch, protocol=2))


@pytest.fixture
def cifar_root(tmp_path: Path) -> Path:
    folder = tmp_path / FOLDER
    folder.mkdir()
    for b, name in enumerate(TRAIN_FILES):
        write_batch(folder / name, range(b * PER_BATCH, (b + 1) * PER_BATCH), train=True)
    write_batch(folder / TEST_FILE, range(N_TEST), train=False)
    meta = {b"num_cases_per_batch": PER_BATCH, b"label_names": LABEL_NAMES, b"num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return tmp_path


def cifar(root: Path, augment: bool = False, download: bool = False) -> CIFAR10DataModule:
    return CIFAR10DataModule(
        root=root, download=download, augment=augment, batch_size=4, val_fraction=0.2
    )


def pixel_values(x: Tensor) -> Tensor:
    """Undo the normalisation: (..., 3, 32, 32) floats back to the 0..255 values in the file."""
    mean = torch.tensor(MEAN).view(3, 1, 1)
    std = torch.tensor(STD).view(3, 1, 1)
    return (x * std + mean) * 255


def index_of(x: Tensor, label: int, train: bool) -> int:
    """Check one de-augmented sample (3, 32, 32) against its pattern; return its index."""
    values = pixel_values(x).round().to(torch.int64)
    index = (values[0, 5, 5].item() - base_value(0, train)) // 8
    assert torch.equal(values, torch.from_numpy(image(index, train)).to(torch.int64))
    assert label == index % 10
    return index


def test_loaders_serve_the_files_normalised(cifar_root: Path) -> None:
    dm = cifar(cifar_root)
    dm.prepare_data()
    dm.setup("fit")

    seen: dict[str, list[int]] = {}
    for name, loader, train in [
        ("train", dm.train_dataloader(), True),
        ("val", dm.val_dataloader(), True),
        ("test", dm.test_dataloader(), False),
    ]:
        seen[name] = []
        for x, y in loader:
            assert x.shape == (len(y), 3, 32, 32)
            assert x.dtype == torch.float32
            assert y.dtype == torch.long
            seen[name] += [index_of(xi, yi, train) for xi, yi in zip(x, y.tolist(), strict=True)]

    # 4 of the 20 training images held out for validation, 16 = 4 full batches left
    assert len(seen["val"]) == 4
    assert sorted(seen["train"] + seen["val"]) == list(range(N_TRAIN))
    assert sorted(seen["test"]) == list(range(N_TEST))


def read(dm: CIFAR10DataModule, split: str, index: int, seed: int) -> Tensor:
    """Image `index` of a split as its batches serve it, random numbers seeded by `seed`."""
    stored = getattr(dm, f"{split}_set").images[index : index + 1]
    return dm.transform(train=split == "train")(stored, torch.Generator().manual_seed(seed))[0]


def test_augmentation_changes_only_training_images(cifar_root: Path) -> None:
    dm = cifar(cifar_root, augment=True)
    dm.setup()

    train = [read(dm, "train", 0, seed) for seed in range(8)]
    assert any(not torch.equal(train[0], other) for other in train[1:])
    for split in ("val", "test"):
        assert torch.equal(read(dm, split, 0, seed=0), read(dm, split, 0, seed=1))

    # an augmented item is still a crop of the stored image, padded with zeros, maybe flipped
    assert dm.train_set is not None
    stored = dm.train_set.images[0]
    for x in train:
        assert x.shape == (3, 32, 32)
        crop_and_flip(stored, pixel_values(x).round().to(torch.uint8))


def test_augment_false_leaves_training_images_as_stored(cifar_root: Path) -> None:
    dm = cifar(cifar_root, augment=False)
    dm.setup()
    assert torch.equal(read(dm, "train", 0, seed=0), read(dm, "train", 0, seed=1))


def crop_and_flip(image: Tensor, out: Tensor) -> tuple[int, int, bool]:
    """The (top, left, flipped) for which `out` is a 32x32 window of `image` padded by 4."""
    padded = torch.nn.functional.pad(image, (4, 4, 4, 4))
    for top in range(9):
        for left in range(9):
            window = padded[:, top : top + 32, left : left + 32]
            for flipped in (False, True):
                if torch.equal(out, window.flip(-1) if flipped else window):
                    return top, left, flipped
    raise AssertionError("the output is not a 32x32 crop of the input padded by 4, nor its mirror")


def test_batch_crop_and_flip_draws_a_padded_crop_per_image() -> None:
    # no zero pixels in the input, so a zero in the output can only be padding
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(1, 256, (40, 3, 32, 32), dtype=torch.uint8, generator=generator)
    transform = ImageTransform(MEAN, STD, crop_padding=4, flip=True)
    draws = transform.draw(generator, len(images), images.device)
    assert draws is not None
    outs = transform.crop_and_flip(images, *draws)
    assert outs.shape == images.shape and outs.dtype == torch.uint8
    choices = [crop_and_flip(image, out) for image, out in zip(images, outs, strict=True)]
    assert {flipped for _, _, flipped in choices} == {False, True}
    assert len({(top, left) for top, left, _ in choices}) > 10
    assert (outs == 0).any()


def test_existing_files_are_not_downloaded_again(
    cifar_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def must_not_download(*args: object, **kwargs: object) -> None:
        raise AssertionError("files are on disk; nothing should be downloaded")

    monkeypatch.setattr(
        torchvision.datasets.cifar, "download_and_extract_archive", must_not_download
    )
    dm = cifar(cifar_root, download=True)
    dm.prepare_data()
    dm.setup()
    assert dm.test_set is not None and len(dm.test_set) == N_TEST  # type: ignore[arg-type]


def test_missing_files_without_download_say_what_to_put_where(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError) as error:
        cifar(tmp_path).prepare_data()
    message = str(error.value)
    assert f"data.root={tmp_path}" in message
    assert all(name in message for name in (*TRAIN_FILES, TEST_FILE))
    assert str(tmp_path / FOLDER) in message
    assert "data.download=true" in message


def test_one_missing_batch_is_reported_by_setup(cifar_root: Path) -> None:
    (cifar_root / FOLDER / "data_batch_3").unlink()
    with pytest.raises(DataNotFoundError, match="data_batch_3"):
        cifar(cifar_root).setup()


def test_failed_download_says_so_and_what_to_do_offline(
    tmp_path: Path, failing_download: Callable[[ModuleType], list[str]]
) -> None:
    urls = failing_download(torchvision.datasets.cifar)
    with pytest.raises(DataNotFoundError) as error:
        cifar(tmp_path, download=True).prepare_data()
    message = str(error.value)
    assert len(urls) == 1 and urls[0].endswith("cifar-10-python.tar.gz")  # tried, once
    assert "download failed" in message
    assert "URLError" in message
    assert f"data.root={tmp_path}" in message
    assert all(name in message for name in (*TRAIN_FILES, TEST_FILE))
    assert str(tmp_path / FOLDER) in message
    assert "network access" in message
