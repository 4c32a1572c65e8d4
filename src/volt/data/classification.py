"""What every volt data set shares: a seeded split, in-memory tensors, and loader settings."""

from collections.abc import Callable, Iterator
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

Transform = Callable[[Tensor], Tensor]


class TensorImageDataset(Dataset[tuple[Tensor, Tensor]]):
    """Images held as one tensor (N, C, H, W); uint8 images are scaled to [0, 1] per item."""

    def __init__(
        self,
        images: Tensor,
        labels: Tensor,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        augment: Transform | None = None,
    ) -> None:
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images = images
        self.labels = labels.long()
        # (C, 1, 1) so they broadcast over one (C, H, W) image
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
        self.augment = augment

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        image = self.images[index]
        if self.augment is not None:
            image = self.augment(image)
        image = image.float() / 255.0 if image.dtype == torch.uint8 else image.float()
        return (image - self.mean) / self.std, self.labels[index]


class ResumableRandomSampler(Sampler[int]):
    """A fresh shuffle each epoch, a pure function of (seed, epoch), that can start part-way.

    Lightning calls set_epoch() before each epoch; after a resume the first epoch skips the
    samples the killed run had already trained on, so the resumed run sees the same batches in
    the same order as one that was never stopped.
    """

    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        self.seed = seed
        self.epoch = 0
        self.skip: dict[int, int] = {}  # epoch -> samples already consumed in it

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        order = torch.randperm(self.size, generator=generator)
        return iter(order[self.skip.pop(self.epoch, 0) :].tolist())

    def __len__(self) -> int:
        return self.size


class ImageClassificationDataModule(pl.LightningDataModule):
    """Base for volt's image data sets: subclasses load tensors, this class splits and serves them.

    `batch_size` is global: under DDP each of N processes loads batch_size / N samples, so a run
    means the same thing on one GPU or eight.
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
    ) -> None:
        super().__init__()
        if not 0 < val_fraction < 1:
            raise ValueError(
                f"data.val_fraction={val_fraction} must be between 0 and 1, "
                "e.g. data.val_fraction=0.1"
            )
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.prefetch_factor = prefetch_factor
        self.val_fraction = val_fraction
        self.split_seed = split_seed
        self.drop_last = drop_last
        self.train_set: Dataset[tuple[Tensor, Tensor]] | None = None
        self.val_set: Dataset[tuple[Tensor, Tensor]] | None = None
        self.test_set: Dataset[tuple[Tensor, Tensor]] | None = None
        self._resume_at: dict[str, int] | None = None

    def load_splits(
        self,
    ) -> tuple[tuple[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]:
        """(train_x, train_y, val_x, val_y), (test_x, test_y) as tensors; images (N, C, H, W)."""
        raise NotImplementedError

    def make_dataset(
        self, images: Tensor, labels: Tensor, train: bool
    ) -> Dataset[tuple[Tensor, Tensor]]:
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        (train_x, train_y, val_x, val_y), (test_x, test_y) = self.load_splits()
        self.train_set = self.make_dataset(train_x, train_y, train=True)
        self.val_set = self.make_dataset(val_x, val_y, train=False)
        self.test_set = self.make_dataset(test_x, test_y, train=False)

    def split_off(
        self, images: Tensor, labels: Tensor, fraction: float
    ) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        """Seeded split: (the rest, the fraction). Same split on every run and every rank."""
        generator = torch.Generator().manual_seed(self.split_seed)
        order = torch.randperm(len(labels), generator=generator)
        cut = round(len(labels) * fraction)
        rest, part = order[cut:], order[:cut]
        return (images[rest], labels[rest]), (images[part], labels[part])

    @property
    def per_process_batch_size(self) -> int:
        processes = self.trainer.world_size if self.trainer is not None else 1
        if self.batch_size % processes:
            fixed = max(processes, self.batch_size // processes * processes)
            raise ValueError(
                f"data.batch_size={self.batch_size} does not divide over {processes} processes; "
                f"use a multiple of {processes}, e.g. data.batch_size={fixed}"
            )
        return self.batch_size // processes

    def state_dict(self) -> dict[str, Any]:
        """Where training stands in the data (saved in checkpoints): epoch and batches done."""
        if self.trainer is None:
            return {}
        # `processed` counts the batches whose step ran, the one being saved after included.
        progress = self.trainer.fit_loop.epoch_loop.batch_progress.current
        done = progress.processed  # type: ignore[attr-defined]  # a _ProcessedTracker at run time
        return {"epoch": self.trainer.current_epoch, "batches_done": done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume_at = state or None

    def train_dataloader(self) -> DataLoader[tuple[Tensor, Tensor]]:
        assert self.train_set is not None, "call setup() first"
        # Seeded from torch's seed (seed_everything), so `seed=` changes the shuffle too.
        sampler = ResumableRandomSampler(len(self.train_set), seed=torch.initial_seed() % 2**31)  # type: ignore[arg-type]
        # Under DDP Lightning wraps this sampler in a distributed one that needs its full length:
        # there the resumed epoch starts over (documented), on one process it continues exactly.
        if self._resume_at and (self.trainer is None or self.trainer.world_size == 1):
            done = self._resume_at["batches_done"] * self.per_process_batch_size
            sampler.skip[self._resume_at["epoch"]] = done
        self._resume_at = None
        return self._loader(self.train_set, train=True, sampler=sampler)

    def val_dataloader(self) -> DataLoader[tuple[Tensor, Tensor]]:
        assert self.val_set is not None, "call setup() first"
        return self._loader(self.val_set, train=False)

    def test_dataloader(self) -> DataLoader[tuple[Tensor, Tensor]]:
        assert self.test_set is not None, "call setup() first"
        return self._loader(self.test_set, train=False)

    def predict_dataloader(self) -> DataLoader[tuple[Tensor, Tensor]]:
        return self.test_dataloader()

    def _on_gpu(self) -> bool:
        return self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"

    def _loader(
        self,
        dataset: Dataset[tuple[Tensor, Tensor]],
        train: bool,
        sampler: Sampler[int] | None = None,
    ) -> DataLoader[tuple[Tensor, Tensor]]:
        batch_size = self.per_process_batch_size
        workers = self.num_workers > 0
        # Dropping the last partial training batch keeps every step the same shape, which
        # torch.compile and CUDA graphs need; a fresh shuffle each epoch still visits every sample.
        # Compared with the global batch: each rank sees only its share of the data set.
        drop_last = train and self.drop_last and len(dataset) >= self.batch_size  # type: ignore[arg-type]
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            drop_last=drop_last,
            num_workers=self.num_workers,
            # Pinned host memory lets the host-to-GPU copy run asynchronously (non_blocking).
            pin_memory=self._on_gpu() if self.pin_memory is None else self.pin_memory,
            persistent_workers=self.persistent_workers and workers,
            # Its own generator: starting an iterator draws a seed, and drawing it from the global
            # one would shift dropout's random numbers whenever a loader is (re)started.
            generator=torch.Generator().manual_seed(torch.initial_seed() % 2**31),
            prefetch_factor=self.prefetch_factor if workers else None,
        )
