import struct
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
import torchvision.datasets.mnist
from torch import Tensor

from volt.data.downloads import DataNotFoundError
from volt.data.mnist import MEAN, RAW_FILES, STD, MNISTDataModule

N_TRAIN, N_TEST = 40, 20
TOP_ROW = 255


def base_value(index: int, train: bool) -> int:
    """Image `index` is filled with this value; training images < 120 <= test images."""
    return 3 * index + (0 if train else 120)


def pattern(n: int, train: bool) -> np.ndarray:
    """(n, 28, 28) uint8: each image one flat value, with a bright top row to catch a transpose."""
    images = np.empty((n, 28, 28), dtype=np.uint8)
    for i in range(n):
        images[i] = base_value(i, train)
        images[i, 0, :] = TOP_ROW
    return images


def write_idx(raw: Path, prefix: str, images: np.ndarray, labels: np.ndarray) -> None:
    # IDX: big-endian int32 magic (2051 images / 2049 labels), then the dimensions, then uint8s
    n, rows, cols = images.shape
    (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
        struct.pack(">iiii", 2051, n, rows, cols) + images.tobytes()
    )
    (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(
        struct.pack(">ii", 2049, n) + labels.astype(np.uint8).tobytes()
    )


@pytest.fixture
def mnist_root(tmp_path: Path) -> Path:
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    write_idx(raw, "train", pattern(N_TRAIN, True), np.arange(N_TRAIN) % 10)
    write_idx(raw, "t10k", pattern(N_TEST, False), np.arange(N_TEST) % 10)
    return tmp_path


def mnist(root: Path, download: bool = False) -> MNISTDataModule:
    return MNISTDataModule(root=root, download=download, batch_size=8, val_fraction=0.1)


def pixel_values(x: Tensor) -> Tensor:
    """Undo the normalisation: (B, 1, 28, 28) floats back to the 0..255 values in the file."""
    return (x * STD[0] + MEAN[0]) * 255


def check_batch(x: Tensor, y: Tensor, train: bool) -> list[int]:
    """Check every sample against the pattern it was written with; return the images' indices."""
    assert x.shape == (len(y), 1, 28, 28)
    assert x.dtype == torch.float32
    assert y.dtype == torch.long
    values = pixel_values(x)
    assert torch.allclose(
        values[:, :, 0, :], torch.full_like(values[:, :, 0, :], TOP_ROW), atol=1e-3
    )
    indices = []
    for image, label in zip(values, y.tolist(), strict=True):
        body = image[0, 1:, :]
        assert torch.allclose(body, body[0, 0].expand_as(body), atol=1e-3)  # one flat value
        index = (round(body[0, 0].item()) - base_value(0, train)) // 3
        assert round(body[0, 0].item()) == base_value(index, train)
        assert label == index % 10
        indices.append(index)
    return indices


def test_loaders_serve_the_files_normalised(mnist_root: Path) -> None:
    dm = mnist(mnist_root)
    dm.prepare_data()
    dm.setup("fit")

    first = next(iter(dm.train_dataloader()))[0][0]
    assert first[0, 0, 0].item() == pytest.approx((1.0 - MEAN[0]) / STD[0])  # 255 -> 1 -> z-score

    train = [i for x, y in dm.train_dataloader() for i in check_batch(x, y, train=True)]
    val = [i for x, y in dm.val_dataloader() for i in check_batch(x, y, train=True)]
    test = [i for x, y in dm.test_dataloader() for i in check_batch(x, y, train=False)]

    # 4 of 40 held out for validation; the 36 left make 4 full training batches of 8
    assert len(train) == 32
    assert len(val) == 4
    assert sorted(test) == list(range(N_TEST))
    assert not set(train) & set(val)
    assert len(set(train)) == len(train)
    assert dm.train_set is not None
    held = (dm.train_set.images[:, 0, 5, 5].long() // 3).tolist()  # raw uint8 value is 3 * index
    assert sorted(held + val) == list(range(N_TRAIN))
    assert set(train) <= set(held)


def test_existing_files_are_not_downloaded_again(
    mnist_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def must_not_download(*args: object, **kwargs: object) -> None:
        raise AssertionError("files are on disk; nothing should be downloaded")

    monkeypatch.setattr(
        torchvision.datasets.mnist, "download_and_extract_archive", must_not_download
    )
    dm = mnist(mnist_root, download=True)
    dm.prepare_data()
    dm.setup()
    assert dm.test_set is not None and len(dm.test_set) == N_TEST


def test_missing_files_without_download_say_what_to_put_where(tmp_path: Path) -> None:
    dm = mnist(tmp_path, download=False)
    with pytest.raises(DataNotFoundError) as error:
        dm.prepare_data()
    message = str(error.value)
    assert f"data.root={tmp_path}" in message
    assert all(name in message for name in RAW_FILES)
    assert str(tmp_path / "MNIST" / "raw") in message
    assert "data.download=true" in message
    assert isinstance(error.value, FileNotFoundError)


def test_setup_without_prepare_data_gives_the_same_clear_error(mnist_root: Path) -> None:
    (mnist_root / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataNotFoundError, match="t10k-labels-idx1-ubyte"):
        mnist(mnist_root).setup()


def test_failed_download_says_so_and_what_to_do_offline(
    tmp_path: Path, failing_download: Callable[[ModuleType], list[str]]
) -> None:
    # Fail where torchvision fetches each file, so its real download loop over mirrors runs.
    urls = failing_download(torchvision.datasets.mnist)
    dm = mnist(tmp_path, download=True)
    with pytest.raises(DataNotFoundError) as error:
        dm.prepare_data()
    message = str(error.value)
    assert urls, "the download was never attempted"
    assert "download failed" in message
    assert f"data.root={tmp_path}" in message
    assert all(name in message for name in RAW_FILES)
    assert str(tmp_path / "MNIST" / "raw") in message
    assert "network access" in message
    assert isinstance(error.value.__cause__, RuntimeError)  # torchvision's "Error downloading"
