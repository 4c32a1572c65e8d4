"""Sharded checkpoints on disk, in one process: written into a temporary folder and renamed into
place, found (or skipped) by resume's lookup, removed file by file, and read as data: a folder
whose DCP metadata or entries would run code, read outside the folder, or claim more memory than
it holds is refused, each with a control showing torch's own reader does what was refused."""

import logging
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from volt.checkpointing import (
    CheckpointLoadError,
    UnsafeCheckpointError,
    begin_sharded_save,
    find_latest_valid_checkpoint,
    finish_sharded_save,
    read_sharded_checkpoint,
    read_sharded_weights,
    read_stored_checkpoint,
    remove_sharded_checkpoint,
    write_sharded,
)
from volt.checkpointing.dcp_reading import (
    CheckedReader,
    WeightsOnlyLoadPlanner,
    _MetadataUnpickler,
    read_metadata,
)

TEMP_PREFIX = ".volt-ckpt-tmp-"


def checkpoint(step: int = 3) -> dict[str, Any]:
    """What Lightning hands a sharded save, in one process: the weights and an optimiser state
    keyed by parameter name (a tied weight under two names), and the rest."""
    weight = torch.arange(12.0).reshape(4, 3)
    return {
        "state_dict": {"net.w": weight, "net.b": torch.zeros(3), "head.w": weight},
        "optimizer_states": [
            {
                "state": {"net.w": {"exp_avg": torch.ones(4, 3), "step": torch.tensor(3.0)}},
                "param_groups": [{"lr": 0.1, "betas": (0.9, 0.95), "params": ["net.w", "net.b"]}],
            }
        ],
        "global_step": step,
        "volt_config": {"model": {"_target_": "volt.models.classifier.Classifier"}},
    }


def save(target: Path, step: int = 3) -> Path:
    folder = begin_sharded_save(target)
    write_sharded(checkpoint(step), folder, coordinator=True)
    finish_sharded_save(folder, target)
    return target


def temporaries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(TEMP_PREFIX))


def rewrite_metadata(folder: Path, change: Any) -> None:
    """Unpickle the folder's genuine metadata, change it, pickle it back."""
    path = folder / ".metadata"
    with path.open("rb") as file:
        metadata = _MetadataUnpickler(file).load()
    change(metadata)
    path.write_bytes(pickle.dumps(metadata))


class OpensFile:
    """Unpickling this opens (creates) `path`: what any pickled object could do instead."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def test_a_save_is_one_folder_of_shards_metadata_and_the_rest(tmp_path: Path) -> None:
    target = save(tmp_path / "checkpoints" / "last.ckpt")
    assert sorted(p.name for p in target.iterdir()) == [".metadata", "__0_0.distcp", "meta.pt"]
    assert temporaries(target.parent) == []
    # meta.pt holds no weights: they are the shards'.
    meta = torch.load(target / "meta.pt", weights_only=True)
    assert set(meta) == {"global_step", "volt_config"}
    loaded = read_sharded_checkpoint(target)
    assert loaded["global_step"] == 3
    assert "optimizer_states" not in loaded  # one process reads the weights only
    for key, value in checkpoint()["state_dict"].items():
        assert torch.equal(loaded["state_dict"][key], value), key
    config, shapes = read_stored_checkpoint(target)
    assert config == checkpoint()["volt_config"]
    assert {k: tuple(v.shape) for k, v in shapes.items()} == {
        "net.w": (4, 3),
        "net.b": (3,),
        "head.w": (4, 3),
    }
    assert all(v.device.type == "meta" for v in shapes.values())  # nothing read


@pytest.mark.parametrize("before", ["folder", "file", "link"])
def test_a_save_replaces_what_has_the_name_and_leaves_no_temporaries(
    before: str, tmp_path: Path
) -> None:
    target = tmp_path / "last.ckpt"
    if before == "folder":
        save(target, step=1)
    elif before == "file":
        target.write_bytes(b"a single-file checkpoint")
    else:
        (tmp_path / "elsewhere").mkdir()
        target.symlink_to(tmp_path / "elsewhere")
    save(target, step=2)
    assert target.is_dir() and not target.is_symlink()
    assert read_sharded_checkpoint(target)["global_step"] == 2
    # the link itself replaced, what it pointed to kept
    assert {p.name for p in tmp_path.iterdir()} - {"elsewhere"} == {"last.ckpt"}
    assert (tmp_path / "elsewhere").is_dir() == (before == "link")


def break_meta(folder: Path) -> None:
    (folder / "meta.pt").unlink()


def break_metadata(folder: Path) -> None:
    (folder / ".metadata").unlink()


def drop_shard(folder: Path) -> None:
    (folder / "__0_0.distcp").unlink()


def truncate_shard(folder: Path) -> None:
    shard = folder / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])


def link_meta(folder: Path) -> None:
    """meta.pt as a link to a copy elsewhere: what the folder's reader reads is the folder's."""
    elsewhere = folder.parent / "elsewhere.pt"
    (folder / "meta.pt").rename(elsewhere)
    (folder / "meta.pt").symlink_to(elsewhere)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (link_meta, "its meta.pt is not a plain file (a link?)"),
        (break_meta, "holds no meta.pt"),
        (break_metadata, "holds no .metadata"),
        (drop_shard, "holds no __0_0.distcp"),
        (truncate_shard, "which holds 100: a shard is truncated"),
    ],
    ids=["linked meta.pt", "no meta.pt", "no metadata", "no shard", "truncated shard"],
)
def test_resume_skips_an_incomplete_folder_for_the_newest_complete_one(
    damage: Any, reason: str, tmp_path: Path
) -> None:
    older = save(tmp_path / "epoch000.ckpt", step=1)
    os.utime(older, (1, 1))
    damaged = save(tmp_path / "last.ckpt", step=2)
    damage(damaged)
    latest, skipped = find_latest_valid_checkpoint(tmp_path)
    assert latest == older
    assert [path for path, _ in skipped] == [damaged]
    assert reason in skipped[0][1]
    with pytest.raises(CheckpointLoadError, match=re.escape(reason)):
        read_sharded_checkpoint(damaged)


def test_a_killed_writers_temporary_folder_goes_at_the_next_save(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    host = os.uname().nodename
    leftover = tmp_path / f"{TEMP_PREFIX}{host}-{dead.stdout.strip()}-0123abcd"
    live = tmp_path / f"{TEMP_PREFIX}{host}-{os.getppid()}-0123abcd"  # pytest's parent runs
    for folder in (leftover, live):
        folder.mkdir()
        (folder / "__0_0.distcp").write_bytes(b"half a shard")
    save(tmp_path / "last.ckpt")
    assert not leftover.exists()
    assert live.exists()


def test_removal_deletes_checkpoint_files_inside_the_run_and_nothing_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoints = tmp_path / "run" / "checkpoints"
    victim = tmp_path / "victim.txt"
    victim.write_text("a user's file")
    plain = save(checkpoints / "epoch000.ckpt")
    remove_sharded_checkpoint(plain, [checkpoints])
    assert list(checkpoints.iterdir()) == []
    # A file of the checkpoint's names that links elsewhere: the link goes, its target stays.
    linked = save(checkpoints / "epoch001.ckpt")
    (linked / "meta.pt").unlink()
    (linked / "meta.pt").symlink_to(victim)
    (linked / "notes.txt").write_text("not a checkpoint's")
    with caplog.at_level(logging.WARNING):
        remove_sharded_checkpoint(linked, [checkpoints])
    assert victim.read_text() == "a user's file"
    (left,) = checkpoints.iterdir()  # renamed out of the *.ckpt names, left with its stranger
    assert left.name.startswith(TEMP_PREFIX)
    assert sorted(p.name for p in left.iterdir()) == ["notes.txt"]
    assert "no checkpoint volt writes holds" in caplog.text
    # Outside the run's checkpoint folders, or through a link: untouched.
    outside = save(tmp_path / "elsewhere" / "epoch002.ckpt")
    (checkpoints / "link.ckpt").symlink_to(outside)
    remove_sharded_checkpoint(outside, [checkpoints])
    remove_sharded_checkpoint(checkpoints / "link.ckpt", [checkpoints])
    assert sorted(p.name for p in outside.iterdir()) == [".metadata", "__0_0.distcp", "meta.pt"]
    # The control: inside the folder, the same removal does delete.
    remove_sharded_checkpoint(outside, [outside.parent])
    assert not outside.exists()


def test_metadata_whose_pickle_runs_code_is_refused(tmp_path: Path) -> None:
    target = save(tmp_path / "last.ckpt")
    sentinel = tmp_path / "sentinel"
    (target / ".metadata").write_bytes(pickle.dumps(OpensFile(str(sentinel))))
    with pytest.raises(UnsafeCheckpointError, match=r"io\.open is not allowed") as caught:
        read_metadata(target)
    assert "\n" not in str(caught.value)
    for read in (read_sharded_weights, read_stored_checkpoint):
        with pytest.raises(CheckpointLoadError):
            read(target)
    assert find_latest_valid_checkpoint(tmp_path) == (None, [(target, str(caught.value))])
    assert not sentinel.exists()
    # The control: torch's own reader unpickles it, and the file opens.
    FileSystemReader(target).read_metadata()
    assert sentinel.exists()


def point_outside(metadata: Any) -> None:
    for info in metadata.storage_data.values():
        info.relative_path = "../outside.distcp"


def compress(metadata: Any) -> None:
    for info in metadata.storage_data.values():
        info.transform_descriptors = ["zstd"]


def enlarge(metadata: Any) -> None:
    """The bias declared 2**40 elements, its chunk the whole of it: 4 TiB to allocate."""
    entry = metadata.state_dict_metadata["state_dict.net.b"]
    entry.size = torch.Size([2**40])
    entry.chunks = [ChunkStorageMetadata(torch.Size([0]), torch.Size([2**40]))]


def repeat_chunks(metadata: Any) -> None:
    """200 entries sharing one list of 20,000 chunks: a few hundred kB for 4 million."""
    chunks = [ChunkStorageMetadata(torch.Size([i]), torch.Size([1])) for i in range(20_000)]
    for i in range(200):
        entry = TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size([20_000]),
                                      chunks)  # fmt: skip
        metadata.state_dict_metadata[f"state_dict.x{i}"] = entry


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (point_outside, "is stored at '../outside.distcp', not in a file of the checkpoint's"),
        (compress, "is stored transformed (['zstd'])"),
        (enlarge, "its tensors declare 4,398,046,511,"),
        (repeat_chunks, "it repeats objects, as only a crafted file does"),
    ],
    ids=["outside the folder", "compressed", "larger than its shards", "repeated objects"],
)
def test_metadata_that_declares_what_the_folder_does_not_hold_is_refused(
    change: Any, refusal: str, tmp_path: Path
) -> None:
    target = save(tmp_path / "last.ckpt")
    (tmp_path / "outside.distcp").write_bytes((target / "__0_0.distcp").read_bytes())
    rewrite_metadata(target, change)
    with pytest.raises(UnsafeCheckpointError) as caught:
        read_sharded_weights(target)
    assert refusal in str(caught.value)
    # The control: torch's reader takes the same metadata as it is.
    assert FileSystemReader(target).read_metadata().state_dict_metadata


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # torch's reader, no group
def test_torchs_reader_follows_metadata_out_of_the_folder(tmp_path: Path) -> None:
    """The control for "outside the folder": DCP reads whatever file the metadata names."""
    target = save(tmp_path / "last.ckpt")
    (tmp_path / "outside.distcp").write_bytes((target / "__0_0.distcp").read_bytes())
    (target / "__0_0.distcp").unlink()
    rewrite_metadata(target, point_outside)
    state = {"state_dict.net.b": torch.empty(3)}
    dcp.load(state, storage_reader=FileSystemReader(target), no_dist=True,
             planner=DefaultLoadPlanner(flatten_state_dict=False))  # fmt: skip
    assert torch.equal(state["state_dict.net.b"], torch.zeros(3))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # torch's reader, no group
def test_an_entry_that_is_not_a_tensor_is_unpickled_weights_only(tmp_path: Path) -> None:
    """A bytes entry (where DCP keeps `param_groups`) holding a pickled payload: volt's planner
    refuses it, DCP's default planner runs it."""
    target = save(tmp_path / "last.ckpt")
    sentinel = tmp_path / "sentinel"
    payload = tmp_path / "payload"
    torch.save(OpensFile(str(sentinel)), payload)
    shard = target / "__0_0.distcp"
    offset = shard.stat().st_size
    shard.write_bytes(shard.read_bytes() + payload.read_bytes())
    key = "optimizer_0.param_groups.0.lr"

    def to_payload(metadata: Any) -> None:
        metadata.storage_data[MetadataIndex(key)].offset = offset
        metadata.storage_data[MetadataIndex(key)].length = payload.stat().st_size

    rewrite_metadata(target, to_payload)
    state: dict[str, Any] = {key: None}
    with pytest.raises(dcp.CheckpointException, match="Weights only load failed"):
        dcp.load(state, storage_reader=CheckedReader(target), no_dist=True,
                 planner=WeightsOnlyLoadPlanner(flatten_state_dict=False))  # fmt: skip
    assert not sentinel.exists()
    # The control: DCP's own planner unpickles it with weights_only=False.
    dcp.load(state, storage_reader=CheckedReader(target), no_dist=True,
             planner=DefaultLoadPlanner(flatten_state_dict=False))  # fmt: skip
    assert sentinel.exists()
