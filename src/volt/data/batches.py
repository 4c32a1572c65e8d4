"""Batches of in-memory image tensors, drawn as whole batches and prepared on the training device.

Two parts, each in one place, with the augmentation in `volt.data.image_transform`:

- `BatchOrder`: which samples each step draws on each process, a pure function of (seed, epoch,
  step). One epoch is a shuffle of the split; step k's global batch is the k-th run of
  `batch_size * world` samples in it, and rank r trains on the r-th part of that batch. So the
  global batches are the same on one process or eight, and a run resumed mid-epoch (on any number
  of processes) goes on with exactly the batches it would have drawn.
- `ImageBatches`: the iterable a data module hands Lightning. The split's stored tensors (uint8
  images stay uint8) are either held on the training device and indexed there (`on_device`), or
  held on the host, gathered by a DataLoader (a whole batch per fetch, no per-sample Python) and
  copied to the GPU on a side stream one batch ahead, so that the copy overlaps the step before.
  Augmentation (`ImageTransform`) draws its random numbers seeded by (seed, epoch, rank, and the
  first step of a run of `ImageBatches.steps_at_once` steps): both paths produce the same batches,
  bit for bit. The device path prepares a run's batches in one go, as what that costs the host is
  per preparation, not per image.
"""

import contextlib
import functools
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from volt.data.image_transform import ImageTransform
from volt.data.workers import signal_proof_workers

StoredBatch = tuple[int, Tensor, Tensor]  # (step in the epoch, images as stored, labels)

# data.on_device=auto keeps a data set on the GPU when all its splits take at most this share of
# the GPU's free memory: CIFAR-10 as uint8 (184 MB) passes on any training GPU, ImageNet does not.
AUTO_SHARE = 0.25
# The device path prepares the batches of several steps at once, up to this many bytes of them.
STEPS_AT_ONCE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Split:
    """One split of an image data set as stored: images (N, C, H, W), labels (N,)."""

    images: Tensor
    labels: Tensor

    def __post_init__(self) -> None:
        if len(self.images) != len(self.labels):
            raise ValueError(f"{len(self.images)} images but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def nbytes(self) -> int:
        return self.images.nbytes + self.labels.nbytes

    def to(self, device: torch.device) -> "Split":
        return Split(self.images.to(device), self.labels.to(device))

    def __getitem__(self, step_and_indices: tuple[int, Tensor]) -> "StoredBatch":
        """A whole batch at once: what the DataLoader fetches for one step (see BatchOrder)."""
        step, indices = step_and_indices
        return step, self.images[indices], self.labels[indices]


@contextlib.contextmanager
def _one_cpu_thread() -> Iterator[None]:
    """torch's CPU ops on the calling thread without its other threads, until the block ends."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def shuffle_seed(seed: int, epoch: int) -> int:
    return seed * 100_003 + epoch


class BatchOrder:
    """The samples each step draws on process `rank` of `world`; iterating yields
    (step in the epoch, this process's sample indices) for the current epoch.

    Training shuffles and drops the last partial global batch (`drop_last`, unless the split is
    smaller than one batch); evaluation keeps the order and every sample, repeating the first few
    to give each process the same number (as torch's DistributedSampler does). Lightning calls
    `set_epoch` before each epoch; `resume_at` skips the steps a killed run had already trained.
    """

    def __init__(
        self,
        size: int,
        batch_size: int,
        *,
        seed: int,
        shuffle: bool,
        drop_last: bool,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        self.size, self.batch_size = size, batch_size
        self.seed, self.shuffle, self.rank, self.world = seed, shuffle, rank, world
        self.global_batch = batch_size * world
        self.drop_last = drop_last and size >= self.global_batch
        self.epoch = 0
        self._skip: dict[int, int] = {}  # epoch -> steps already trained in it
        # The host side of each epoch's copy of the order to a GPU, kept for the run (see `on`),
        # and the event after which the last copy out of it is done.
        self._pinned: Tensor | None = None
        self._copied: torch.cuda.Event | None = None

    def __getstate__(self) -> dict[str, Any]:
        # A copy (pickled, deep-copied) makes its own buffer: a CUDA event cannot be pickled.
        return {**self.__dict__, "_pinned": None, "_copied": None}

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume_at(self, epoch: int, steps_done: int) -> None:
        self._skip[epoch] = steps_done

    def _epoch_order(self, into: Tensor | None = None) -> Tensor:
        """The epoch's order (into `into`, (size,) int64, where given). Callers make it inside
        `_one_cpu_thread()`.

        torch splits the shuffle's first pass over an epoch's indices, and any copy of them, over
        its CPU threads (OpenMP) once there are more than 32,768, and waking threads that have
        slept through an epoch costs milliseconds. The shuffle took 4 to 9 ms at each epoch's
        start inside training on an H200's host against 0.4 ms in a loop of its own there
        (torch.profiler, CIFAR-10's 45,000 indices, torch 2.11, 2026-11-29). On the 2-core CPU,
        5 ms apart: 1.5 ms on two threads and 0.23 ms on one with the cores idle, 10.9 and 0.24
        ms with both kept busy (torch 2.14, medians of 30)."""
        if self.shuffle:
            generator = torch.Generator().manual_seed(shuffle_seed(self.seed, self.epoch))
            order = torch.randperm(self.size, generator=generator, out=into)
        else:
            order = torch.arange(self.size, out=into)
        if self.drop_last:
            return order[: self.size // self.global_batch * self.global_batch]
        short = -self.size % self.world
        return torch.cat([order, order[:short]]) if short else order

    def __len__(self) -> int:
        """Steps in a whole epoch, the same on every process."""
        if self.drop_last:
            return self.size // self.global_batch
        padded = self.size + (-self.size % self.world)
        return -(-padded // self.global_batch)

    def __iter__(self) -> Iterator[tuple[int, Tensor]]:
        return self.on(torch.device("cpu"))

    def _order_on_gpu(self, device: torch.device) -> Tensor:
        """The epoch's order on `device`, shuffled into one pinned buffer kept for the run and
        copied from there without waiting for the GPU. Pinning a fresh copy each epoch (a
        parallel copy on the CPU, see `_epoch_order`) made each epoch's first step about 8 ms
        slower (5 to 13 ms by side and run) on an H200's host (CUDA-graphs ResNet, one host, two
        runs each way, torch 2.11, 2026-11-29)."""
        if self._pinned is None or self._copied is None:
            self._pinned = torch.empty(self.size, dtype=torch.long, pin_memory=True)
            self._copied = torch.cuda.Event()
        else:
            self._copied.synchronize()  # the last copy out of it (an epoch ago) is done
        with _one_cpu_thread():
            order = self._epoch_order(into=self._pinned)
            if not order.is_pinned():  # padded for several ranks (drop_last off): a new tensor
                order = order.pin_memory()
        on_gpu = order.to(device, non_blocking=True)
        self._copied.record(torch.cuda.current_stream(device))
        return on_gpu

    def on(self, device: torch.device) -> Iterator[tuple[int, Tensor]]:
        """As iterating, with the indices on `device`: the epoch's order is copied there once,
        from pinned memory, so no step waits for the GPU to take its indices."""
        if device.type == "cuda":
            order = self._order_on_gpu(device)
        else:
            with _one_cpu_thread():
                order = self._epoch_order()
        full = len(order) // self.global_batch
        rows = order[: full * self.global_batch].view(full, self.world, self.batch_size)
        batches = list(rows[:, self.rank].unbind())
        rest = order[full * self.global_batch :]
        if len(rest):
            batches.append(rest.view(self.world, -1)[self.rank])
        first = self._skip.pop(self.epoch, 0)
        return zip(range(first, len(batches)), batches[first:], strict=True)


@dataclass(frozen=True)
class HostLoading:
    """How the host path's DataLoader runs (the data module's loader settings)."""

    num_workers: int = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: int | None = None


class ImageBatches:
    """The batches of one split on this process: (images float32 (B, C, H, W), labels (B,)) on
    `device`, augmented and normalised there. Without `loading`, `split` is on `device` and
    batches are indexed there; with it, a DataLoader gathers them from `split` in host memory.
    `epoch` says which epoch an iteration is (the shuffle depends on it); without it, call
    `order.set_epoch` before each epoch.
    """

    def __init__(
        self,
        split: Split,
        order: BatchOrder,
        transform: ImageTransform,
        device: torch.device,
        loading: HostLoading | None = None,
        epoch: Callable[[], int] | None = None,
    ) -> None:
        self.split, self.order, self.transform, self.device = split, order, transform, device
        self.on_device = loading is None
        self.epoch = epoch
        self.dataset = split  # its length caps Lightning's batch-size finder
        self.loader: DataLoader[Any] | None = None
        if loading is not None:
            workers = loading.num_workers > 0
            self.loader = DataLoader(
                split,  # type: ignore[arg-type]  # indexed with (step, indices), a batch a fetch
                batch_size=None,
                sampler=order,
                num_workers=loading.num_workers,
                pin_memory=loading.pin_memory,
                persistent_workers=loading.persistent_workers and workers,
                prefetch_factor=loading.prefetch_factor if workers else None,
                worker_init_fn=signal_proof_workers(),  # SIGTERM, Ctrl+C: the training process's
                # Its own generator: starting an iterator draws a seed, and drawing it from the
                # global one would shift dropout's random numbers whenever a loader is (re)started
                # (a resumed run starts one more than an unbroken one).
                generator=torch.Generator().manual_seed(order.seed),
            )

    def __len__(self) -> int:
        return len(self.order)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        if self.epoch is not None:
            # Read here rather than waiting for a set_epoch call: Lightning calls set_epoch only
            # on objects shaped like a DataLoader's samplers, with a count that lags the trainer's
            # epoch after a resume from a run stopped by max_steps (Lightning 2.6.6).
            self.order.set_epoch(self.epoch())
        generator = torch.Generator(self.device) if self.transform.random else None
        if self.on_device:
            yield from self._prepared_steps_at_once(generator)
            return
        run, draws = -1, None  # the run of steps whose random numbers are at hand
        for step, images, labels in self._stored_batches():
            if generator is not None and step // self.steps_at_once != run:
                run = step // self.steps_at_once
                draws = self._run_draws(generator, run)
            at = step % self.steps_at_once
            yield self.transform.apply(images, self._part(draws, at, len(images))), labels

    @functools.cached_property
    def steps_at_once(self) -> int:
        """Steps whose batches are gathered, augmented and normalised together on the device
        path: as many as STEPS_AT_ONCE_BYTES of prepared images hold (CIFAR-10 at batch 256: 21;
        ImageNet-sized images: 1), about twice that at the moment they are made (the uint8
        gather, its padded copy and crop beside the float32 result). Each preparation is a dozen
        small kernel launches and some Python, the same for one batch or many; where the host
        bounds the step (the eager and CUDA-graphs ResNet on an H200) every step paid it (issue
        #40)."""
        per_image = self.split.images.shape[1:].numel() * 4  # float32 once prepared
        fit = STEPS_AT_ONCE_BYTES // (self.order.batch_size * per_image)
        return max(1, min(fit, len(self.order)))  # no more than an epoch

    def _run_draws(self, generator: torch.Generator, run: int) -> tuple[Tensor, Tensor] | None:
        """The random numbers of the images of run `run` of `steps_at_once` steps, full batches
        each, seeded by (seed, epoch, its first step, rank): the host path (a batch at a time) and
        the device path (a run at a time) get the same numbers, and so do a resumed epoch's steps
        and an unbroken one's."""
        generator.manual_seed(self._batch_seed(run * self.steps_at_once))
        size = self.steps_at_once * self.order.batch_size
        return self.transform.draw(generator, size, self.device)

    def _part(
        self, draws: tuple[Tensor, Tensor] | None, at: int, count: int
    ) -> tuple[Tensor, Tensor] | None:
        """The numbers of `count` images from the `at`-th step of a run on."""
        if draws is None:
            return None
        first = at * self.order.batch_size
        return draws[0][first : first + count], draws[1][first : first + count]

    def _prepared_steps_at_once(
        self, generator: torch.Generator | None
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """The device path: each run of `steps_at_once` steps gathered and prepared in one go,
        then handed out a batch (a view) at a time. Only the epoch's last batch may be short, so
        the images of a run's steps take consecutive draws."""
        runs = itertools.groupby(self.order.on(self.device), lambda s: s[0] // self.steps_at_once)
        for run, in_run in runs:
            steps = list(in_run)
            indices = torch.cat([i for _, i in steps]) if len(steps) > 1 else steps[0][1]
            draws = None if generator is None else self._run_draws(generator, run)
            at = steps[0][0] % self.steps_at_once  # after a resume, a run may start part way
            images = self.transform.apply(
                self.split.images[indices], self._part(draws, at, len(indices))
            )
            sizes = [len(i) for _, i in steps]
            labels = self.split.labels[indices]
            yield from zip(images.split(sizes), labels.split(sizes), strict=True)

    def _batch_seed(self, step: int) -> int:
        order = self.order
        mixed = (shuffle_seed(order.seed, order.epoch) * 1_000_003 + step) * 1009 + order.rank
        return mixed % 2**63  # what a generator's seed holds

    def _stored_batches(self) -> Iterator[StoredBatch]:
        """The host path's batches, on `device`."""
        if self.device.type == "cuda":
            yield from copied_ahead(iter(self.loader or ()), self.device)
        else:
            yield from self.loader or ()


def copied_ahead(batches: Iterator[StoredBatch], device: torch.device) -> Iterator[StoredBatch]:
    """Host batches on `device`, each copied on a side stream while the step before it runs.

    The copy of batch n+1 is queued before batch n is handed out; the training stream waits for
    that copy (its own event, not the whole side stream) only when it reaches batch n+1. With
    pinned host memory the copy then runs alongside the step's kernels, not before them.
    """
    side = torch.cuda.Stream(device)

    def copy(batch: StoredBatch) -> tuple[StoredBatch, torch.cuda.Event]:
        step, images, labels = batch
        with torch.cuda.stream(side):
            copied = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        return (step, *copied), done

    ahead = next((copy(batch) for batch in batches), None)
    while ahead is not None:
        ready, done = ahead
        ahead = next((copy(batch) for batch in batches), None)
        training = torch.cuda.current_stream(device)
        training.wait_event(done)
        for tensor in ready[1:]:
            # Made on the side stream, used on the training one: the allocator must not hand the
            # memory out again before the training stream is done with it.
            tensor.record_stream(training)
        yield ready
