"""benchmarks/gpu_sweeps.py: how it reads a sweep's files and judges them (fast), and the script
itself on the CPU (slow)."""

import csv
import json
import logging
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from lightning.pytorch.accelerators.cuda import CUDAAccelerator

from volt.config import PROJECT_ROOT

T0 = datetime(2026, 11, 24, 12, 0, 0)

# As the sweep's process prints it on two GPUs: job 0 fails, job 2 takes its GPU.
PARALLEL_LOG = """\
[2026-11-24 12:00:05,000][HYDRA] Launching 3 jobs, up to 2 at once on GPUs 0,1, 1 job(s) per GPU
[2026-11-24 12:00:05,000][HYDRA] \t#0 : model.optimizer.lr=1000
[2026-11-24 12:00:05,001][HYDRA] \t#1 : model.optimizer.lr=0.002
[2026-11-24 12:00:05,001][HYDRA] \t#2 : model.optimizer.lr=0.001
[2026-11-24 12:00:05,100][HYDRA] #0 started (pid 11, GPU 0) -> /s/0_model.optimizer.lr=1000
[2026-11-24 12:00:05,200][HYDRA] #1 started (pid 12, GPU 1) -> /s/1_model.optimizer.lr=0.002
[2026-11-24 12:00:20,500][HYDRA] #0 failed in 15.4 s: NonFiniteLossError: non-finite loss
[2026-11-24 12:00:20,700][HYDRA] #2 started (pid 13, GPU 0) -> /s/2_model.optimizer.lr=0.001
[2026-11-24 12:00:30,000][HYDRA] #1 completed in 24.8 s, returned 0.98
[2026-11-24 12:00:41,000][HYDRA] #2 completed in 20.3 s, returned 0.97
"""
BASIC_LOG = """\
[2026-11-24 12:00:04,000][HYDRA] Launching 2 jobs locally
[2026-11-24 12:00:04,000][HYDRA] \t#0 : seed=1
┏━━━━━━━━━━━━━━━━┓ a job's own output, between the launcher's lines
[2026-11-24 12:00:30,250][HYDRA] \t#1 : seed=2
"""


@pytest.fixture(scope="module")
def sweeps(load_benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return load_benchmark("gpu_sweeps")


def write_job(sweep: Path, job: int, gpus: str, status: str, error: str = "") -> dict[str, str]:
    """A job directory with the files volt writes that the script reads; its summary.csv row."""
    directory = sweep / f"{job}_x"
    directory.mkdir(parents=True)
    record = {"status": status, "started": "2026-11-24T12:00:10", "ended": "2026-11-24T12:00:19"}
    (directory / "run.json").write_text(json.dumps(record))
    names = [{"name": "NVIDIA H200"}] * len(gpus.split(","))
    (directory / "device.json").write_text(json.dumps({"gpus": names}))
    (directory / "train.log").write_text(
        "2026-11-24 12:00:12,500 INFO    volt: torch 2.11.0 | 1 x NVIDIA H200\n"
        "2026-11-24 12:00:13,000 INFO    lightning.pytorch.accelerators.cuda:"
        f" LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: [{gpus}]\n"
    )
    return {"job": str(job), "status": status, "error": error, "dir": str(directory)}


def write_summary(sweep: Path, rows: list[dict[str, str]]) -> None:
    with (sweep / "summary.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["job", "status", "error", "dir"])
        writer.writeheader()
        writer.writerows(rows)


def failed_sweep(sweeps: ModuleType, tmp_path: Path, gpu_of_job_2: str) -> Any:  # a SweepRun
    rows = [
        write_job(tmp_path, 0, "0", "failed", "NonFiniteLossError: non-finite loss at step 9"),
        write_job(tmp_path, 1, "1", "completed"),
        write_job(tmp_path, 2, gpu_of_job_2, "completed"),
    ]
    write_summary(tmp_path, rows[::-1])  # best first, as volt ranks them
    log = PARALLEL_LOG.replace("GPU 0) -> /s/2", f"GPU {gpu_of_job_2}) -> /s/2")
    jobs = sweeps.read_jobs(tmp_path, sweeps.parse_launcher_log(log, T0), T0)
    return sweeps.SweepRun("parallel", [], 40.0, 1, str(tmp_path), "", jobs)


def test_the_launchers_lines_give_each_jobs_start_end_and_gpus(sweeps: ModuleType) -> None:
    launches = sweeps.parse_launcher_log(PARALLEL_LOG, T0)
    assert launches == {
        0: sweeps.Launch(start=5.1, end=20.5, gpus="0"),
        1: sweeps.Launch(start=5.2, end=30.0, gpus="1"),
        2: sweeps.Launch(start=20.7, end=41.0, gpus="0"),  # not when the sweep listed it
    }
    basic = sweeps.parse_launcher_log(BASIC_LOG, T0)
    assert basic == {0: sweeps.Launch(start=4.0), 1: sweeps.Launch(start=30.25)}


def test_the_gpus_read_are_those_lightning_logs(
    sweeps: ModuleType, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The line the script reads is the one the installed Lightning writes."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with caplog.at_level(logging.INFO, logger="lightning.pytorch.accelerators.cuda"):
        CUDAAccelerator.set_nvidia_flags(0)
    assert sweeps.VISIBLE.findall(caplog.text) == [("0", "1")]


def test_a_failed_jobs_gpu_handed_to_the_next_job_is_seen(
    sweeps: ModuleType, tmp_path: Path
) -> None:
    run = failed_sweep(sweeps, tmp_path, gpu_of_job_2="0")
    assert [(job.job, job.visible, job.devices) for job in run.jobs] == [
        (0, ["0"], ["NVIDIA H200"]),
        (1, ["1"], ["NVIDIA H200"]),
        (2, ["0"], ["NVIDIA H200"]),
    ]
    assert run.jobs[0].first_log == 12.5
    checks = sweeps.failure_checks(run, cpu=False)
    assert [c.verdict for c in checks] == ["yes"] * 4, checks
    assert "#2 started when #0 ended on its GPU 0, while #1 still ran" in checks[2].claim
    assert sweeps.own_gpus(run, 1, cpu=False).verdict == "yes"


def test_a_job_on_another_gpu_or_two_jobs_on_one_are_caught(
    sweeps: ModuleType, tmp_path: Path
) -> None:
    run = failed_sweep(sweeps, tmp_path, gpu_of_job_2="1")  # job 2 and job 1 overlap on GPU 1
    handover = sweeps.failure_checks(run, cpu=False)[2]
    assert handover.verdict == "NO" and "#2 started 20.7 s on ['1']" in handover.detail
    shared = sweeps.own_gpus(run, 1, cpu=False)
    assert shared.verdict == "NO" and "#1 and #2 both on ['1']" in shared.detail
    assert sweeps.own_gpus(run, 1, cpu=True).verdict == sweeps.NOT_SHOWN


def test_jobs_at_once_counts_a_job_that_starts_as_another_ends_once(sweeps: ModuleType) -> None:
    def job(n: int, start: float, end: float) -> Any:
        return sweeps.JobEvidence(n, "completed", [], 1, [], None, start, end, None, "", "")

    assert sweeps.most_at_once([job(0, 0, 10), job(1, 10, 20)]) == 1
    assert sweeps.most_at_once([job(0, 0, 10), job(1, 1, 20), job(2, 10, 30)]) == 2


def test_the_search_is_judged_from_its_journal_and_best_yaml(sweeps: ModuleType) -> None:
    def job(n: int, status: str) -> Any:
        return sweeps.JobEvidence(n, status, [], 1, [], None, 0, 1, None, "", "")

    run = sweeps.SweepRun("parallel", [], 1.0, 0, "", "", [job(0, "completed"), job(1, "pruned")])
    trials = [
        {"number": 0, "state": "complete", "value": 0.9, "params": {}},
        {"number": 1, "state": "pruned", "value": None, "params": {}},
    ]
    best = {"trial": 0, "trials": {"running": 0, "complete": 1, "pruned": 1, "fail": 0}}
    checks = sweeps.optuna_checks(run, trials, best, slots=2, cpu=True)
    assert [c.verdict for c in checks[:4]] == ["yes"] * 4, checks
    trials[1]["state"] = "running"  # the sweeper never told it
    checks = sweeps.optuna_checks(run, trials, best, slots=2, cpu=True)
    assert [c.verdict for c in checks[:4]] == ["NO"] * 4, checks


def test_the_markdown_shows_each_job_and_each_verdict(sweeps: ModuleType, tmp_path: Path) -> None:
    run = failed_sweep(sweeps, tmp_path, gpu_of_job_2="0")
    run.command = [sys.executable, "train.py", "-m", "model.optimizer.lr=1000,0.002,0.001"]
    scenario = sweeps.Scenario("failure", [run], sweeps.failure_checks(run, cpu=False))
    text = sweeps.markdown([scenario], "2 x NVIDIA H200")
    assert "`python train.py -m model.optimizer.lr=1000,0.002,0.001`" in text
    assert "| parallel | 40.0 | 1 | 7.3 |" in text  # launch to first log line: 7.4, 7.3, -8.2
    assert "| parallel | 2 | 0 | NVIDIA H200 | 20.7 | 41.0 | completed |" in text
    assert "- **yes**: the sweep exits non-zero: exit status 1" in text


def run_script(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    results = tmp_path / "sweeps.json"
    command = [sys.executable, "benchmarks/gpu_sweeps.py", "--cpu", "--json", str(results)]
    command += ["--outputs", str(tmp_path / "outputs"), *args]
    done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done, json.loads(results.read_text())


def verdicts(scenario: dict) -> dict[str, str]:
    return {check["claim"]: check["verdict"] for check in scenario["checks"]}


@pytest.mark.slow  # three sweeps of real digits jobs: about 70 s on 2 cores
def test_jobs_side_by_side_and_a_failing_one_on_the_cpu(tmp_path: Path) -> None:
    args = ["--scenarios", "side-by-side", "failure", "--jobs", "2", "--epochs", "4"]
    done, results = run_script(tmp_path, *args)
    side, failed = results["scenarios"]
    side_by_side = verdicts(side)
    # on 2 cores, where each job's imports cost as much as its training, either may win
    assert side_by_side.pop("parallel takes clearly less wall time (basic / parallel >= 1.2)")
    assert side_by_side == {
        "parallel: jobs ended ['completed', 'completed']": "yes",
        "basic: jobs ended ['completed', 'completed']": "yes",
        "parallel: 2 job(s) at a time": "yes",
        "parallel: each job on 1 GPU(s) of its own": "not shown (CPU)",
        "basic: 1 job(s) at a time": "yes",
    }
    assert set(verdicts(failed).values()) == {"yes"}, failed["checks"]
    jobs = failed["sweeps"][0]["jobs"]
    assert [job["status"] for job in jobs] == ["failed", "completed", "completed"]
    assert "non-finite" in jobs[0]["error"] and jobs[0]["end"] <= jobs[2]["start"]
    assert "## Sweeps side by side on the CPU (--cpu: GPU placement not shown)" in done.stdout
    assert "| parallel | 2 | CPU | CPU |" in done.stdout


@pytest.mark.slow  # two batches of two digits trials: about 45 s on 2 cores
def test_a_search_with_a_pruned_trial_on_the_cpu(tmp_path: Path) -> None:
    _, results = run_script(tmp_path, "--scenarios", "optuna")
    (search,) = results["scenarios"]
    assert set(verdicts(search).values()) == {"yes", "not shown (CPU)"}, search["checks"]
    states = [trial["state"] for trial in search["extra"]["trials"]]
    assert len(states) == 4 and "pruned" in states
