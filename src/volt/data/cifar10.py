"""CIFAR-10: 50,000 + 10,000 colour images, 32x32, ten classes."""

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from volt.data.classification import ImageClassificationDataModule
from volt.data.downloads import ensure_files
from volt.data.image_transform import ImageTransform

FOLDER = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def read_batches(folder: Path, names: tuple[str, ...]) -> tuple[Tensor, Tensor]:
    """Images (N, 3, 32, 32) uint8 and labels (N,) from the "python version" batch files."""
    images, labels = [], []
    for name in names:
        with open(folder / name, "rb") as f:
            # The official format is a pickled dict; read only files you downloaded yourself.
            batch = pickle.load(f, encoding="bytes")
        images.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
        labels.extend(batch[b"labels"])
    return torch.from_numpy(np.concatenate(images)), torch.tensor(labels, dtype=torch.long)


class CIFAR10DataModule(ImageClassificationDataModule):
    input_shape = (3, 32, 32)
    num_classes = 10

    def __init__(
        self,
        *,
        root: str | Path,
        download: bool = True,
        augment: bool = True,
        **loader_and_split: Any,
    ) -> None:
        super().__init__(**loader_and_split)
        self.root = Path(root)
        self.download = download
        self.augment = augment

    def prepare_data(self) -> None:
        from torchvision.datasets import CIFAR10

        ensure_files(
            "CIFAR-10",
            self.root,
            self.root / FOLDER,
            (*TRAIN_FILES, TEST_FILE),
            self.download,
            lambda: CIFAR10(self.root, train=True, download=True),
        )

    def load_splits(
        self,
    ) -> tuple[tuple[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]:
        self.prepare_data()
        folder = self.root / FOLDER
        train_x, train_y = read_batches(folder, TRAIN_FILES)
        (train_x, train_y), (val_x, val_y) = self.split_off(train_x, train_y, self.val_fraction)
        return (train_x, train_y, val_x, val_y), read_batches(folder, (TEST_FILE,))

    def transform(self, train: bool) -> ImageTransform:
        # The standard CIFAR augmentation: pad 4, crop 32 at random, mirror half the images.
        augment = train and self.augment
        return ImageTransform(MEAN, STD, crop_padding=4 if augment else 0, flip=augment)
