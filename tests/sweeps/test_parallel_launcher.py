"""hydra/launcher=parallel: the slot planner alone; its jobs in real processes, with a faked list
of GPUs (what each job's environment gets); SIGINT/SIGTERM on the sweep; real volt sweeps (slow)."""

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from itertools import combinations
from pathlib import Path
from types import ModuleType

import pytest
from hydra._internal.callbacks import Callbacks
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path
from hydra.core.hydra_config import HydraConfig
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobRuntime, JobStatus
from hydra.types import HydraContext, RunMode

from hydra_plugins.volt_parallel import slots
from hydra_plugins.volt_parallel.jobs import JobProcessError
from hydra_plugins.volt_parallel.slots import SlotPlanner, gpus_wanted, share_cores
from volt.config import PROJECT_ROOT

# --- the planner ------------------------------------------------------------------------------
# `slots.Start` is read at each use: Hydra's plugin scan (run by other tests) executes the plugin
# modules again, which rebinds their classes, and a Start of the old class is unequal to the new.


def test_one_job_per_gpu_and_the_rest_wait_for_a_free_one() -> None:
    planner = SlotPlanner([1, 1, 1, 1, 1], ["0", "1"], jobs_per_gpu=1, max_running=8)
    assert planner.starts() == [slots.Start(0, ("0",)), slots.Start(1, ("1",))]
    assert planner.starts() == []
    planner.end(1)  # failed or not: the planner does not ask
    assert planner.starts() == [slots.Start(2, ("1",))]
    planner.end(0)
    planner.end(2)
    assert planner.starts() == [slots.Start(3, ("0",)), slots.Start(4, ("1",))]
    assert not planner.done()
    planner.end(3)
    planner.end(4)
    assert planner.done()


def test_ddp_jobs_get_groups_of_gpus_and_later_jobs_wait_their_turn() -> None:
    planner = SlotPlanner([2, 2, 2, 1, 1], ["0", "1", "2", "3"], jobs_per_gpu=1, max_running=8)
    assert planner.starts() == [slots.Start(0, ("0", "1")), slots.Start(1, ("2", "3"))]
    planner.end(1)
    assert planner.starts() == [slots.Start(2, ("2", "3"))]
    planner.end(2)
    # in order: job 3 takes one GPU, and job 4 the other free one
    assert planner.starts() == [slots.Start(3, ("2",)), slots.Start(4, ("3",))]


def test_a_job_wanting_more_gpus_than_are_free_holds_back_the_jobs_behind_it() -> None:
    planner = SlotPlanner([1, 2, 1], ["0", "1"], jobs_per_gpu=1, max_running=8)
    # job 1 waits for both GPUs; job 2 does not jump the queue
    assert planner.starts() == [slots.Start(0, ("0",))]
    planner.end(0)
    assert planner.starts() == [slots.Start(1, ("0", "1"))]


def test_jobs_share_a_gpu_when_asked_spreading_first() -> None:
    planner = SlotPlanner([1] * 5, ["0", "1"], jobs_per_gpu=2, max_running=8)
    assert [s.gpus for s in planner.starts()] == [("0",), ("1",), ("0",), ("1",)]
    planner.end(2)
    assert planner.starts() == [slots.Start(4, ("0",))]


def test_jobs_on_the_cpu_take_only_a_slot() -> None:
    planner = SlotPlanner([0, 0, 0], [], jobs_per_gpu=1, max_running=2)
    assert planner.starts() == [slots.Start(0, ()), slots.Start(1, ())]
    planner.end(0)
    assert planner.starts() == [slots.Start(2, ())]


def test_a_job_wanting_more_gpus_than_there_are_is_refused_before_any_starts() -> None:
    with pytest.raises(ValueError, match="sweep job 1 wants 4 GPUs but the launcher has 2"):
        SlotPlanner([1, 4], ["0", "1"], jobs_per_gpu=1, max_running=2)


@pytest.mark.parametrize(
    ("accelerator", "devices", "gpus_here", "wanted"),
    [
        ("auto", 1, 4, 1),
        ("gpu", 2, 4, 2),
        ("cpu", 2, 4, 0),  # DDP on CPU processes
        ("auto", 1, 0, 0),  # no GPU here
        ("gpu", -1, 4, 4),
        ("auto", "auto", 3, 3),
        ("gpu", [0, 2], 4, 2),
        ("gpu", "0,1,2", 4, 3),
        ("gpu", "2", 4, 2),
        (None, None, 2, 1),  # a task without a trainer: one GPU each
    ],
)
def test_gpus_wanted_reads_the_trainer_as_lightning_does(
    accelerator: object, devices: object, gpus_here: int, wanted: int
) -> None:
    assert gpus_wanted(accelerator, devices, gpus_here) == wanted


@pytest.mark.parametrize(
    ("cores", "n_jobs", "threads", "shared"),
    [
        (16, None, None, (8, 2)),  # neither given: 2 threads a job
        (2, 2, None, (2, 1)),  # jobs given: the cores divided among them
        (16, None, 4, (4, 4)),  # threads given: as many jobs as fit
        (2, 4, None, (4, 1)),  # more jobs than cores: one thread each
        (1, None, None, (1, 1)),
        (8, 3, 1, (3, 1)),  # both given: as given
    ],
)
def test_jobs_share_the_cores(
    cores: int, n_jobs: int | None, threads: int | None, shared: tuple[int, int]
) -> None:
    assert share_cores(cores, n_jobs, threads) == shared


# --- jobs in real processes: a tiny task that records what it saw -----------------------------

TASK = '''\
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback


class Marks(Callback):
    """Where Hydra's job hooks ran, and what on_job_end was told."""

    def on_job_start(self, config, **kwargs):
        Path(config.hydra.runtime.output_dir, "job_start").write_text(str(os.getpid()))

    def on_job_end(self, config, job_return, **kwargs):
        marks = {"pid": os.getpid(), "status": job_return.status.name}
        Path(config.hydra.runtime.output_dir, "job_end").write_text(json.dumps(marks))


def meet(out, jobs):
    """Waits until `jobs` jobs of the sweep have started (a minute at most): jobs meant to run at
    once then overlap however slowly each process starts. Jobs run one by one would not."""
    (out / "started").touch()
    deadline = time.monotonic() + 60
    while len(list(out.parent.glob("*/started"))) < jobs and time.monotonic() < deadline:
        time.sleep(0.05)


def task(cfg):
    out = Path(HydraConfig.get().runtime.output_dir)
    seen = {key: os.environ.get(key) for key in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")}
    seen.update(pid=os.getpid(), start=time.time())
    meet(out, cfg.meet)
    if cfg.mode == "hang":  # and a process of its own, as a DDP job starts its ranks
        seen["child"] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid
        (out / "seen.json").write_text(json.dumps(seen))
        time.sleep(600)
    time.sleep(cfg.seconds)
    seen["end"] = time.time()
    (out / "seen.json").write_text(json.dumps(seen))
    if cfg.mode == "raise":
        raise ValueError(f"job {HydraConfig.get().job.num} was asked to fail")
    if cfg.mode == "crash":
        os._exit(3)
    return cfg.value * 10
'''

CONFIG = """\
defaults:
  - override hydra/launcher: parallel
  - _self_
trainer:
  accelerator: auto
  devices: 1
mode: ok
value: 0
seconds: 1.0
meet: 1  # jobs to wait for (this one included) before the job goes on
hydra:
  job:
    chdir: false
  sweep:
    subdir: ${hydra.job.num}
  callbacks:
    marks:
      _target_: parallel_task.Marks
"""


@pytest.fixture
def task_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hydra_restore_singletons: None
) -> Iterator[ModuleType]:
    """parallel_task, importable here and (through the launcher's sys.path[0]) in the jobs."""
    (tmp_path / "parallel_task.py").write_text(TASK)
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "config.yaml").write_text(CONFIG)
    monkeypatch.syspath_prepend(str(tmp_path))
    import parallel_task

    yield parallel_task
    sys.modules.pop("parallel_task", None)


Launch = Callable[..., list[JobReturn]]


@pytest.fixture
def launch(tmp_path: Path, task_module: ModuleType) -> Launch:
    """launch(sweep overrides, each job's overrides, number of the first job): the launcher as
    Hydra's sweeper calls it, in this process; the jobs' JobReturns."""

    def _launch(overrides: list[str], jobs: list[list[str]], first: int = 0) -> list[JobReturn]:
        loader = ConfigLoaderImpl(create_config_search_path(str(tmp_path / "conf")))
        config = loader.load_configuration(
            "config", [f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides], RunMode.MULTIRUN
        )
        HydraConfig.instance().set_config(config)
        JobRuntime.instance().set("name", "parallel_task")
        context = HydraContext(config_loader=loader, callbacks=Callbacks(config))
        launcher = Plugins.instance().instantiate_launcher(
            hydra_context=context, task_function=task_module.task, config=config
        )
        return list(launcher.launch(jobs, initial_job_idx=first))

    return _launch


def seen(tmp_path: Path, job: int) -> dict:
    return json.loads((tmp_path / "sweep" / str(job) / "seen.json").read_text())


def overlapping(a: dict, b: dict) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


def test_each_job_sees_only_its_gpus_and_a_failed_job_frees_them(
    launch: Launch, tmp_path: Path
) -> None:
    jobs = [
        ["trainer.devices=1", "value=0", "meet=2"],
        ["trainer.devices=1", "mode=raise", "seconds=0.2", "meet=2"],
        ["trainer.devices=2", "value=2"],  # waits for two free GPUs
        ["trainer.devices=1", "value=3"],
        ["trainer.accelerator=cpu", "value=4"],  # wants no GPU
    ]
    returns = launch(["hydra.launcher.gpus=[0,1,2]"], jobs)

    assert [r.status for r in returns] == [
        JobStatus.COMPLETED,
        JobStatus.FAILED,
        *[JobStatus.COMPLETED] * 3,
    ]
    assert [r.return_value for r in returns if r.status == JobStatus.COMPLETED] == [0, 20, 30, 40]
    assert isinstance(returns[1]._return_value, ValueError)
    assert "job 1 was asked to fail" in str(returns[1]._return_value)
    records = [seen(tmp_path, job) for job in range(5)]
    gpus = [set(filter(None, r["CUDA_VISIBLE_DEVICES"].split(","))) for r in records]
    assert [len(g) for g in gpus] == [1, 1, 2, 1, 0]
    assert set().union(*gpus) <= {"0", "1", "2"}
    for a, b in combinations(range(5), 2):
        if overlapping(records[a], records[b]):
            assert not gpus[a] & gpus[b], f"jobs {a} and {b} ran at once on GPU {gpus[a] & gpus[b]}"
    assert any(overlapping(a, b) for a, b in combinations(records, 2)), "no two jobs ran at once"
    # Hydra's job hooks ran in each job's own process, and saw how it ended
    for job, record in enumerate(records):
        job_dir = tmp_path / "sweep" / str(job)
        assert int((job_dir / "job_start").read_text()) == record["pid"]
        ended = json.loads((job_dir / "job_end").read_text())
        assert (ended["pid"], ended["status"]) == (record["pid"], returns[job].status.name)
    assert "asked to fail" in (tmp_path / "sweep" / "1" / "console.log").read_text()  # traceback


def test_a_batch_numbered_from_past_0_returns_its_jobs_in_order(
    launch: Launch, tmp_path: Path
) -> None:
    # volt_optuna with hydra.sweeper.n_jobs=2 launches trials 2 and 3 as the second batch
    jobs = [["value=2"], ["value=3", "seconds=0.1"]]
    returns = launch(["hydra.launcher.gpus=[]", "hydra.launcher.n_jobs=2"], jobs, first=2)
    assert [r.return_value for r in returns] == [20, 30]
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir()) == ["2", "3"]


def test_jobs_share_a_gpu_when_asked(launch: Launch, tmp_path: Path) -> None:
    returns = launch(
        ["hydra.launcher.gpus=[7]", "hydra.launcher.jobs_per_gpu=2"],
        [["value=0", "meet=2"], ["value=1", "meet=2"], ["value=2"]],
    )
    assert [r.return_value for r in returns] == [0, 10, 20]
    records = [seen(tmp_path, job) for job in range(3)]
    assert {r["CUDA_VISIBLE_DEVICES"] for r in records} == {"7"}
    assert overlapping(records[0], records[1])
    assert not overlapping(records[0], records[2]) or not overlapping(records[1], records[2])


def test_cpu_jobs_run_n_jobs_at_once_and_a_crashed_one_is_reported(
    launch: Launch, tmp_path: Path
) -> None:
    returns = launch(
        ["hydra.launcher.gpus=[]", "hydra.launcher.n_jobs=2", "hydra.launcher.threads_per_job=3"],
        [["value=1", "meet=2"], ["mode=crash", "seconds=0.1", "meet=2"], ["value=3"]],
    )
    assert [r.status for r in returns] == [
        JobStatus.COMPLETED,
        JobStatus.FAILED,
        JobStatus.COMPLETED,
    ]
    assert [returns[0].return_value, returns[2].return_value] == [10, 30]
    error = returns[1]._return_value
    # by name: Hydra's plugin scan executes the module again, making a class of its own
    assert type(error).__name__ == JobProcessError.__name__
    assert "exited with 3 before it could send back a result" in str(error)
    assert returns[1].overrides == ["mode=crash", "seconds=0.1", "meet=2"]
    records = [seen(tmp_path, job) for job in range(3)]
    assert [(r["CUDA_VISIBLE_DEVICES"], r["OMP_NUM_THREADS"]) for r in records] == [("", "3")] * 3
    assert overlapping(records[0], records[1])
    # the crashed job never reached Hydra's on_job_end: the launcher ran it for the job
    ended = json.loads((tmp_path / "sweep" / "1" / "job_end").read_text())
    assert (ended["pid"], ended["status"]) == (os.getpid(), "FAILED")


def test_a_task_function_of_the_script_itself_is_refused_with_the_fix(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            """\
            import hydra

            @hydra.main(version_base="1.3", config_path=None)
            def main(cfg):
                return 0

            main()
            """
        )
    )
    result = subprocess.run(
        [sys.executable, str(script), "-m", "hydra/launcher=parallel", "+x=1,2",
         f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    assert "define it in a module the script imports" in result.stderr


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"  # dead, waiting for a parent (init, here) to reap it


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_sweep_stops_every_job_and_what_they_started(
    tmp_path: Path, signum: signal.Signals
) -> None:
    (tmp_path / "parallel_task.py").write_text(TASK)
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "config.yaml").write_text(CONFIG)
    conf = tmp_path / "conf"
    (tmp_path / "run.py").write_text(
        "import hydra\nfrom parallel_task import task\n"
        f'hydra.main(version_base="1.3", config_path="{conf}", config_name="config")(task)()\n'
    )
    sweep = tmp_path / "sweep"
    command = [sys.executable, str(tmp_path / "run.py"), "-m", "mode=hang", "value=1,2,3"]
    command += [f"hydra.sweep.dir={sweep}", "hydra.launcher.n_jobs=2", "hydra.launcher.gpus=[]"]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as process:
        try:
            deadline = time.monotonic() + 60
            while not all((sweep / str(j) / "seen.json").is_file() for j in (0, 1)):
                assert time.monotonic() < deadline and process.poll() is None, "jobs did not start"
                time.sleep(0.2)
            process.send_signal(signum)
            output, _ = process.communicate(timeout=30)
        finally:
            process.kill()
    assert process.returncode == 128 + signum, output
    assert f"Stopping 2 running job(s) ({signum.name})" in output
    for job in (0, 1):
        record = seen(tmp_path, job)
        assert gone(record["pid"]) and gone(record["child"]), f"job {job} left {record}"
    assert not (sweep / "2").exists()  # never started


# --- real volt sweeps ------------------------------------------------------------------------

QUIET = ["trainer.max_epochs=1", "callbacks.progress_bar=null", "callbacks.model_summary=null"]


def volt_sweep(tmp_path: Path, args: list[str]) -> tuple[subprocess.CompletedProcess[str], Path]:
    outputs = tmp_path / "outputs"
    command = [sys.executable, "train.py", "-m", "hydra/launcher=parallel", *QUIET, *args]
    result = subprocess.run(
        [*command, f"paths.outputs_dir={outputs}"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    (sweep,) = (outputs / "train" / "multiruns").iterdir()
    return result, sweep


def summary_rows(sweep: Path) -> dict[str, dict[str, str]]:
    with (sweep / "summary.csv").open() as f:
        return {row["job"]: row for row in csv.DictReader(f)}


@pytest.mark.slow
def test_a_digits_sweep_runs_two_jobs_at_a_time_on_the_cpu(tmp_path: Path) -> None:
    result, sweep = volt_sweep(tmp_path, ["hydra.launcher.n_jobs=2", "seed=1,2,3,4"])
    assert result.returncode == 0, result.stderr[-3000:]
    job_dirs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(job_dirs) == 4
    for job_dir in job_dirs:
        assert json.loads((job_dir / "metrics.json").read_text())["status"] == "completed"
        assert (job_dir / "train.log").is_file() and (job_dir / "console.log").is_file()
    rows = summary_rows(sweep)
    assert sorted(rows) == ["0", "1", "2", "3"]
    assert all(float(row["test/acc"]) > 0.5 for row in rows.values())
    assert "up to 2 at once on the CPU (1 CPU thread(s) each)" in result.stderr + result.stdout
    # two jobs at once: job 1 started before job 0 ended
    log = result.stderr + result.stdout
    assert log.index("#1 started") < log.index("#0 completed")


@pytest.mark.slow
def test_a_failing_job_does_not_stop_the_others(tmp_path: Path) -> None:
    result, sweep = volt_sweep(tmp_path, ["hydra.launcher.n_jobs=2", "data.batch_size=0,32,64"])
    assert result.returncode != 0  # the sweep as a whole did not succeed
    rows = summary_rows(sweep)
    assert [rows[j]["status"] for j in "012"] == ["failed", "completed", "completed"]
    assert "data.batch_size=0 is not valid" in rows["0"]["error"]
    assert "#0 failed" in result.stderr + result.stdout


@pytest.mark.slow
def test_ddp_jobs_start_their_ranks_from_the_launchers_processes(tmp_path: Path) -> None:
    result, sweep = volt_sweep(tmp_path, ["hydra.launcher.n_jobs=2", "trainer=ddp", "seed=1,2"])
    assert result.returncode == 0, result.stderr[-3000:]
    rows = summary_rows(sweep)
    assert [rows[j]["status"] for j in "01"] == ["completed", "completed"]
    for job_dir in (p for p in sweep.iterdir() if p.is_dir()):
        assert "Rank 1 trains" in (job_dir / "train_rank1.log").read_text()


@pytest.mark.slow
def test_the_benchmark_times_both_launchers_on_a_small_sweep() -> None:
    command = [sys.executable, "benchmarks/parallel_sweep.py", "--jobs", "2", "--epochs", "1"]
    done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith(("| basic", "| parallel"))]
    assert [row.split("|")[2].strip() for row in rows] == ["1", "2"]  # jobs at once
    assert "basic / parallel wall time:" in done.stdout
