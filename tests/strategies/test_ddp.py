"""trainer=ddp as a user runs it: real DDP over two CPU processes (gloo), started by volt or by
torchrun, in single runs and sweeps, and with a rank that fails."""

import errno
import json
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from volt.strategies.launcher import (
    CRASHED_RANK_EXIT_S,
    RANK_ZERO_GRACE_S,
    reserve_rendezvous_port,
)

Run = Callable[..., subprocess.CompletedProcess[str]]

QUICK = [
    "trainer=ddp",
    "trainer.devices=2",  # what trainer=ddp picks with no GPU; two ranks on a GPU machine too
    "trainer.max_epochs=1",
    "callbacks.progress_bar=null",
    "callbacks.model_summary=null",
    "trusted_targets=[tests]",  # the probes below are the tests' own callbacks
]
PROBES = "tests.strategies.rank_probes"
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")


def only_dir(parent: Path) -> Path:
    children = [p for p in parent.iterdir() if p.is_dir()]
    assert len(children) == 1, children
    return children[0]


def processes_mentioning(text: str) -> list[str]:
    """Command lines of the live processes whose command line contains `text`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # ended while we looked
            continue
        if text in args:
            found.append(args)
    return found


def assert_one_ddp_run(run_dir: Path) -> None:
    metrics = json.loads((run_dir / "metrics.json").read_text())["metrics"]
    assert metrics["test/acc"] > 0.8
    rank0_log = (run_dir / "train.log").read_text()
    rank1_log = (run_dir / "train_rank1.log").read_text()
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in rank0_log
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in rank1_log
    assert "DDP on the CPU" not in rank1_log  # said once, by rank 0
    assert sorted(p.name for p in run_dir.glob("train*.log")) == ["train.log", "train_rank1.log"]
    # Only rank 0 writes checkpoints: one best and one last, as in a single-device run.
    assert len(list((run_dir / "checkpoints").glob("epoch*.ckpt"))) == 1
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()


def test_ddp_config_asks_for_two_cpu_processes_or_torchruns(
    compose_config: Callable[..., DictConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    cfg = compose_config("train", ["trainer=ddp"])
    assert cfg.trainer.devices == 2
    assert cfg.trainer.sync_batchnorm is True
    assert cfg.trainer.strategy.rank_config == f"{cfg.paths.output_dir}/config_resolved.yaml"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")  # what torchrun --nproc_per_node=3 sets
    assert compose_config("train", ["trainer=ddp"]).trainer.devices == 3


def test_mission_command_runs_ddp_over_two_cpu_processes(run_volt: Run, tmp_path: Path) -> None:
    probe = f"+callbacks.bn_probe={{_target_:{PROBES}.RecordBatchNorm}}"
    result = run_volt([*QUICK, "precision=16-mixed", probe])
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_dir(tmp_path / "outputs" / "train" / "runs")
    assert_one_ddp_run(run_dir)
    said = result.stdout + result.stderr
    # Lightning's sync_dist advice does not apply to volt's own per-epoch values; its lines of
    # each rank joining and of the backend are for train.log (assert_one_ddp_run reads them).
    assert "sync_dist=True" not in said
    assert "Initializing distributed" not in said and "All distributed processes" not in said
    # The MLP's BatchNorm layers ran synchronised on both ranks (sync_batchnorm: true).
    ranks = [torch.load(run_dir / f"batchnorm_rank{rank}.pt") for rank in (0, 1)]
    for record in ranks:
        assert record["classes"] == ["volt.strategies.sync_batchnorm.SyncBatchNorm"]
    for mean0, mean1 in zip(ranks[0]["running_means"], ranks[1]["running_means"], strict=True):
        torch.testing.assert_close(mean0, mean1)
    if not torch.cuda.is_available():
        line = "DDP on the CPU (no GPU visible): 2 processes over gloo"
        assert (run_dir / "train.log").read_text().count(line) == 1


def test_multirun_jobs_each_train_their_own_config_on_both_ranks(
    run_volt: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A port the user chose: every job meets on it in turn, and must find none of the last
    # job's rendezvous there.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        monkeypatch.setenv("MASTER_PORT", str(sock.getsockname()[1]))
    result = run_volt(
        [
            "-m",
            *QUICK,
            "model.optimizer.lr=1e-3,1e-2",
            f"+callbacks.lr_probe={{_target_:{PROBES}.RecordLearningRate}}",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert not (tmp_path / "outputs" / "train" / "runs").exists()
    sweep = only_dir(tmp_path / "outputs" / "train" / "multiruns")
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [j.name.split("_", 1)[0] for j in jobs] == ["0", "1"]
    for job, lr in zip(jobs, (1e-3, 1e-2), strict=True):
        assert_one_ddp_run(job)
        used = {float((job / f"lr_rank{rank}.txt").read_text()) for rank in (0, 1)}
        assert used == {lr}, job.name
    assert not processes_mentioning(str(tmp_path))


@pytest.mark.slow  # two DDP trials of a real search: about 2 minutes on 2 cores
def test_optuna_trials_sample_once_for_all_ranks_and_prune_together(
    run_volt: Run, tmp_path: Path
) -> None:
    result = run_volt(
        [
            "-m",
            *QUICK,
            "trainer.max_epochs=3",
            "hydra/sweeper=volt_optuna",
            "hydra.sweeper.n_trials=2",
            "model.optimizer.lr=interval(1e-4,1e-2)",
            # val/acc never reaches 2: rank 0's pruner stops every trial at its first validation,
            # and rank 1 must stop there too (were it to train on, the run would hang).
            "hydra.sweeper.pruner={_target_:optuna.pruners.ThresholdPruner,lower:2.0}",
            f"+callbacks.lr_probe={{_target_:{PROBES}.RecordLearningRate}}",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = only_dir(tmp_path / "outputs" / "train" / "multiruns")
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(jobs) == 2
    for job in jobs:
        overrides = (job / ".hydra" / "overrides.yaml").read_text()
        sampled = float(overrides.split("model.optimizer.lr=")[1].split()[0])
        used = {float((job / f"lr_rank{rank}.txt").read_text()) for rank in (0, 1)}
        assert used == {sampled}, job.name
        assert json.loads((job / "metrics.json").read_text())["status"] == "pruned"
        last = torch.load(job / "checkpoints" / "last.ckpt", weights_only=True)
        assert last["epoch"] == 0  # stopped after its first epoch's validation
    assert "pruned: 2" in (sweep / "best.yaml").read_text()


@pytest.mark.parametrize(
    ("when", "rank_zero_ends"),
    [
        # Rank 1 dies in a training step: rank 0's gloo collective fails, and the run raises.
        ("training", "raises"),
        # Rank 1 dies before the rendezvous, where rank 0 waits for it with no error to come:
        # the launcher's observer ends rank 0 after its grace period.
        ("built", "is ended"),
    ],
)
def test_a_failing_rank_ends_the_run_quickly_with_its_error(
    when: str, rank_zero_ends: str, run_volt: Run, tmp_path: Path
) -> None:
    failure = f"+callbacks.fail={{_target_:{PROBES}.FailOnRank,rank:1,when:{when}}}"
    result = run_volt([*QUICK, failure])
    ended_at = time.time()
    assert result.returncode != 0
    assert f"injected failure on rank 1 ({when})" in result.stderr
    said = re.compile(
        rf"rank 1 of 2 failed: .*RuntimeError: injected failure on rank 1 \({when}\) \(its log"
    )
    if rank_zero_ends == "raises":
        assert re.search(f"RankFailedError: {said.pattern}", result.stderr), result.stderr[-3000:]
    else:
        # The launcher's watcher ends it with rank 1's words (a constructor's error: one line,
        # exit 2, as train.py reports it) and records the failure.
        assert result.returncode == 2
        assert re.search(f"volt: error: {said.pattern}", result.stderr), result.stderr[-3000:]
        run_dir = only_dir(tmp_path / "outputs" / "train" / "runs")
        record = json.loads((run_dir / "run.json").read_text())
        assert record["status"] == "failed"
        assert said.search(record["error"])
    run_dir = only_dir(tmp_path / "outputs" / "train" / "runs")
    rank1_log = run_dir / "train_rank1.log"
    assert "injected failure on rank 1" in rank1_log.read_text()
    # Counted from rank 1's last words, not from the start, which takes over a minute on a busy
    # machine: the launcher's deadlines, and room for a busy machine. A rank 0 left waiting
    # for rank 1 in the rendezvous or a collective would take minutes.
    assert ended_at - rank1_log.stat().st_mtime < RANK_ZERO_GRACE_S + CRASHED_RANK_EXIT_S + 10
    assert not processes_mentioning(str(tmp_path))


@pytest.mark.slow  # a DDP run of a small regression: about 15 s on 2 cores
def test_a_metric_logged_by_rank_zero_alone_is_not_followed_and_no_rank_waits(
    run_volt: Run, tmp_path: Path
) -> None:
    """A module that gathers its validation loss and logs it on rank 0 alone, as Lightning's docs
    show: rank 0 followed it and remade its checkpoint (whose setup broadcasts), rank 1 dropped
    theirs, and rank 0 waited in that broadcast for ever (seen 2026-11-28). Both ranks now
    judge by what every rank logged."""
    conf = Path(__file__).parents[1] / "lightning_docs_conf"
    args = [f"hydra.searchpath=[file://{conf}]", "model=gathered", "data=line", "name=g"]
    result = run_volt([*QUICK, *args, "trainer.max_epochs=2"], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (result.stdout + result.stderr).count("best checkpoint is off") == 1  # rank 0 says it
    logged = (tmp_path / "outputs" / "train" / "runs" / "g" / "train.log").read_text()
    assert "GatheredRegressor logged no 'val/acc' in validation (logged on every rank:" in logged
    assert not processes_mentioning(str(tmp_path))


@pytest.mark.slow  # five DDP and FSDP runs: about 3 minutes on 2 cores
@pytest.mark.parametrize(
    ("strategy", "others"),
    [("ddp", "continue"), ("ddp", "wait"), ("ddp", "hang"), ("fsdp", "continue"), ("fsdp", "hang")],
)
def test_out_of_memory_on_one_rank_ends_every_rank_with_volts_line(
    strategy: str, others: str, run_volt: Run, tmp_path: Path
) -> None:
    """Rank 1 runs out of memory. Rank 0 sees its next collective fail (gloo: `continue`), waits
    in it for good (NCCL: `wait`), or waits there holding the interpreter (a CUDA call blocked
    behind the collective: `hang`, where no thread of rank 0 runs). Every time the run ends
    with volt's one line for the out-of-memory, run.json says it failed, no process is left:
    rank 0 raises (exit 2), its watcher of the ranks ends it (exit 2), or, hung, the process
    rank 1 left behind kills it (volt.strategies.stuck_rank_zero)."""
    oom = f"{{_target_:{PROBES}.OutOfMemoryOnRank,rank:1,others:{others}}}"
    sharding = ["trainer.strategy.wrap=[]"] if strategy == "fsdp" else []  # the digits MLP
    result = run_volt([*QUICK, f"trainer={strategy}", *sharding, f"+callbacks.oom={oom}"])
    ended_at = time.time()
    assert result.returncode == (-signal.SIGKILL if others == "hang" else 2), result.stderr[-3000:]
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("volt: error: ")]
    assert line.startswith(
        "volt: error: rank 1 of 2 failed: CUDA out of memory on cpu (one of 2 GPUs) with"
        " data.batch_size=64 per GPU: no CUDA memory figures for cpu. Try fewer samples per GPU"
        " (data.batch_size=32), mixed precision"
    ), line
    assert ("trainer=fsdp" in line) == (strategy == "ddp")  # the sharded run has it already
    assert line.endswith("and was killed") == (others == "hang")
    assert "Traceback" not in result.stderr
    run_dir = only_dir(tmp_path / "outputs" / "train" / "runs")
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "failed"
    assert "CUDA out of memory on cpu" in record["error"]
    failed_at = float((run_dir / "failed_at.txt").read_text())
    assert ended_at - failed_at < RANK_ZERO_GRACE_S + 10 + CRASHED_RANK_EXIT_S + 10
    time.sleep(1)  # the process rank 1 left behind ends after it has killed rank 0
    assert not processes_mentioning(str(tmp_path))


@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize(
    ("strategy", "rank"), [("ddp", 1), ("fsdp", -1)], ids=["ddp-rank-1", "fsdp-every-rank"]
)
def test_a_real_out_of_memory_on_two_gpus_ends_every_rank_with_volts_line(
    strategy: str, rank: int, run_volt: Run, tmp_path: Path
) -> None:
    """A real CUDA out-of-memory on rank 1 alone (rank 0 then waits in an NCCL all-reduce for a
    peer that is gone, possibly holding the interpreter), or on every rank at once: one line
    with the GPU's real numbers, every process gone, within a minute; exit 2, or rank 0 killed
    (SIGKILL) by the process rank 1 left behind where rank 0 hung."""
    oom = f"{{_target_:{PROBES}.OutOfMemoryOnRank,rank:{rank},real:true}}"
    sharding = ["trainer.strategy.wrap=[]"] if strategy == "fsdp" else []  # the digits MLP
    gpus = ["trainer.accelerator=gpu", "precision=bf16-mixed"]
    result = run_volt([*QUICK, f"trainer={strategy}", *sharding, *gpus, f"+callbacks.oom={oom}"])
    ended_at = time.time()
    hung = (-signal.SIGKILL,) if rank == 1 else ()
    assert result.returncode in (2, *hung), result.stderr[-3000:]
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("volt: error: ")]
    who = "rank 1 of 2 failed: " if rank == 1 else ""
    found = re.search(
        rf"volt: error: {who}CUDA out of memory on cuda:\d \(one of 2 GPUs\) with"
        r" data.batch_size=\d+ per GPU: peak [\d.]+ GiB allocated of [\d.]+ GiB\. Try fewer",
        line,
    )
    assert found, line
    run_dir = only_dir(tmp_path / "outputs" / "train" / "runs")
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"
    failed_at = float((run_dir / "failed_at.txt").read_text())
    assert ended_at - failed_at < 60
    time.sleep(1)  # the process rank 1 left behind ends after it has killed rank 0
    assert not processes_mentioning(str(tmp_path))


@pytest.mark.slow  # three interpreters (torchrun and its two ranks): 12-40 s on 2 cores
def test_torchrun_ranks_share_one_run_directory(run_volt: Run, tmp_path: Path) -> None:
    # --local-addr: otherwise torchrun's ranks meet at the machine's host name, and where that
    # name does not resolve they never do ("network addresses of (<host>, <port>) cannot be
    # retrieved", torch 2.14): the run hung until the test's timeout.
    torchrun = ["--standalone", "--nproc_per_node=2", "--local-addr=127.0.0.1", "train.py"]
    result = run_volt([*torchrun, *QUICK], module="torch.distributed.run")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_dir(tmp_path / "outputs" / "train" / "runs")
    assert_one_ddp_run(run_dir)
    assert "Started rank 1" not in (run_dir / "train.log").read_text()  # torchrun started them


@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize("trainer", ["ddp", "dp"])
@pytest.mark.parametrize("precision", ["16-mixed", "bf16-mixed"])
def test_gpus_train_with_mixed_precision(
    trainer: str, precision: str, run_volt: Run, tmp_path: Path
) -> None:
    result = run_volt(
        [
            f"trainer={trainer}",
            "trainer.devices=2",  # two of however many GPUs the machine has
            f"precision={precision}",
            "trainer.max_epochs=3",
            "data.batch_size=64",  # 32 per GPU: the global batch divides over the GPUs
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_dir(tmp_path / "outputs" / "train" / "runs")
    assert "devices=2" in (run_dir / "train.log").read_text()
    assert json.loads((run_dir / "metrics.json").read_text())["metrics"]["test/acc"] > 0.9
    rank_logs = sorted(p.name for p in run_dir.glob("train_rank*.log"))
    assert rank_logs == (["train_rank1.log"] if trainer == "ddp" else [])


@pytest.mark.gpu
@two_gpus
def test_gpu_multirun_runs_each_job_on_both_gpus(run_volt: Run, tmp_path: Path) -> None:
    result = run_volt(
        [
            "-m",
            "trainer=ddp",
            "trainer.devices=2",
            "precision=bf16-mixed",
            "trainer.max_epochs=1",
            "data.batch_size=64",
            "model.optimizer.lr=1e-3,1e-2",
            "trusted_targets=[tests]",
            f"+callbacks.lr_probe={{_target_:{PROBES}.RecordLearningRate}}",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = only_dir(tmp_path / "outputs" / "train" / "multiruns")
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    for job, lr in zip(jobs, (1e-3, 1e-2), strict=True):
        used = {float(p.read_text()) for p in job.glob("lr_rank*.txt")}
        assert used == {lr}
        assert len(list(job.glob("lr_rank*.txt"))) == 2
    assert not processes_mentioning(str(tmp_path))


def test_the_rendezvous_port_is_held_from_the_start_and_serves_init_process_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = reserve_rendezvous_port("127.0.0.1")
    with socket.socket() as other, pytest.raises(OSError) as taken:
        other.bind(("", store.port))  # what another run's launcher, or a rank's connection, tries
    assert taken.value.errno == errno.EADDRINUSE

    # Rank 0 joins through the env:// rendezvous on that port without binding it a second time.
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    try:
        total = torch.ones(3)
        torch.distributed.all_reduce(total)
        assert total.tolist() == [1.0, 1.0, 1.0]
    finally:
        torch.distributed.destroy_process_group()


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the sockets listening on TCP `port`, IPv4 and IPv6, from /proc."""
    found = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for row in Path(table).read_text().splitlines()[1:]:
            local, state = row.split()[1], row.split()[3]
            address, port_hex = local.split(":")
            if int(port_hex, 16) != port or state != "0A":  # 0A: LISTEN
                continue
            raw = bytes.fromhex(address)  # in 32-bit words of the host's (little-endian) order
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add(socket.inet_ntop(family, words))
    return found


def test_the_rendezvous_listens_on_the_runs_address_alone() -> None:
    # Left to itself TCPStore listens on every interface ("::"), where any host that reaches
    # this one could write to the store the ranks meet in.
    store = reserve_rendezvous_port("127.0.0.1")
    assert listening_addresses(store.port) == {"127.0.0.1"}

    with pytest.raises(OSError, match=r"MASTER_ADDR=192\.0\.2\.1: .* set it to an address of it"):
        reserve_rendezvous_port("192.0.2.1")  # TEST-NET-1: an address of no machine


def test_ddp_buckets_gradients_as_its_config_says(
    compose_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    # 100 MB, not torch's 25: under torch.compile each bucket is a compiled graph a step, and the
    # 85M GPT's 13 of them bound its step on 2 x H200 (conf/trainer/ddp.yaml).
    cfg = compose_config("train", ["trainer=ddp", f"paths.output_dir={tmp_path}"])
    strategy = instantiate(cfg.trainer.strategy)
    strategy.parallel_devices = [torch.device("cpu")]
    store = f"file://{tmp_path / 'store'}"
    torch.distributed.init_process_group("gloo", init_method=store, rank=0, world_size=1)
    try:
        wrapped = strategy._setup_model(torch.nn.Linear(4, 4))
        assert wrapped.bucket_bytes_cap == 100 * 2**20
    finally:
        torch.distributed.destroy_process_group()
