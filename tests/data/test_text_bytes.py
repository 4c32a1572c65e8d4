import _socket
import json
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor, nn

from volt.data.text_bytes import SKIPPED_DIRS, TextBytesDataModule, stdlib_sources


def write_files(directory: Path, contents: list[bytes]) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, content in enumerate(contents):
        path = directory / f"part{i}.txt"
        path.write_bytes(content)
        paths.append(str(path))
    return paths


@pytest.fixture
def every_byte_once(tmp_path: Path) -> list[str]:
    """A 256-byte corpus in three files whose byte at position i is i: a byte names its place."""
    corpus = bytes(range(256))
    return write_files(tmp_path / "text", [corpus[:100], corpus[100:180], corpus[180:]])


@pytest.fixture
def prose(tmp_path: Path) -> list[str]:
    generator = torch.Generator().manual_seed(0)
    words = [b"volt", b"bytes", b"window", b"train", b"split", b"seed", b"\n", b"def", b"("]
    picks = torch.randint(len(words), (3, 2000), generator=generator).tolist()
    return write_files(tmp_path / "text", [b" ".join(words[i] for i in row) for row in picks])


def make(cache: Path, files: list[str] | None, **changes: object) -> TextBytesDataModule:
    settings: dict[str, object] = dict(
        block_size=16, batch_size=8, val_fraction=0.1, test_fraction=0.1, steps_per_epoch=5
    )
    data = TextBytesDataModule(cache_dir=cache, files=files, **{**settings, **changes})  # type: ignore[arg-type]
    data.setup()
    return data


def trainer(world_size: int, rank: int) -> SimpleNamespace:
    """The three things the data module asks its trainer for its loaders."""
    strategy = SimpleNamespace(root_device=torch.device("cpu"))
    return SimpleNamespace(world_size=world_size, global_rank=rank, strategy=strategy)


def epoch_batches(data: TextBytesDataModule, epoch: int = 0) -> list[tuple[Tensor, Tensor]]:
    loader = data.train_dataloader()
    loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]  # as Lightning does
    return list(loader)


def test_the_cache_holds_the_files_bytes_in_order_and_is_built_once(
    tmp_path: Path, prose: list[str]
) -> None:
    data = make(tmp_path / "cache", prose)
    cache = data.corpus_path()
    assert cache.read_bytes() == b"".join(Path(f).read_bytes() for f in prose)
    written = cache.stat().st_mtime_ns
    make(tmp_path / "cache", prose).prepare_data()
    assert cache.stat().st_mtime_ns == written
    Path(prose[1]).write_bytes(b"changed " * 300)  # a changed file is a new corpus
    assert make(tmp_path / "cache", prose).corpus_path() != cache
    capped = make(tmp_path / "cache", prose, max_bytes=5000).corpus_path()
    assert capped.read_bytes() == b"".join(Path(f).read_bytes() for f in prose)[:5000]
    assert all(p.suffix == ".bin" for p in (tmp_path / "cache").iterdir())  # no temporary left


def test_splits_are_contiguous_disjoint_and_cover_the_corpus(
    tmp_path: Path, every_byte_once: list[str]
) -> None:
    data = make(tmp_path / "cache", every_byte_once, block_size=4, val_fraction=0.25)
    splits = {"train": data.train_set, "val": data.val_set, "test": data.test_set}
    read: dict[str, set[int]] = {}
    for name, windows in splits.items():
        assert windows is not None
        x, y = windows.__getitems__(list(range(len(windows))))
        read[name] = set(x.flatten().tolist()) | set(y.flatten().tolist())
        # bytes are positions here: each split reads one run of consecutive positions
        begin = windows.begin % 256
        run = {(begin + i) % 256 for i in range(len(read[name]))}
        assert read[name] == run, name
    assert not read["train"] & read["val"] and not read["train"] & read["test"]
    assert not read["val"] & read["test"]
    assert len(read["train"]) == 256 - 64 - 25  # every byte outside val and test
    # val and test read their stretch but for a tail shorter than one window
    assert 64 - 4 < len(read["val"]) <= 64 and 25 - 4 < len(read["test"]) <= 25
    assert data.test_set.begin == data.val_set.begin + 64  # type: ignore[union-attr]


def test_split_seed_moves_the_held_out_stretch(tmp_path: Path, every_byte_once: list[str]) -> None:
    begins = {
        make(tmp_path / "cache", every_byte_once, block_size=4, split_seed=s).val_set.begin  # type: ignore[union-attr]
        for s in range(4)
    }
    assert len(begins) > 1


def test_batches_are_int64_windows_with_targets_shifted_by_one(
    tmp_path: Path, every_byte_once: list[str]
) -> None:
    data = make(tmp_path / "cache", every_byte_once, block_size=4, batch_size=6)
    assert data.vocab_size == 256
    for x, y in [next(iter(data.train_dataloader())), next(iter(data.val_dataloader()))]:
        assert x.shape == y.shape == (6, 4) and x.dtype == y.dtype == torch.int64
        assert torch.equal(y, (x + 1) % 256)  # the next position's byte
    val_x, _ = next(iter(data.val_dataloader()))
    starts = val_x[:, 0]
    assert torch.equal((starts[1:] - starts[:-1]) % 256, torch.full((5,), 4))  # side by side


def test_predict_continues_the_prompt_given_or_the_start_of_the_test_split(
    tmp_path: Path, every_byte_once: list[str]
) -> None:
    data = make(tmp_path / "cache", every_byte_once, block_size=8, prompt="déf")
    (batch,) = list(data.predict_dataloader())
    assert torch.equal(batch[0], torch.tensor([list("déf".encode())]))  # UTF-8 bytes, (1, T0)
    data = make(tmp_path / "cache", every_byte_once, block_size=8)
    (batch,) = list(data.predict_dataloader())
    start = data.test_set.begin % 256  # type: ignore[union-attr]  # byte i sits at position i
    assert batch[0].tolist() == [[(start + i) % 256 for i in range(4)]]  # block_size // 2 bytes


def test_training_windows_are_a_function_of_seed_and_epoch(
    tmp_path: Path, prose: list[str]
) -> None:
    def windows(seed: int, epoch: int) -> Tensor:
        torch.manual_seed(seed)  # what seed_everything sets
        data = make(tmp_path / "cache", prose)
        return torch.cat([x for x, _ in epoch_batches(data, epoch)])

    first = windows(seed=1, epoch=0)
    assert first.shape == (5 * 8, 16)  # steps_per_epoch batches
    assert torch.equal(windows(seed=1, epoch=0), first)
    assert not torch.equal(windows(seed=1, epoch=1), first)
    assert not torch.equal(windows(seed=2, epoch=0), first)


def test_a_resumed_epoch_skips_the_batches_already_trained_on(
    tmp_path: Path, prose: list[str]
) -> None:
    torch.manual_seed(3)
    full = epoch_batches(make(tmp_path / "cache", prose), epoch=1)
    resumed = make(tmp_path / "cache", prose)
    resumed.load_state_dict({"epoch": 1, "batches_done": 2})
    rest = epoch_batches(resumed, epoch=1)
    assert len(rest) == len(full) - 2
    for (x, y), (x_full, y_full) in zip(rest, full[2:], strict=True):
        assert torch.equal(x, x_full) and torch.equal(y, y_full)
    again = epoch_batches(resumed, epoch=1)  # the skip applies once, not to a later pass
    assert len(again) == len(full)


def test_each_process_trains_on_its_share_of_the_same_global_batches(
    tmp_path: Path, prose: list[str]
) -> None:
    def batches(world_size: int, rank: int) -> list[Tensor]:
        torch.manual_seed(5)
        data = make(tmp_path / "cache", prose)
        data.trainer = trainer(world_size, rank)  # type: ignore[assignment]
        return [x for x, _ in epoch_batches(data)]

    alone = batches(1, 0)
    rank0, rank1 = batches(2, 0), batches(2, 1)
    assert len(rank0) == len(rank1) == len(alone)
    for step, whole in enumerate(alone):
        assert rank0[step].shape == (4, 16)
        assert torch.equal(torch.cat((rank0[step], rank1[step])), whole)


def test_worker_processes_serve_the_same_batches(
    tmp_path: Path, prose: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Workers hand tensors back over local (Unix) sockets: let those through the no-network
    # guard of tests/data/conftest.py, which still refuses every other address family.
    guard = socket.socket.connect

    def local_only(sock: socket.socket, address: object) -> None:
        connect = _socket.socket.connect if sock.family == socket.AF_UNIX else guard
        connect(sock, address)  # type: ignore[arg-type]

    monkeypatch.setattr(socket.socket, "connect", local_only)
    torch.manual_seed(0)
    in_process = epoch_batches(make(tmp_path / "cache", prose))
    torch.manual_seed(0)
    in_workers = epoch_batches(make(tmp_path / "cache", prose, num_workers=2))
    for (x, y), (x_w, y_w) in zip(in_process, in_workers, strict=True):
        assert torch.equal(x, x_w) and torch.equal(y, y_w)


def test_by_default_the_corpus_is_the_standard_library_sources(tmp_path: Path) -> None:
    sources = stdlib_sources()
    assert {"os.py", "functools.py", "__init__.py"} <= {path.name for path in sources}
    assert sources == sorted(sources)
    assert not any(SKIPPED_DIRS & set(path.parts) for path in sources)
    cache = make(tmp_path / "cache", None, max_bytes=20_000).corpus_path().read_bytes()
    assert len(cache) == 20_000
    assert cache.startswith(sources[0].read_bytes()[:20_000])


def test_bad_settings_fail_with_the_key_and_a_fix(tmp_path: Path, prose: list[str]) -> None:
    with pytest.raises(ValueError, match=r"data.val_fraction=0 .*between 0 and 1"):
        TextBytesDataModule(cache_dir=tmp_path, val_fraction=0)
    with pytest.raises(ValueError, match=r"leave nothing to train on"):
        TextBytesDataModule(cache_dir=tmp_path, val_fraction=0.5, test_fraction=0.5)
    with pytest.raises(FileNotFoundError, match=r"data.files names .*missing.txt"):
        make(tmp_path / "cache", [str(tmp_path / "missing.txt")])
    with pytest.raises(ValueError, match=r"the test split holds .* raise data.test_fraction"):
        make(tmp_path / "cache", prose, test_fraction=0.0005)
    with pytest.raises(ValueError, match=r"data.prompt is empty"):
        TextBytesDataModule(cache_dir=tmp_path, prompt="")


class RecordingModel(pl.LightningModule):
    """Trains a bigram table and remembers every batch it trained on."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(256, 256)
        self.seen: list[list[list[int]]] = []

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        self.seen.append(x.tolist())
        return nn.functional.cross_entropy(self.table(x).flatten(0, 1), y.flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(data: TextBytesDataModule, root: Path, max_steps: int, ckpt: Path | None = None) -> list:
    """Trains to max_steps, saving a checkpoint every 3 steps (step=3.ckpt, ...) as a run does."""
    pl.seed_everything(7, verbose=False)
    model = RecordingModel()
    every_3_steps = ModelCheckpoint(root, "{step}", every_n_train_steps=3, save_top_k=-1)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=max_steps,
        limit_val_batches=0,
        logger=False,
        callbacks=[every_3_steps],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=data, ckpt_path=ckpt)
    return model.seen


def test_a_run_resumed_mid_epoch_trains_on_the_batches_an_unbroken_run_would(
    tmp_path: Path, prose: list[str]
) -> None:
    def data() -> TextBytesDataModule:
        return TextBytesDataModule(
            cache_dir=tmp_path / "cache", files=prose, block_size=16, batch_size=4,
            steps_per_epoch=4,
        )  # fmt: skip

    unbroken = fit(data(), tmp_path / "a", max_steps=10)  # across two epoch ends
    first = fit(data(), tmp_path / "b", max_steps=6)  # stops inside the second epoch
    rest = fit(data(), tmp_path / "b", max_steps=10, ckpt=tmp_path / "b" / "step=6.ckpt")
    assert len(first) == 6 and len(rest) == 4
    assert first + rest == unbroken


DDP_PROBE = """
import json, sys
import lightning.pytorch as pl
import torch
from volt.data.text_bytes import TextBytesDataModule

class Probe(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(256, 256)
        self.seen, self.val = [], []
    def on_train_start(self):
        self.sampler = type(self.trainer.train_dataloader.sampler).__name__
    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.append(x.tolist())
        return torch.nn.functional.cross_entropy(self.table(x).flatten(0, 1), y.flatten())
    def validation_step(self, batch, batch_idx):
        self.val += batch[0].tolist()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

cache, files, world, out = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), sys.argv[4]
pl.seed_everything(7, verbose=False)
data = TextBytesDataModule(cache_dir=cache, files=files, block_size=16, batch_size=4,
                           steps_per_epoch=3, val_fraction=0.05, test_fraction=0.05)
model = Probe()
trainer = pl.Trainer(accelerator="cpu", devices=world, strategy="ddp" if world > 1 else "auto",
                     max_epochs=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     num_sanity_val_steps=0)
trainer.fit(model, datamodule=data)
with open(f"{out}/rank{trainer.global_rank}_of_{world}.json", "w") as f:
    json.dump({"seen": model.seen, "sampler": model.sampler, "val": model.val}, f)
"""


@pytest.mark.slow
def test_under_ddp_each_rank_gets_its_share_of_training_and_validation(
    tmp_path: Path, prose: list[str]
) -> None:
    # A script file: Lightning's DDP launcher starts rank 1 by running the same command again.
    script = tmp_path / "ddp_probe.py"
    script.write_text(DDP_PROBE)
    command = [sys.executable, str(script), str(tmp_path / "cache"), ",".join(prose), "2"]
    result = subprocess.run([*command, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}_of_2.json").read_text()) for r in (0, 1))

    torch.manual_seed(7)  # what the probe's seed_everything(7) sets
    settings = dict(batch_size=4, steps_per_epoch=3, val_fraction=0.05, test_fraction=0.05)
    alone = make(tmp_path / "cache", prose, **settings)  # the probe's data module
    global_batches = [x.tolist() for x, _ in epoch_batches(alone)]
    assert alone.val_set is not None
    val_windows = alone.val_set.__getitems__(list(range(len(alone.val_set))))[0].tolist()

    # Lightning left the sampler in place: each rank trains on its half of the global batches.
    assert rank0["sampler"] == rank1["sampler"] == "RandomWindowSampler"
    assert len(rank0["seen"]) == len(rank1["seen"]) == 3
    for step, whole in enumerate(global_batches):
        assert rank0["seen"][step] + rank1["seen"][step] == whole
    # Validation is Lightning's to split: every other window each, together all of them.
    val0, val1 = {tuple(w) for w in rank0["val"]}, {tuple(w) for w in rank1["val"]}
    assert val0 | val1 == {tuple(w) for w in val_windows}
    assert len(rank0["val"]) == len(rank1["val"]) == -(-len(val_windows) // 2)
