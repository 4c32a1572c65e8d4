"""scikit-learn's bundled 8x8 handwritten digits: 1,797 images, no download."""

from typing import Any

import torch
from sklearn.datasets import load_digits
from torch import Tensor

from volt.data.classification import ImageClassificationDataModule
from volt.data.image_transform import ImageTransform


class DigitsDataModule(ImageClassificationDataModule):
    input_shape = (1, 8, 8)
    num_classes = 10

    def __init__(self, *, test_fraction: float = 0.15, **loader_and_split: Any) -> None:
        super().__init__(**loader_and_split)
        if not 0 < test_fraction < 1 or self.val_fraction + test_fraction >= 1:
            raise ValueError(
                f"data.val_fraction={self.val_fraction} and data.test_fraction={test_fraction} "
                "leave no training data; keep both above 0 with a sum below 1, "
                "e.g. data.val_fraction=0.15 data.test_fraction=0.15"
            )
        self.test_fraction = test_fraction
        self._stats: tuple[tuple[float], tuple[float]] = ((0.0,), (1.0,))

    def load_splits(
        self,
    ) -> tuple[tuple[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]:
        digits = load_digits()
        # pixel values are counts 0..16 of an 8x8 grid; (N, 64) -> (N, 1, 8, 8)
        images = torch.as_tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
        labels = torch.as_tensor(digits.target, dtype=torch.long)
        (rest_x, rest_y), (test_x, test_y) = self.split_off(images, labels, self.test_fraction)
        val_share = self.val_fraction / (1.0 - self.test_fraction)
        (train_x, train_y), (val_x, val_y) = self.split_off(rest_x, rest_y, val_share)
        # normalise with training-split statistics only
        self._stats = ((train_x.mean().item(),), (train_x.std().item(),))
        return (train_x, train_y, val_x, val_y), (test_x, test_y)

    def transform(self, train: bool) -> ImageTransform:
        mean, std = self._stats
        return ImageTransform(mean, std)
