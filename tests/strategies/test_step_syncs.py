"""Under trainer=ddp no volt code makes a training step wait for the device or start a collective,
beyond the checks that FiniteGuard and GracefulShutdown make every 10 steps (and the
collectives of the SyncBatchNorm layers that `sync_batchnorm: true` asks for): counted by
`tests.sync_counter` in real runs of `python train.py trainer=ddp` over two CPU processes (gloo),
with the default callbacks and logger. A control run shows that the counter sees such checks
made every step, and an `.item()` and an all-reduce injected into the step."""

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.sync_counter import per_step, read_counts

Run = Callable[..., subprocess.CompletedProcess[str]]

CPU_DDP = [
    "trainer=ddp",
    "trainer.devices=2",
    "trainer.accelerator=cpu",  # gloo on a GPU machine too
    "trainer.max_epochs=1",
    "data.batch_size=32",  # 16 per rank: 39 steps in the epoch, the counted ones among them
    "test=false",
    "trusted_targets=[tests]",  # the counter is the tests' own callback
]
START, STEPS = 5, 30  # the counted global steps: 5 .. 34
EVERY = 10  # FiniteGuard's and GracefulShutdown's default interval, as conf/callbacks sets it
BATCHNORM_LAYERS = 2  # the default MLP's, each all-gathers forward and all-reduces backward
# What volt does at a check step (global step + 1 a multiple of EVERY), by file.
AT_CHECKS = {
    "volt/callbacks/finite_guard.py": {"syncs": {"tolist": 1}},
    "volt/callbacks/graceful_shutdown.py": {"syncs": {"_local_scalar_dense": 1}},
    "volt/collectives.py": {"collectives": {"all_reduce": 2}},  # for the two callbacks above
}


def counted_run(run_volt: Run, tmp_path: Path, *overrides: str) -> list[dict[str, Any]]:
    """Each rank's counts over global steps START .. START + STEPS - 1."""
    path = tmp_path / "syncs.json"
    counter = (
        "+callbacks.sync_counter={_target_:tests.sync_counter.SyncCounter,"
        f"path:{path},start_step:{START},steps:{STEPS}}}"
    )
    result = run_volt([*CPU_DDP, counter, *overrides])
    assert result.returncode == 0, result.stderr[-3000:]
    records = [read_counts(path, rank) for rank in (0, 1)]
    for record in records:
        assert record["complete"] and record["world_size"] == 2
        assert [s["step"] for s in record["steps"]] == list(range(START, START + STEPS))
    return records


def volt_files(record: dict[str, Any]) -> set[str]:
    """The files of volt's own code that waited or started a collective in the counted steps."""
    keys = {
        key for step in record["steps"] for kind in ("syncs", "collectives") for key in step[kind]
    }
    return {key.split(":")[0] for key in keys if key.startswith("volt/")}


@pytest.mark.slow
@pytest.mark.parametrize(
    "data", [[], ["data.on_device=true"]], ids=["dataloader", "data-on-device"]
)
def test_volt_adds_no_sync_or_collective_to_a_ddp_training_step(
    data: list[str], run_volt: Run, tmp_path: Path
) -> None:
    for record in counted_run(run_volt, tmp_path, *data):
        rank = record["rank"]
        steps = [s["step"] for s in record["steps"]]
        # The progress bar reads the loss on rank 0 (the only rank that shows one) after the
        # batches at which Lightning writes the logs, at most twice a second.
        bar = "volt/callbacks/progress_bar.py"
        assert volt_files(record) <= {*AT_CHECKS, "volt/strategies/sync_batchnorm.py", bar}
        batchnorm = per_step(record, "collectives", "volt/strategies/sync_batchnorm.py")
        assert all(
            bn == {"all_gather_into_tensor": BATCHNORM_LAYERS, "all_reduce": BATCHNORM_LAYERS}
            for bn in batchnorm
        )
        assert not any(per_step(record, "syncs", "volt/strategies/sync_batchnorm.py"))
        for file, kinds in AT_CHECKS.items():
            for kind, at_checks in kinds.items():
                for step, done in zip(steps, per_step(record, kind, file), strict=True):
                    expected = at_checks if (step + 1) % EVERY == 0 else {}
                    assert done == expected, (rank, step, file, kind)
        for step, read in zip(steps, per_step(record, "syncs", bar), strict=True):
            allowed = (
                [{}, {"_local_scalar_dense": 1}] if rank == 0 and (step + 1) % EVERY == 0 else [{}]
            )
            assert read in allowed, (rank, step, read)
        # Lightning's own per-step broadcast of its SIGTERM flag (`dist.broadcast`) stays switched
        # off (GracefulShutdown). What Lightning still starts every step is DDP's broadcast of the
        # BatchNorm buffers (`_broadcast_coalesced`: DDP's broadcast_buffers=True).
        lightning = per_step(record, "collectives", "lightning")
        assert all("broadcast" not in talks for talks in lightning), lightning


@pytest.mark.slow
def test_the_counter_sees_checks_made_every_step_and_injected_syncs(
    run_volt: Run, tmp_path: Path
) -> None:
    records = counted_run(
        run_volt,
        tmp_path,
        "callbacks.finite_guard.check_every_n_steps=1",
        "callbacks.graceful_shutdown.agree_every_n_steps=1",
        "+callbacks.inject={_target_:tests.sync_counter.InjectSyncs}",
    )
    for record in records:
        for file, kinds in AT_CHECKS.items():
            for kind, at_checks in kinds.items():
                assert per_step(record, kind, file) == [at_checks] * STEPS, (file, kind)
        injected = "other:" + str(Path(__file__).resolve().parent.parent / "sync_counter.py")
        assert per_step(record, "syncs", injected) == [{"_local_scalar_dense": 1}] * STEPS
        assert per_step(record, "collectives", injected) == [{"all_reduce": 1}] * STEPS
