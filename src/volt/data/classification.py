"""What every volt image data set shares: a seeded split, in-memory tensors, and their batches."""

from typing import Any, Literal

import torch
from torch import Tensor

from volt.data.batches import (
    AUTO_SHARE,
    BatchOrder,
    HostLoading,
    ImageBatches,
    Split,
)
from volt.data.image_transform import ImageTransform
from volt.data.resumable import ResumableDataModule

OnDevice = Literal["auto"] | bool


class ImageClassificationDataModule(ResumableDataModule):
    """Base for volt's image data sets: subclasses load tensors, this class splits and serves them.

    `batch_size` is global: under DDP each of N processes trains on batch_size / N samples of each
    global batch, so a run means the same thing on one GPU or eight (see `volt.data.batches`).

    `on_device`: true keeps every split on the training device in its stored dtype and draws,
    augments and normalises whole batches there (no DataLoader, no worker processes); false keeps
    them in host memory and a DataLoader gathers whole batches (`num_workers`, `pin_memory`, ...
    apply), copied to the GPU one batch ahead; auto: on the device when training on a GPU and the
    splits take at most `AUTO_SHARE` of its free memory.
    """

    input_shape: tuple[int, int, int]  # (C, H, W), known before any file is read
    num_classes: int

    def __init__(
        self,
        batch_size: int,
        num_workers: int = 0,
        pin_memory: bool | None = None,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        val_fraction: float = 0.1,
        split_seed: int = 1234,
        drop_last: bool = True,
        on_device: OnDevice = "auto",
    ) -> None:
        super().__init__()
        if not 0 < val_fraction < 1:
            raise ValueError(
                f"data.val_fraction={val_fraction} must be between 0 and 1, "
                "e.g. data.val_fraction=0.1"
            )
        if not (on_device == "auto" or isinstance(on_device, bool)):
            raise ValueError(
                f"data.on_device={on_device!r} must be auto, true or false; "
                "e.g. data.on_device=auto"
            )
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.prefetch_factor = prefetch_factor
        self.val_fraction = val_fraction
        self.split_seed = split_seed
        self.drop_last = drop_last
        self.on_device = on_device
        self.train_set: Split | None = None
        self.val_set: Split | None = None
        self.test_set: Split | None = None
        self._held: dict[tuple[str, torch.device], Split] = {}  # splits copied to a device
        self._auto: dict[torch.device, bool] = {}  # on_device=auto's answer per device

    def load_splits(
        self,
    ) -> tuple[tuple[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]:
        """(train_x, train_y, val_x, val_y), (test_x, test_y) as tensors; images (N, C, H, W),
        uint8 (scaled to [0, 1] by the transform) or float."""
        raise NotImplementedError

    def transform(self, train: bool) -> ImageTransform:
        """Augmentation (training only) and normalisation of whole batches, on their device."""
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        (train_x, train_y, val_x, val_y), (test_x, test_y) = self.load_splits()
        self.train_set = Split(train_x, train_y.long())
        self.val_set = Split(val_x, val_y.long())
        self.test_set = Split(test_x, test_y.long())

    def split_off(
        self, images: Tensor, labels: Tensor, fraction: float
    ) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        """Seeded split: (the rest, the fraction). Same split on every run and every rank."""
        generator = torch.Generator().manual_seed(self.split_seed)
        order = torch.randperm(len(labels), generator=generator)
        cut = round(len(labels) * fraction)
        rest, part = order[cut:], order[:cut]
        return (images[rest], labels[rest]), (images[part], labels[part])

    def train_dataloader(self) -> ImageBatches:
        assert self.train_set is not None, "call setup() first"
        # Overfitting a few batches (debug=overfit) wants the same batches every epoch.
        trainer: Any = self.trainer  # overfit_batches is set on it at run time, untyped
        shuffle = trainer is None or not trainer.overfit_batches
        batches = self._batches("train", self.train_set, shuffle, self.drop_last, train=True)
        if at := self.take_resume_point():
            batches.order.resume_at(at["epoch"], at["batches_done"])
        return batches

    def val_dataloader(self) -> ImageBatches:
        assert self.val_set is not None, "call setup() first"
        return self._batches("val", self.val_set, shuffle=False, drop_last=False, train=False)

    def test_dataloader(self) -> ImageBatches:
        assert self.test_set is not None, "call setup() first"
        return self._batches("test", self.test_set, shuffle=False, drop_last=False, train=False)

    def predict_dataloader(self) -> ImageBatches:
        return self.test_dataloader()

    def _device(self) -> torch.device:
        if self.trainer is None:
            return torch.device("cpu")
        return self.trainer.strategy.root_device

    def _epoch(self) -> int:
        return self.trainer.current_epoch if self.trainer is not None else 0

    def _rank(self) -> int:
        return self.trainer.global_rank if self.trainer is not None else 0

    def _batches(
        self, name: str, split: Split, shuffle: bool, drop_last: bool, train: bool
    ) -> ImageBatches:
        device = self._device()
        # Seeded from torch's seed (seed_everything), so `seed=` changes the shuffle and the
        # augmentation too; a pure function of it, so a resumed run draws the same batches.
        order = BatchOrder(
            len(split),
            self.per_process_batch_size,
            seed=torch.initial_seed() % 2**31,
            shuffle=shuffle,
            drop_last=drop_last,
            rank=self._rank(),
            world=self.trainer.world_size if self.trainer is not None else 1,
        )
        if self._keep_on(device):
            if (name, device) not in self._held:
                self._held[name, device] = split.to(device)
            held = self._held[name, device]
            return ImageBatches(held, order, self.transform(train), device, epoch=self._epoch)
        loading = HostLoading(
            num_workers=self.num_workers,
            # Pinned host memory lets the host-to-GPU copy run asynchronously, beside the step.
            pin_memory=device.type == "cuda" if self.pin_memory is None else self.pin_memory,
            persistent_workers=self.persistent_workers,
            prefetch_factor=self.prefetch_factor,
        )
        return ImageBatches(split, order, self.transform(train), device, loading, self._epoch)

    def _keep_on(self, device: torch.device) -> bool:
        if self.on_device != "auto":
            return bool(self.on_device)
        if device not in self._auto:  # decided once: the first split held would shrink `free`
            stored = sum(s.nbytes for s in (self.train_set, self.val_set, self.test_set) if s)
            free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 0
            self._auto[device] = 0 < stored <= AUTO_SHARE * free
        return self._auto[device]
