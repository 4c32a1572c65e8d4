"""MNIST through torchvision: 60,000 + 10,000 handwritten digits, 28x28."""

from pathlib import Path
from typing import Any

from torch import Tensor

from volt.data.classification import ImageClassificationDataModule
from volt.data.downloads import ensure_files
from volt.data.image_transform import ImageTransform

RAW_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
MEAN, STD = (0.1307,), (0.3081,)


class MNISTDataModule(ImageClassificationDataModule):
    input_shape = (1, 28, 28)
    num_classes = 10

    def __init__(self, *, root: str | Path, download: bool = True, **loader_and_split: Any) -> None:
        super().__init__(**loader_and_split)
        self.root = Path(root)
        self.download = download

    def prepare_data(self) -> None:
        # Called on one process per node before setup(): the one place that downloads.
        from torchvision.datasets import MNIST

        ensure_files(
            "MNIST",
            self.root,
            self.root / "MNIST" / "raw",
            RAW_FILES,
            self.download,
            lambda: [MNIST(self.root, train=t, download=True) for t in (True, False)],
        )

    def load_splits(
        self,
    ) -> tuple[tuple[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]:
        from torchvision.datasets import MNIST

        self.prepare_data()  # a clear error, not torchvision's, if setup() runs without the files
        train, test = (MNIST(self.root, train=t, download=False) for t in (True, False))
        # torchvision keeps MNIST as uint8 (N, 28, 28); add the channel axis
        (train_x, train_y), (val_x, val_y) = self.split_off(
            train.data.unsqueeze(1), train.targets, self.val_fraction
        )
        return (train_x, train_y, val_x, val_y), (test.data.unsqueeze(1), test.targets)

    def transform(self, train: bool) -> ImageTransform:
        return ImageTransform(MEAN, STD)
