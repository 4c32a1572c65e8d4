"""trainer=fsdp's sharded checkpoints with real ranks (CPU processes over gloo, started by volt):
each rank writes its own shards, no rank the whole; a run saved on N ranks resumes on M with
exactly the state it saved, and trains on as from a single-file checkpoint; eval reads the
folder in one process."""

import csv
import json
import subprocess
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from omegaconf import DictConfig
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from tests.strategies.test_fsdp import PROBES, TINY, as_lists
from volt import rebuild
from volt.checkpointing import read_sharded_weights
from volt.checkpointing.dcp_reading import CheckedReader, WeightsOnlyLoadPlanner, read_metadata
from volt.errors import ConfigError
from volt.strategies.fsdp import FSDPStrategy

Run = Callable[..., subprocess.CompletedProcess[str]]

# Stopped after its first epoch (3 steps), then resumed to 6; the step-3 state read back as
# every rank restored it (SaveWhenTrainingStarts writes it again, sharded, as training starts).
RESUMABLE = [
    *TINY,
    "model.scheduler.max_steps=6",
    "callbacks.early_stopping=null",  # volt's check at a restored epoch end: see test_fsdp
    "test=false",
    "callbacks.text_samples=null",
    "logger=csv",
    "trainer.log_every_n_steps=1",
    "trusted_targets=[tests]",
    f"+callbacks.restored={{_target_:{PROBES}.SaveWhenTrainingStarts}}",
]


# The same without the probe: its save before the first step initialises AdamW's state (torch's
# get_optimizer_state_dict takes a step with zero gradients, so AdamW's step count starts at 1).
CURVE = [option for option in RESUMABLE if "SaveWhenTrainingStarts" not in option]


def read_whole(folder: Path) -> dict[str, Any]:
    """Everything a sharded checkpoint holds, optimiser states too, read in this one process
    through volt's checked reader: meta.pt's entries, then DCP's, nested again by the path each
    flattened key came from (its metadata's planner_data)."""
    metadata = read_metadata(folder)
    flat: dict[str, Any] = {
        key: torch.empty(entry.size, dtype=entry.properties.dtype)
        if isinstance(entry, TensorStorageMetadata)
        else None
        for key, entry in metadata.state_dict_metadata.items()
    }
    with warnings.catch_warnings():  # DCP's note that it reads in one process: it does
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(flat, storage_reader=CheckedReader(folder), no_dist=True,
                 planner=WeightsOnlyLoadPlanner(flatten_state_dict=False))  # fmt: skip
    whole = torch.load(folder / "meta.pt", weights_only=True)
    for key, value in flat.items():
        *parents, last = metadata.planner_data[key]
        node = whole
        for step in parents:
            node = node.setdefault(step, {})
        node[last] = value
    return whole


def assert_same_state(saved: dict[str, Any], restored: dict[str, Any]) -> None:
    assert saved["global_step"] == restored["global_step"] == 3
    assert saved["epoch"] == restored["epoch"]
    # Parameters, and state kept otherwise: the best bpb so far (a torchmetrics metric).
    assert saved["state_dict"].keys() == restored["state_dict"].keys()
    assert "val_bpb_best.min_value" in saved["state_dict"]
    for key, value in saved["state_dict"].items():
        assert torch.equal(value, restored["state_dict"][key]), key
    # AdamW's moments and step, keyed by parameter name, and its groups' settings.
    before, after = saved["optimizer_0"], restored["optimizer_0"]
    assert before["state"].keys() == after["state"].keys()
    for name, moments in before["state"].items():
        for kind, value in moments.items():
            assert torch.equal(value, after["state"][name][kind]), (name, kind)
    assert as_lists(before["param_groups"]) == as_lists(after["param_groups"])
    assert saved["lr_schedulers"] == restored["lr_schedulers"]
    assert saved["loops"]["fit_loop"]["epoch_progress"] == restored["loops"]["fit_loop"][
        "epoch_progress"]  # fmt: skip
    assert saved["callbacks"].keys() == restored["callbacks"].keys()


def shards(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.distcp"))


def losses(run_dir: Path, since: int = 0) -> dict[int, float]:
    """train/loss by step from `since` on, as the CSV logger wrote it (a resumed attempt appends
    its rows after the earlier attempts': volt.loggers.csv_log)."""
    with (run_dir / "csv" / "metrics.csv").open() as file:
        rows = [row for row in csv.DictReader(file) if row.get("train/loss")]
    return {int(row["step"]): float(row["train/loss"]) for row in rows if int(row["step"]) >= since}


@pytest.mark.slow
# As volt.eval does: the training callbacks the checkpoint names are not needed to test.
@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`, callbacks")
def test_each_rank_writes_its_shards_and_eval_reads_the_folder(
    run_volt: Run, tmp_path: Path, compose_config: Callable[..., DictConfig]
) -> None:
    result = run_volt([*TINY, "name=sharded"])
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "outputs" / "train" / "runs" / "sharded"
    trained = json.loads((run_dir / "metrics.json").read_text())
    best = Path(trained["best_checkpoint"])
    # One folder per checkpoint, the best's replaced by a better one (top-k removal), nothing
    # else left beside them.
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [best.name, "last.ckpt"]
    assert sorted(p.name for p in best.iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]  # fmt: skip
    # Each rank wrote about half of the weights and optimiser states: its own shards, not
    # the whole state gathered; meta.pt holds the rest and no weights.
    entries = read_metadata(best).state_dict_metadata.values()
    tensors = [e for e in entries if isinstance(e, TensorStorageMetadata)]
    declared = sum(e.size.numel() * e.properties.dtype.itemsize for e in tensors)
    for shard in shards(best):
        assert 0.3 * declared < (best / shard).stat().st_size < 0.7 * declared, shard
    meta = torch.load(best / "meta.pt", weights_only=True)
    assert "state_dict" not in meta and "optimizer_states" not in meta
    assert (best / "meta.pt").stat().st_size < 0.05 * declared
    weights = read_sharded_weights(best)
    assert weights["net.blocks.0.attn.qkv.weight"].shape == (384, 128)
    assert torch.equal(weights["net.lm_head.weight"], weights["net.tok_emb.weight"])

    # Eval in one process, no process group: what `python -m volt.eval` runs after its checks.
    cfg = compose_config("eval", [f"ckpt_path={best}", "trainer.limit_test_batches=2",
                                  "callbacks.progress_bar=null"])  # fmt: skip
    run = rebuild.build_evaluation(cfg, rebuild.read_evaluated_run(cfg))
    (result,) = run.trainer.test(run.model, datamodule=run.datamodule, ckpt_path=best)
    # The same 16 windows as the run's own test on two ranks (see test_fsdp).
    assert result["test/bpb"] == pytest.approx(trained["metrics"]["test/bpb"], rel=1e-5)
    module, _ = rebuild.load_trained_module(best)
    assert all(torch.equal(v, weights[k]) for k, v in module.state_dict().items())


@pytest.mark.slow
@pytest.mark.parametrize(("saved_on", "resumed_on"), [(2, 1), (1, 2)], ids=["2 to 1", "1 to 2"])
def test_a_run_saved_on_n_ranks_resumes_on_m_with_the_state_it_saved(
    saved_on: int, resumed_on: int, run_volt: Run, tmp_path: Path
) -> None:
    stopped = run_volt(
        [*RESUMABLE, "name=reshard", f"trainer.devices={saved_on}", "trainer.max_steps=3"]
    )
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    run_dir = tmp_path / "outputs" / "train" / "runs" / "reshard"
    last = run_dir / "checkpoints" / "last.ckpt"
    assert len(shards(last)) == saved_on
    saved = read_whole(last)
    (run_dir / "metrics.json").unlink()  # as if killed after its step-3 checkpoint
    resumed = run_volt([*RESUMABLE, "name=reshard", f"trainer.devices={resumed_on}"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming run reshard from" in (run_dir / "train.log").read_text()
    restored = run_dir / "restored.ckpt"
    assert len(shards(restored)) == resumed_on  # written again by the ranks that restored it
    assert_same_state(saved, read_whole(restored))
    assert torch.load(last / "meta.pt", weights_only=True)["global_step"] == 6
    # This attempt trained steps 4-6 (see below on the steps), after the first attempt's rows.
    assert len(losses(run_dir, since=3)) == 3 and len(losses(run_dir)) == 6


@pytest.mark.slow
def test_a_sharded_resume_trains_on_exactly_as_a_single_file_resume(
    run_volt: Run, tmp_path: Path
) -> None:
    """The same losses after a resume from a folder as from one file. (Neither matches a run
    never stopped past the first resumed step: under Lightning 2.6.6 the step-interval
    learning-rate schedule resumes one step ahead, with trainer=cpu and single files as well;
    the restored state itself is exact, as the test above shows.)"""
    runs = tmp_path / "outputs" / "train" / "runs"
    resumed = {}
    for layout in ("sharded", "full"):
        layout_run = [*CURVE, f"name={layout}", f"trainer.strategy.checkpoint={layout}"]
        stopped = run_volt([*layout_run, "trainer.max_steps=3"])
        assert stopped.returncode == 0, stopped.stderr[-3000:]
        (runs / layout / "metrics.json").unlink()
        finished = run_volt(layout_run)
        assert finished.returncode == 0, finished.stderr[-3000:]
        resumed[layout] = losses(runs / layout, since=3)
    assert len(resumed["sharded"]) == 3
    assert resumed["sharded"] == pytest.approx(resumed["full"], rel=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
# As volt.eval does: the training callbacks the checkpoint names are not needed to test.
@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`, callbacks")
def test_one_gpu_saves_sharded_resumes_and_evals(
    run_volt: Run, tmp_path: Path, compose_config: Callable[..., DictConfig]
) -> None:
    """The sharded default on one GPU in bf16-mixed: GPU shards staged through host memory."""
    gpu = [
        *TINY,
        "trainer.devices=1",
        "precision=bf16-mixed",
        "data.batch_size=32",
        "trainer.limit_val_batches=4",
        "callbacks.early_stopping=null",  # volt's check at a restored epoch end: see test_fsdp
        "name=gpu",
    ]
    assert run_volt([*gpu, "trainer.max_steps=3"]).returncode == 0
    run_dir = tmp_path / "outputs" / "train" / "runs" / "gpu"
    (run_dir / "metrics.json").unlink()  # as if killed after its step-3 checkpoint
    result = run_volt(gpu)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming run gpu from" in (run_dir / "train.log").read_text()
    last = run_dir / "checkpoints" / "last.ckpt"
    assert shards(last) == ["__0_0.distcp"]
    assert torch.load(last / "meta.pt", weights_only=True)["global_step"] == 6
    trained = json.loads((run_dir / "metrics.json").read_text())
    best = trained["best_checkpoint"]
    cfg = compose_config("eval", [f"ckpt_path={best}", "trainer.limit_test_batches=2",
                                  "callbacks.progress_bar=null"])  # fmt: skip
    run = rebuild.build_evaluation(cfg, rebuild.read_evaluated_run(cfg))
    (evaluated,) = run.trainer.test(run.model, datamodule=run.datamodule, ckpt_path=best)
    # One device in both: the same weights on the same test batches.
    assert evaluated["test/bpb"] == pytest.approx(trained["metrics"]["test/bpb"], rel=1e-2)


def test_sharded_is_the_default_and_another_layout_is_refused(
    compose_config: Callable[..., DictConfig],
) -> None:
    cfg = compose_config("train", ["trainer=fsdp"])
    assert cfg.trainer.strategy.checkpoint == "sharded"
    refusal = "checkpoint='shards' is not valid: use sharded"
    with pytest.raises(ConfigError, match=refusal) as caught:
        FSDPStrategy(rank_config="config_resolved.yaml", checkpoint="shards")
    assert "trainer.strategy.checkpoint=full" in str(caught.value)
