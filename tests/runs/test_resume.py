"""Named runs survive SIGKILL: re-running the same command continues from the newest complete
checkpoint and ends with exactly the weights of a run that was never stopped. Only the attempts
that are killed, and the DDP run's, need processes of their own: the others run in the test's
(run_volt_here), which saves a fresh interpreter's torch import each."""

import copy
import gc
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import volt.runs.resume
from tests.in_process import RunHere
from tests.named_runs import steps_overrides
from volt.config import PROJECT_ROOT

# Deterministic CPU training with a checkpoint after every step; dropout on, so the RNG state
# matters; no early stopping (its decision would only repeat the weights' story).
COMMAND = [
    "trainer=cpu",
    "trainer.max_epochs=3",
    "trainer.deterministic=true",
    "callbacks.last_checkpoint.every_n_train_steps=1",
    "callbacks.early_stopping=null",
    "callbacks.progress_bar=null",
    "callbacks.model_summary=null",
    "logger=csv",
    "test=false",
]


def start(name: str, outputs: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "train.py",
            f"name={name}",
            *COMMAND,
            *extra,
            f"paths.outputs_dir={outputs}",
        ],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def train_here(run_volt_here: RunHere, name: str, *extra: str) -> str:
    """Runs `python train.py name=NAME <COMMAND> ...` in this process: what it said."""
    result = run_volt_here([f"name={name}", *COMMAND, *extra])
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


def finish(process: subprocess.Popen[str]) -> str:
    out, err = process.communicate(timeout=240)
    assert process.returncode == 0, err[-3000:]
    return out + err


def final_state(outputs: Path, name: str) -> dict[str, torch.Tensor]:
    last = outputs / "train" / "runs" / name / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["global_step"] == 3 * 19
    return checkpoint["state_dict"]


def kill_after(process: subprocess.Popen[str], checkpoints: Path, steps: int) -> None:
    """SIGKILL once the run has written `steps` checkpoints' worth of progress (or at once if 0)."""
    deadline = time.monotonic() + 120
    while steps and time.monotonic() < deadline:
        last = checkpoints / "last.ckpt"
        if last.is_file():
            try:
                step = torch.load(last, weights_only=True, map_location="meta")["global_step"]
            except Exception:  # caught between the temporary file and the rename: try again
                step = -1
            if step >= steps:
                break
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()


# Three kills is `make test-slow`'s (about a minute of fresh runs): the default suite's mid-epoch
# case makes the same checks after one kill.
@pytest.mark.parametrize(
    "kill_at_steps",
    [[7], pytest.param([0, 25, 40], marks=pytest.mark.slow)],
    ids=["mid-epoch", "three-kills"],
)
def test_killed_and_resumed_equals_uninterrupted(
    kill_at_steps: list[int], run_volt_here: RunHere, tmp_path: Path
) -> None:
    outputs = tmp_path / "outputs"
    train_here(run_volt_here, "reference")
    checkpoints = outputs / "train" / "runs" / "interrupted" / "checkpoints"
    for steps in kill_at_steps:
        kill_after(start("interrupted", outputs), checkpoints, steps)
    log = train_here(run_volt_here, "interrupted")
    assert "resuming run interrupted from" in log
    # Lightning's "dataloader is not resumable ... unreliable results" is not true of volt's data,
    # nor its warning that the run's checkpoint folder holds checkpoints.
    assert "not resumable" not in log and "Checkpoint directory" not in log
    said = (outputs / "train" / "runs" / "interrupted" / "train.log").read_text()
    # run.json keeps each killed attempt's record, oldest first, beside this one's outcome (one
    # killed at once may have written none).
    record = json.loads((outputs / "train" / "runs" / "interrupted" / "run.json").read_text())
    assert record["status"] == "completed"
    attempts = [a["status"] for a in record["attempts"]]
    assert attempts == ["running"] * len(attempts) and 1 <= len(attempts) <= len(kill_at_steps)
    assert "DigitsDataModule continues where the checkpoint stopped, mid-epoch too" in said
    reference, resumed = final_state(outputs, "reference"), final_state(outputs, "interrupted")
    assert reference.keys() == resumed.keys()
    for key in reference:
        assert torch.equal(reference[key], resumed[key]), key


def test_finished_run_is_not_trained_again(run_volt_here: RunHere, tmp_path: Path) -> None:
    run_dir = tmp_path / "outputs" / "train" / "runs" / "done"
    train_here(run_volt_here, "done", "trainer.max_epochs=1")
    before = (run_dir / "checkpoints" / "last.ckpt").stat().st_mtime_ns
    log = train_here(run_volt_here, "done", "trainer.max_epochs=1")
    assert "already finished" in log
    assert (run_dir / "checkpoints" / "last.ckpt").stat().st_mtime_ns == before
    assert json.loads((run_dir / "metrics.json").read_text())["status"] == "completed"


def test_named_ddp_run_continues_on_every_rank(tmp_path: Path) -> None:
    """Both CPU ranks pick up the same checkpoint: training goes on from its step, not from 0."""
    outputs = tmp_path / "outputs"
    # max_steps may change between attempts (max_epochs may not: the LR schedule depends on it)
    finish(start("ddp-run", outputs, "trainer=ddp", "trainer.max_epochs=2", "trainer.max_steps=19"))
    run_dir = outputs / "train" / "runs" / "ddp-run"
    (run_dir / "metrics.json").unlink()  # as if killed after the last checkpoint
    log = finish(start("ddp-run", outputs, "trainer=ddp", "trainer.max_epochs=2"))
    assert "resuming run ddp-run from" in log
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    steps_per_epoch = 1258 // 64  # 2 ranks x 32 samples a step
    assert last["global_step"] == 2 * steps_per_epoch
    assert "resuming run ddp-run" in (run_dir / "train_rank1.log").read_text()


def test_damaged_last_checkpoint_falls_back_to_the_previous_good_one(
    run_volt_here: RunHere, tmp_path: Path
) -> None:
    train_here(run_volt_here, "torn", "trainer.max_epochs=2", "trainer.max_steps=19")
    checkpoints = tmp_path / "outputs" / "train" / "runs" / "torn" / "checkpoints"
    (checkpoints.parent / "metrics.json").unlink()  # as if killed
    (checkpoints / "last.ckpt").write_bytes(b"torn by a crash")
    best = next(checkpoints.glob("epoch*.ckpt"))  # the previous complete checkpoint
    train_here(run_volt_here, "torn", "trainer.max_epochs=2")
    log = (checkpoints.parent / "train.log").read_text()  # the file: no console line wrapping
    assert f"skipping damaged checkpoint {checkpoints / 'last.ckpt'}" in log
    assert f"resuming run torn from {best}" in log
    assert torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"] == 2 * 19


def test_links_within_a_run_directory_are_kept_and_links_out_refused(tmp_path: Path) -> None:
    """W&B's links (inside the run, and to its cache) are W&B's; a link out of a folder volt
    writes in would carry volt's writes."""
    from volt.errors import ConfigError
    from volt.folder_files import check_folder

    run_dir = tmp_path / "run"
    (run_dir / "wandb" / "run-1" / "logs").mkdir(parents=True)
    (run_dir / "wandb" / "latest-run").symlink_to("run-1")
    (run_dir / "wandb" / "run-1" / "logs" / "core.log").symlink_to(tmp_path / "cache.log")
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "best.ckpt").symlink_to("last.ckpt")
    check_folder(run_dir, "name=run")
    (run_dir / "checkpoints" / "escape").symlink_to(tmp_path)
    with pytest.raises(ConfigError, match=r"is a symbolic link to .*, outside the folder"):
        check_folder(run_dir, "name=run")


def changed_weights(change: str) -> Callable[[dict[str, torch.Tensor]], None]:
    """What a checkpoint's state_dict looks like to a net whose code changed since."""

    def apply(weights: dict[str, torch.Tensor]) -> None:
        if change == "unexpected":  # a layer the net no longer has
            weights["net.head.weight"] = torch.zeros(2, 2)
        elif change == "missing":  # a layer added since
            del weights["net.layers.9.bias"]
        else:  # a layer made wider
            weights["net.layers.9.weight"] = torch.zeros(12, 256)

    return apply


def folder_as_it_is(folder: Path) -> dict[Path, tuple[bytes | None, int]]:
    """Every entry under `folder`: a file's bytes (None for a folder) and its modification time."""
    return {
        path: (path.read_bytes() if path.is_file() else None, path.lstat().st_mtime_ns)
        for path in [folder, *folder.rglob("*")]
    }


def test_weights_the_model_does_not_fit_are_refused_before_the_fit(
    run_volt_here: RunHere, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One line, exit 2, naming the checkpoint, the names and the fix, before anything in the run's
    folder is written: its checkpoint, records, .hydra/ and train.log are left as they were, to
    resume once the code is back. The control: torch's traceback from inside the fit."""
    run_dir = tmp_path / "outputs" / "train" / "runs" / "changed"
    done = run_volt_here(steps_overrides("changed", 1))
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir / "metrics.json").unlink()  # as if stopped
    last = run_dir / "checkpoints" / "last.ckpt"
    genuine = torch.load(last, weights_only=True)
    said = {
        "unexpected": "not in the model: net.head.weight)",
        "missing": "not in the file: net.layers.9.bias)",
        "shape": "other shapes: net.layers.9.weight (12, 256) in the file, (10, 256) in the model)",
    }
    for change, names in said.items():
        crafted = copy.deepcopy(genuine)
        changed_weights(change)(crafted["state_dict"])
        torch.save(crafted, last)
        before = folder_as_it_is(run_dir)
        gc.collect()  # the refused attempt's run lock, which a process's exit would let go
        done = run_volt_here(steps_overrides("changed", 2))
        assert done.returncode == 2, done.stderr[-3000:]
        (line,) = [line for line in done.stderr.splitlines() if line.startswith("volt: ")]
        assert line.startswith(f"volt: config error: {last}: its state_dict does not fit"), line
        assert names in line and "start afresh under another name=..." in line, line
        assert folder_as_it_is(run_dir) == before
    # the control: without the check, torch's load_state_dict fails inside the fit
    monkeypatch.setattr(volt.runs.resume, "weights_disagreement", lambda *args, **kwargs: "")
    gc.collect()
    done = run_volt_here(steps_overrides("changed", 2))
    assert done.returncode == 1 and "Error(s) in loading state_dict" in done.stderr, done.stderr


def test_the_resume_check_builds_the_model_as_its_job_will(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hydra's callback checks a resume before Hydra's run_job sets the job's runtime, which
    `${paths.output_dir}` reads: a model or data section that names the run's folder resolves as
    in the job, and Hydra's global config is put back."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf.errors import InterpolationResolutionError

    from volt.config import CONF_DIR
    from volt.config.composition import VERSION_BASE
    from volt.hydra_callbacks import as_the_job_sees_it

    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        overrides = ["name=here", f"paths.outputs_dir={tmp_path}"]
        config = compose("train", overrides=overrides, return_hydra_config=True)
    GlobalHydra.instance().clear()
    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)  # as on_run_start finds it
    with pytest.raises(InterpolationResolutionError, match="HydraConfig was not set"):
        str(config.paths.output_dir)
    with as_the_job_sees_it(config, Path(config.hydra.run.dir)) as job:
        assert job.paths.output_dir == str(tmp_path / "train" / "runs" / "here")
    assert HydraConfig.instance().cfg is None


def test_a_module_that_cannot_be_built_on_the_meta_device_still_resumes(
    run_volt_here: RunHere, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's module whose __init__ reads a value cannot be built on the meta device, where the
    callback checks a resume first: the run builds it for real and checks it there."""
    import volt.hydra_callbacks

    done = run_volt_here(steps_overrides("meta", 1))
    assert done.returncode == 0, done.stderr[-3000:]
    (tmp_path / "outputs" / "train" / "runs" / "meta" / "metrics.json").unlink()  # as if stopped

    def reads_a_value(*args: object) -> None:
        raise RuntimeError("Tensor.item() cannot be called on meta tensors")

    monkeypatch.setattr(volt.hydra_callbacks, "build_model_outline", reads_a_value)
    gc.collect()  # the first attempt's run lock, which a process's exit would let go
    done = run_volt_here(steps_overrides("meta", 2))
    assert done.returncode == 0, done.stderr[-3000:]
    log = (tmp_path / "outputs" / "train" / "runs" / "meta" / "train.log").read_text()
    assert "resuming run meta from" in log
