"""Work a handed-over file sets is bounded (issue #41, requirement 2): what a checkpoint's zip
entries expand to, the bytes a sharded checkpoint really holds on disk, the tokens a stored
model generates. Each case has a control showing the route with volt's check taken out."""

import os
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
import yaml
from omegaconf import DictConfig

from tests.in_process import RunHere
from volt.checkpointing import (
    AtomicCheckpointIO,
    CheckpointLoadError,
    atomic_io,
    dcp_reading,
    measure_checkpoint_files,
)
from volt.checkpointing.dcp_reading import read_metadata
from volt.checkpointing.load_errors import UnsafeCheckpointError
from volt.config import PROJECT_ROOT
from volt.config.validation import check_config
from volt.errors import ConfigError
from volt.rebuild import STORED_CAPS, _check_caps, bound_first_forward

EXPANDS_TO = 80 * 2**20  # more than the 64 MiB a file may expand beyond its size


def deflated(path: Path) -> Path:
    """`path` re-zipped with DEFLATE, as the issue's 2.5 MB file around a 1.5 GB string."""
    crafted = path.with_name("deflated.ckpt")
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(crafted, "w") as target:
        for entry in source.infolist():
            target.writestr(entry.filename, source.read(entry), zipfile.ZIP_DEFLATED)
    return crafted


def test_a_pickle_that_expands_far_beyond_its_file_is_refused_before_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.save({"state_dict": {}, "pad": "a" * EXPANDS_TO}, tmp_path / "plain.ckpt")
    crafted = deflated(tmp_path / "plain.ckpt")
    (tmp_path / "plain.ckpt").unlink()
    assert crafted.stat().st_size < 2**20
    with pytest.raises(CheckpointLoadError, match="its entries expand to"):
        AtomicCheckpointIO().load_checkpoint(crafted)
    # the control: torch.load expands the whole string
    monkeypatch.setattr(atomic_io, "check_expanded_size", lambda path: None)
    assert len(AtomicCheckpointIO().load_checkpoint(crafted)["pad"]) == EXPANDS_TO


# torch warns that it saves in one process, which is what this test means to do
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")
def test_a_sparse_shard_under_large_declared_tensors_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "sharded"
    dcp.save({"embedding": torch.ones(1024, 1024)}, checkpoint_id=folder, no_dist=True)
    read_metadata(folder)  # the genuine folder passes
    (shard,) = folder.glob("*.distcp")
    size = shard.stat().st_size
    os.truncate(shard, 0)
    os.truncate(shard, size)  # the same apparent size, a hole on disk
    with pytest.raises(UnsafeCheckpointError, match="shard files hold 0 on disk"):
        read_metadata(folder)
    # the control: measured by its apparent size, the hole passes for 4 MiB of weights
    monkeypatch.setattr(dcp_reading, "bytes_on_disk", lambda path: path.stat().st_size)
    read_metadata(folder)


@pytest.fixture
def measured_by_apparent_size() -> Iterator[None]:
    measure_checkpoint_files("apparent")
    yield
    measure_checkpoint_files("allocated")


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")
@pytest.mark.usefixtures("measured_by_apparent_size")
def test_checkpoint_bytes_apparent_measures_a_file_by_its_size(tmp_path: Path) -> None:
    """For a compressing file system (ZFS, btrfs), where a genuine checkpoint takes fewer blocks
    than it holds: the bound gives way, a sparse file's hole passes too."""
    folder = tmp_path / "sharded"
    dcp.save({"embedding": torch.ones(1024, 1024)}, checkpoint_id=folder, no_dist=True)
    (shard,) = folder.glob("*.distcp")
    size = shard.stat().st_size
    os.truncate(shard, 0)
    os.truncate(shard, size)
    read_metadata(folder)


def test_checkpoint_bytes_is_checked_and_free_to_change_between_attempts(
    compose_config: Callable[..., DictConfig],
) -> None:
    check_config(compose_config("train", ["checkpoint_bytes=apparent"]))
    with pytest.raises(ConfigError, match="checkpoint_bytes='blocks' is not valid: use allocated"):
        check_config(compose_config("train", ["checkpoint_bytes=blocks"]))
    eval_config = yaml.safe_load((PROJECT_ROOT / "conf" / "eval.yaml").read_text())
    assert eval_config["checkpoint_bytes"] == "allocated"
    # a named run on ZFS is continued with the key added, as the same run (volt.runs.resume)
    hydra = yaml.safe_load((PROJECT_ROOT / "conf" / "hydra" / "default.yaml").read_text())
    assert "checkpoint_bytes" in hydra["job"]["config"]["override_dirname"]["exclude_keys"]


def test_a_stored_generation_length_above_its_cap_is_refused() -> None:
    model = {"_target_": "volt.models.language_model.LanguageModel", "max_new_tokens": 10**9}
    with pytest.raises(ConfigError, match=r"model\.max_new_tokens=1000000000 is more than"):
        _check_caps(model, "model", STORED_CAPS)
    _check_caps(model, "model", {"max_new_tokens": 10**9})  # raised on the command line
    # the control: nothing else bounds it; the model generates what it was given
    _check_caps(model, "model", {})


def test_eval_has_a_command_line_key_for_every_cap() -> None:
    config = yaml.safe_load((PROJECT_ROOT / "conf" / "eval.yaml").read_text())
    assert {key: config[key] for key in STORED_CAPS} == STORED_CAPS


def test_a_layer_whose_first_output_exceeds_the_weights_budget_is_refused_before_it_runs() -> None:
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 1, 3), torch.nn.ZeroPad2d(padding=600))
    batch = torch.zeros(64, 1, 28, 28)
    budget = 256 * 2**20
    bound_first_forward(net, budget)
    with pytest.raises(ConfigError, match=r"makes 1 \(ZeroPad2d\) an output of 3\d\d MiB"):
        net(batch)
    # a net within the budget runs, and the bound is gone after its first forward
    small = torch.nn.Sequential(torch.nn.Conv2d(1, 1, 3), torch.nn.ZeroPad2d(padding=2))
    bound_first_forward(small, budget)
    small(batch)
    assert not any(m._forward_pre_hooks for m in small.modules())
    # the control: unbounded, the first forward takes the memory
    assert torch.nn.ZeroPad2d(padding=600)(batch).nbytes > budget


# A GPT of two steps whose checkpoint asks for 10**9 new tokens at predict.
TINY_GPT = [
    "experiment=gpt_bytes_tiny",
    "trainer=cpu",
    "name=gpt",
    "trainer.max_steps=2",
    "model.scheduler.max_steps=-1",
    "data.steps_per_epoch=2",
    "trainer.limit_val_batches=1",
    "model.max_new_tokens=1000000000",
    "callbacks.text_samples=null",
    "callbacks.progress_bar=null",
    "logger=none",
    "test=false",
]


def start_endless_prediction(outputs: Path, *patch: str) -> tuple[subprocess.Popen[str], Path]:
    """`python -m volt.eval ckpt_path=... mode=predict` of a tiny GPT whose checkpoint asks for
    10**9 new tokens (the cap raised on the command line), once it predicts; `patch`: Python
    lines run before volt.eval is imported."""
    (checkpoint,) = (outputs / "train" / "runs" / "gpt" / "checkpoints").glob("last.ckpt")
    start = "; ".join(
        [*patch, "import runpy", "runpy.run_module('volt.eval', run_name='__main__')"]
    )
    command = [sys.executable, "-c", start, f"ckpt_path={checkpoint}", "mode=predict"]
    command += ["max_new_tokens=1000000000", "callbacks=none", f"paths.outputs_dir={outputs}"]
    process = subprocess.Popen(
        command, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    # Predicting once predictions.csv's staged file (volt.folder_files.replacing) is there, seen
    # twice half a second apart: the records' staged files last microseconds.
    deadline, staged = time.monotonic() + 180, "eval/runs/*/.volt-*.tmp"
    seen: set[Path] = set()
    while not seen & (now := set(outputs.glob(staged))):
        assert process.poll() is None and time.monotonic() < deadline, process.stdout
        seen = now
        time.sleep(0.5)
    time.sleep(2)  # into the generation loop
    for each in outputs.glob(staged):
        each.unlink()  # so that the next prediction's wait sees its own
    return process, checkpoint


@pytest.mark.slow  # trains a tiny GPT, then two predictions of 10**9 tokens: about 2 minutes
@pytest.mark.timeout(600)
def test_predict_stops_within_30_s_of_sigterm_with_volts_line(
    run_volt_here: RunHere, tmp_path: Path
) -> None:
    # The training and the refusal in the test's process; the predictions, signalled, in their own.
    outputs = tmp_path / "outputs"
    trained = run_volt_here(TINY_GPT)
    assert trained.returncode == 0, trained.stderr[-3000:]
    # the stored length, above eval's cap, is refused in one line; raised, it runs (below)
    (checkpoint,) = (outputs / "train" / "runs" / "gpt" / "checkpoints").glob("last.ckpt")
    refused = run_volt_here([f"ckpt_path={checkpoint}"], module="volt.eval")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "volt: config error: model.max_new_tokens=1000000000 is more than max_new_tokens=1024"
        " allows: the checkpoint sets it, and it costs time or memory its weights do not show;"
        " add max_new_tokens=1000000000 to the command if you trust the file"
    ], refused.stderr[-3000:]
    process, _ = start_endless_prediction(outputs)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=30)  # the console's lines and stderr's
    assert process.returncode == 128 + signal.SIGTERM, output[-3000:]
    said = " ".join(output.split())  # rich wraps the console's lines
    assert "Stopped on SIGTERM while evaluating: the same command starts it again" in said
    # the control: with Lightning's handler alone, the prediction goes on
    patch = "import contextlib, volt.runs.stop_signals as s"
    off = "s.stop_on_signals = lambda *a, **k: contextlib.nullcontext(s.RunStopper(None, False))"
    process, _ = start_endless_prediction(outputs, patch, off)
    process.send_signal(signal.SIGTERM)
    time.sleep(30)
    assert process.poll() is None
    process.kill()
    process.communicate()
