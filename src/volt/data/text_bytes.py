"""Raw bytes of text files as a language-modelling corpus: by default this Python's own standard
library sources, cached once as one uint8 file and memory-mapped by every process."""

import hashlib
import os
import sysconfig
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from volt.data.resumable import ResumableDataModule
from volt.data.workers import signal_proof_workers

Batch = tuple[Tensor, Tensor]  # inputs and targets, int64 (B, T)

# Third-party packages differ from machine to machine; the test suites hold deliberately broken
# files and large generated tables, and some distributions leave them out (Debian ships them as a
# separate package): without both, one Python version gives the same corpus everywhere.
SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test"})


def stdlib_sources() -> list[Path]:
    """Every *.py file of this Python's standard library outside SKIPPED_DIRS, sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found: list[Path] = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in SKIPPED_DIRS]  # prune: not even listed
        found += [Path(directory, name) for name in names if name.endswith(".py")]
    return sorted(found)


def read_corpus(files: Sequence[Path], max_bytes: int | None = None) -> bytes:
    """The files' bytes one after the other, cut at max_bytes; files past the cut are not read."""
    chunks: list[bytes] = []
    total = 0
    for path in files:
        if max_bytes is not None and total >= max_bytes:
            break
        chunks.append(path.read_bytes())
        total += len(chunks[-1])
    return b"".join(chunks)[:max_bytes]


class ByteWindows(Dataset[Batch]):
    """Windows of block_size + 1 bytes inside one split; item i starts at begin + i * stride.

    Positions wrap around the corpus end to its start (where the split that holds them crosses
    it), which joins the last file to the first like any two neighbouring files.
    """

    def __init__(self, path: Path, begin: int, size: int, block_size: int, stride: int) -> None:
        self.path = path
        self.corpus_size = path.stat().st_size
        self.begin = begin
        self.block_size = block_size
        self.stride = stride
        self.num_windows = (size - block_size - 1) // stride + 1
        self._bytes: np.memmap | None = None

    def __len__(self) -> int:
        return self.num_windows

    def __getitem__(self, index: int) -> Batch:
        x, y = self.__getitems__([index])
        return x[0], y[0]

    def __getitems__(self, indices: list[int]) -> Batch:
        # The DataLoader hands over a whole batch of indices: one vectorised gather serves it.
        starts = self.begin + np.asarray(indices, dtype=np.int64) * self.stride  # (B,)
        positions = (starts[:, None] + np.arange(self.block_size + 1)) % self.corpus_size
        window = torch.from_numpy(self.corpus()[positions].astype(np.int64))  # (B, T + 1)
        return window[:, :-1].contiguous(), window[:, 1:].contiguous()  # y: x shifted by one

    def corpus(self) -> np.memmap:
        if self._bytes is None:
            self._bytes = np.memmap(self.path, dtype=np.uint8, mode="r")
        return self._bytes

    def __getstate__(self) -> dict[str, Any]:
        # A pickled memmap travels as a full copy: a worker process maps the file itself.
        return {**self.__dict__, "_bytes": None}


def _batch_as_is(batch: Any) -> Any:
    return batch  # __getitems__ already returns the batch as two (B, T) tensors


class RandomWindowSampler(DistributedSampler[int]):
    """`steps` global batches of random window starts per epoch, drawn with replacement from a
    generator seeded by (seed, epoch); this process keeps its slice of each global batch.

    Every process draws the same global batches, so a step trains on the same windows whatever
    the number of processes, and a resumed epoch can skip exactly the batches already trained
    on, on one process or many. It is a DistributedSampler only so that Lightning, which
    replaces the sampler of a training loader under DDP unless it is one, leaves it in place.
    """

    def __init__(
        self,
        dataset: ByteWindows,
        steps: int,
        batch_size: int,
        num_replicas: int,
        rank: int,
        seed: int,
    ) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, seed=seed)
        self.steps = steps
        self.batch_size = batch_size  # this process's share of a global batch
        self.skip: dict[int, int] = {}  # epoch -> samples already consumed in it

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        shape = (self.steps, self.num_replicas, self.batch_size)
        starts = torch.randint(len(self.dataset), shape, generator=generator)  # type: ignore[arg-type]
        mine = starts[:, self.rank].reshape(-1)
        return iter(mine[self.skip.pop(self.epoch, 0) :].tolist())

    def __len__(self) -> int:
        return self.steps * self.batch_size


class TextBytesDataModule(ResumableDataModule):
    """Next-byte prediction on text files (vocabulary 256: one token per byte).

    `files` are read in the order given; None reads stdlib_sources(). prepare_data writes their
    bytes, one file after the other and cut at `max_bytes`, once to a .bin file in `cache_dir`;
    setup memory-maps it. The corpus is split into contiguous stretches, so no held-out byte is
    ever inside a training window: val and test lie one after the other from an offset drawn
    with `split_seed`, and train is the rest (running on past the corpus end to its start).
    Training draws random windows, `steps_per_epoch` batches to an epoch (set the run's length
    with max_steps); validation and test read their stretch once in non-overlapping windows.
    `batch_size` is global: under DDP each of N processes loads batch_size / N windows.
    Prediction continues `prompt` (its UTF-8 bytes), or, when it is None, the first
    block_size // 2 bytes of the test split.
    """

    vocab_size = 256

    def __init__(
        self,
        *,
        cache_dir: str | Path,
        files: list[str] | None = None,
        block_size: int = 256,
        batch_size: int = 64,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        max_bytes: int | None = None,
        split_seed: int = 1234,
        steps_per_epoch: int = 1000,
        num_workers: int = 0,
        pin_memory: bool | None = None,
        persistent_workers: bool = False,
        prompt: str | None = None,
    ) -> None:
        super().__init__()
        if prompt == "":
            raise ValueError("data.prompt is empty: give some text to continue, or null")
        for name, fraction in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not 0 < fraction < 1:
                raise ValueError(f"data.{name}={fraction} must be between 0 and 1, e.g. 0.05")
        if val_fraction + test_fraction >= 1:
            raise ValueError(
                f"data.val_fraction={val_fraction} + data.test_fraction={test_fraction} leave "
                "nothing to train on: keep their sum below 1, e.g. 0.05 each"
            )
        counts = dict(block_size=block_size, batch_size=batch_size, steps_per_epoch=steps_per_epoch)
        if max_bytes is not None:
            counts["max_bytes"] = max_bytes
        for name, value in counts.items():
            if value < 1:
                raise ValueError(f"data.{name}={value} must be at least 1")
        self.cache_dir = Path(cache_dir)
        self.files = files
        self.block_size = block_size
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.max_bytes = max_bytes
        self.split_seed = split_seed
        self.steps_per_epoch = steps_per_epoch
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.prompt = prompt
        self.train_set: ByteWindows | None = None
        self.val_set: ByteWindows | None = None
        self.test_set: ByteWindows | None = None

    def sources(self) -> list[Path]:
        if self.files is None:
            return stdlib_sources()
        paths = [Path(f) for f in self.files]
        for path in paths:
            if not path.is_file():
                raise FileNotFoundError(
                    f"data.files names {path}, which is not a file: list existing text files, "
                    "or data.files=null for the standard library's sources"
                )
        return paths

    def corpus_path(self) -> Path:
        """The cache file of this corpus: named by its files (path, size, mtime) and max_bytes,
        so that changing any of them builds a new one instead of reading a stale one."""
        digest = hashlib.sha256(f"max_bytes={self.max_bytes}\n".encode())
        for path in self.sources():
            stat = path.stat()
            digest.update(f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        return self.cache_dir / f"corpus-{digest.hexdigest()[:16]}.bin"

    def prepare_data(self) -> None:
        path = self.corpus_path()
        if path.is_file():
            return
        corpus = read_corpus(self.sources(), self.max_bytes)
        if not corpus:
            raise ValueError(f"data.files={self.files} hold no bytes: name non-empty text files")
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written aside, then renamed: a reader never sees half a file, and processes that
        # build it at the same time (nodes sharing cache_dir, setup() without prepare_data())
        # each write their own temporary file.
        fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as file:
            file.write(corpus)
        os.replace(partial, path)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        self.prepare_data()  # returns at once when the cache is there, as it is under Lightning
        path = self.corpus_path()
        n = path.stat().st_size
        n_val, n_test = int(n * self.val_fraction), int(n * self.test_fraction)
        sizes = {"val": n_val, "test": n_test, "train": n - n_val - n_test}
        for split, size in sizes.items():
            if size < self.block_size + 1:
                raise ValueError(
                    f"the {split} split holds {size} of the corpus's {n} bytes, less than one "
                    f"window of data.block_size + 1 = {self.block_size + 1}: raise "
                    f"data.{split}_fraction or data.max_bytes, or lower data.block_size"
                )
        generator = torch.Generator().manual_seed(self.split_seed)
        held_out = int(torch.randint(n, (1,), generator=generator))
        T = self.block_size
        self.val_set = ByteWindows(path, held_out, n_val, T, stride=T)
        self.test_set = ByteWindows(path, held_out + n_val, n_test, T, stride=T)
        self.train_set = ByteWindows(path, held_out + n_val + n_test, sizes["train"], T, stride=1)

    def train_dataloader(self) -> DataLoader[Batch]:
        assert self.train_set is not None, "call setup() first"
        processes, rank = 1, 0
        if self.trainer is not None:
            processes, rank = self.trainer.world_size, self.trainer.global_rank
        sampler = RandomWindowSampler(
            self.train_set,
            self.steps_per_epoch,
            self.per_process_batch_size,
            processes,
            rank,
            # From torch's seed (seed_everything, the same on every rank): `seed=` moves it too.
            seed=torch.initial_seed() % 2**31,
        )
        if at := self.take_resume_point():
            sampler.skip[at["epoch"]] = at["batches_done"] * self.per_process_batch_size
        return self._loader(self.train_set, sampler)

    def val_dataloader(self) -> DataLoader[Batch]:
        assert self.val_set is not None, "call setup() first"
        return self._loader(self.val_set)

    def test_dataloader(self) -> DataLoader[Batch]:
        assert self.test_set is not None, "call setup() first"
        return self._loader(self.test_set)

    def predict_dataloader(self) -> DataLoader[tuple[Tensor, ...]]:
        if self.prompt is not None:
            prompt = torch.tensor(list(self.prompt.encode()), dtype=torch.int64)
        else:
            assert self.test_set is not None, "call setup() first"
            prompt = self.test_set[0][0][: max(1, self.block_size // 2)]
        return DataLoader(TensorDataset(prompt[None]), batch_size=1)  # one (1, T0) batch

    def _loader(
        self, dataset: ByteWindows, sampler: RandomWindowSampler | None = None
    ) -> DataLoader[Batch]:
        # Without a sampler the windows are read in order; under DDP Lightning then gives each
        # process every N-th one (a DistributedSampler without shuffling, which repeats a few
        # windows so that all processes run the same number of batches).
        on_gpu = self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"
        return DataLoader(
            dataset,
            batch_size=self.per_process_batch_size,
            sampler=sampler,
            collate_fn=_batch_as_is,
            num_workers=self.num_workers,
            # Pinned host memory lets the host-to-GPU copy run asynchronously (non_blocking).
            pin_memory=on_gpu if self.pin_memory is None else self.pin_memory,
            persistent_workers=self.persistent_workers and self.num_workers > 0,
            worker_init_fn=signal_proof_workers(),  # SIGTERM, Ctrl+C: the training process's
            # Its own generator: starting an iterator draws a seed, and drawing it from the global
            # one would shift dropout's random numbers whenever a loader is (re)started.
            generator=torch.Generator().manual_seed(torch.initial_seed() % 2**31),
        )
