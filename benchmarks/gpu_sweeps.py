"""Sweeps on the GPUs of one host (issue #25): what `hydra/launcher=parallel` does with them,
shown from what each sweep wrote.

    python benchmarks/gpu_sweeps.py --json sweeps.json        # all scenarios, on 2 GPUs
    python benchmarks/gpu_sweeps.py --scenarios side-by-side failure --epochs 20
    python benchmarks/gpu_sweeps.py --cpu                      # no GPU: the CPU, 2 jobs at once

Each scenario is a real `python train.py -m ...` from the repository root, stopped at --timeout:

- side-by-side: `experiment=digits_cnn seed=1..N` under `hydra/launcher=parallel` (one job per
  GPU), then the same sweep under `hydra/launcher=basic` (one job at a time, in the sweep's own
  process). The parallel side goes first, so a cold start counts against it.
- ddp-queue: 2 `trainer=ddp` jobs, each wanting every GPU: the launcher runs them in turn.
- optuna: `hparams_search=digits_optuna` cut to --trials trials, as many at once as there are
  GPUs, with a median pruner that may prune from the second validation on.
- failure: `model.optimizer.lr=1000,0.002,0.001`: the first job diverges and volt's NaN guard
  stops it after it has trained on its GPU; its GPU goes to the third job.

Evidence per job, all from files the sweep wrote: the launcher's log lines (when the job was
launched, on which GPUs, when it ended); Lightning's `LOCAL_RANK: r - CUDA_VISIBLE_DEVICES: [..]`
line in each rank's log (the GPUs that rank's process was given); device.json (the GPUs the job
saw); run.json (when its run ended under the basic launcher, which logs no end; how it ended);
summary.csv (every job, status, error); for the search optuna.journal and best.yaml. Times are
seconds after the sweep command started.

--cpu runs the same sweeps on the CPU (`hydra.launcher.n_jobs=2`, DDP jobs as 2 gloo ranks): the
launcher's CPU planning, where no job holds a GPU, so GPU placement and the DDP jobs' queueing
are not shown there.
"""

import argparse
import csv
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType

import harness  # benchmarks/, the folder of this script, is first on sys.path
import yaml

PROJECT = Path(__file__).resolve().parents[1]
SCENARIOS = ("side-by-side", "ddp-queue", "optuna", "failure")
QUIET = ["callbacks.progress_bar=null", "callbacks.model_summary=null"]
# Every job runs all its epochs: the sides of a comparison do the same work.
FULL = ["callbacks.early_stopping=null"]
# The launcher's own lines in the sweep's output (Hydra's logging of the sweep's process).
HYDRA_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[HYDRA\] (.*)$")
STARTED = re.compile(r"^#(\d+) started \(pid \d+, (?:GPU ([^)]+)|CPU[^)]*)\)")
ENDED = re.compile(r"^#(\d+) (?:completed|failed) in ")
BASIC_STARTED = re.compile(r"^\s+#(\d+) : ")  # Hydra's basic launcher, as it starts a job
# Lightning's CUDAAccelerator.setup, in each rank's log: what CUDA_VISIBLE_DEVICES its process had.
VISIBLE = re.compile(r"LOCAL_RANK: (\d+) - CUDA_VISIBLE_DEVICES: \[([^\]]*)\]")
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")  # volt's job logs
TIME_FORMAT = "%Y-%m-%d %H:%M:%S,%f"
# After SIGTERM at the timeout: digits jobs stop at their next step. Then SIGKILL, which the
# parallel launcher's jobs hear as SIGTERM (they end with their launcher), so no device time goes
# to waiting out the launcher's own 60 s of grace.
STOP_S = 20
# `parallel` is "clearly" faster than `basic` at this ratio of wall times or more.
CLEAR_SPEEDUP = 1.2
NOT_SHOWN = "not shown (CPU)"
# The second validation on, after 2 finished trials: a short search can show a pruned trial.
PRUNER = "{_target_:optuna.pruners.MedianPruner,n_startup_trials:2,n_warmup_steps:1}"
# Its first trials' learning rates 4.5e-3, 4.9e-2, then 1.2e-4 (too slow for 4 epochs: pruned) and
# 5.9e-3; the shipped 1234 draws none that the median pruner stops.
SAMPLER_SEED = 3
STATES = {"complete": "completed", "pruned": "pruned", "fail": "failed"}  # journal -> summary


@dataclass
class Launch:
    """What the launcher's log says of one job."""

    start: float | None = None
    end: float | None = None
    gpus: str | None = None  # "1", "0,1"; None on the CPU and under the basic launcher


@dataclass
class JobEvidence:
    job: int
    status: str  # summary.csv's
    visible: list[str]  # CUDA_VISIBLE_DEVICES of each rank, from its log; [] on the CPU
    ranks: int  # processes that logged (train.log, train_rank1.log, ...)
    devices: list[str]  # device.json: the GPUs the job's process saw
    launched_gpus: str | None
    start: float | None
    end: float | None
    first_log: float | None  # the first line of its train.log: imports, config, device report
    error: str
    directory: str


@dataclass
class SweepRun:
    label: str
    command: list[str]
    wall_s: float
    returncode: int | None  # None: stopped at the timeout
    sweep_dir: str | None
    log: str
    jobs: list[JobEvidence] = field(default_factory=list)


@dataclass
class Check:
    claim: str
    verdict: str  # yes, NO, or NOT_SHOWN
    detail: str


def verdict(ok: bool) -> str:
    return "yes" if ok else "NO"


# --- reading what a sweep wrote ------------------------------------------------------------------


def seconds_after(stamp: str, t0: datetime) -> float:
    when = datetime.strptime(stamp, TIME_FORMAT) if "," in stamp else datetime.fromisoformat(stamp)
    return round((when - t0).total_seconds(), 2)


def parse_launcher_log(text: str, t0: datetime) -> dict[int, Launch]:
    lines = [(m.group(1), m.group(2)) for m in map(HYDRA_LINE.match, text.splitlines()) if m]
    # The parallel launcher lists every job's overrides as Hydra's basic launcher does, but as it
    # plans the sweep: there a job starts at its `started` line.
    parallel = any(STARTED.match(message) for _, message in lines)
    launches: dict[int, Launch] = {}
    for stamp, message in lines:
        at = seconds_after(stamp, t0)
        if started := (STARTED if parallel else BASIC_STARTED).match(message):
            gpus = started.group(2) if parallel else None
            launches[int(started.group(1))] = Launch(start=at, gpus=gpus)
        elif ended := ENDED.match(message):
            launches.setdefault(int(ended.group(1)), Launch()).end = at
    return launches


def visible_devices(job_dir: Path) -> tuple[list[str], int]:
    """CUDA_VISIBLE_DEVICES of each rank (rank order) as Lightning logged it, and how many ranks
    wrote a log."""
    logs = sorted(job_dir.glob("train*.log"))
    seen: dict[int, str] = {}
    for log in logs:
        for rank, devices in VISIBLE.findall(log.read_text(errors="replace")):
            seen[int(rank)] = devices.replace(" ", "")
    return [seen[rank] for rank in sorted(seen)], len(logs)


def read_json(path: Path) -> dict:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def first_log_line(log: Path, t0: datetime) -> float | None:
    try:
        with log.open(errors="replace") as f:
            stamp = LOG_TIME.match(f.readline())
    except OSError:
        return None
    return seconds_after(stamp.group(1), t0) if stamp else None


def job_evidence(row: dict[str, str], launch: Launch, t0: datetime) -> JobEvidence:
    directory = Path(row["dir"])
    record = read_json(directory / "run.json")
    visible, ranks = visible_devices(directory)
    end = launch.end
    if end is None and record.get("ended"):  # the basic launcher logs no end
        end = seconds_after(record["ended"], t0)
    return JobEvidence(
        job=int(row["job"]),
        status=row["status"],
        visible=visible,
        ranks=ranks,
        devices=[gpu["name"] for gpu in read_json(directory / "device.json").get("gpus", [])],
        launched_gpus=launch.gpus,
        start=launch.start,
        end=end,
        first_log=first_log_line(directory / "train.log", t0),
        error=row.get("error", ""),
        directory=str(directory),
    )


def read_jobs(sweep_dir: Path, launches: dict[int, Launch], t0: datetime) -> list[JobEvidence]:
    """One per row of the sweep's summary.csv, in job order."""
    try:
        with (sweep_dir / "summary.csv").open() as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return []
    jobs = [job_evidence(row, launches.get(int(row["job"]), Launch()), t0) for row in rows]
    return sorted(jobs, key=lambda job: job.job)


def read_study(sweep_dir: Path) -> list[dict]:
    """Every trial of the search's study, read back from its journal."""
    import optuna  # only a search needs it
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(sweep_dir / "optuna.journal")))
    (study,) = storage.get_all_studies()
    trials = optuna.load_study(study_name=study.study_name, storage=storage).trials
    return [
        {"number": t.number, "state": t.state.name.lower(), "value": t.value, "params": t.params}
        for t in trials
    ]


# --- checks on the evidence ----------------------------------------------------------------------


def overlap(a: JobEvidence, b: JobEvidence) -> bool:
    if None in (a.start, a.end, b.start, b.end):
        return False
    return a.start < b.end and b.start < a.end  # type: ignore[operator]  # checked above


def most_at_once(jobs: Sequence[JobEvidence]) -> int:
    events = sorted(
        (t, step) for job in jobs for t, step in ((job.start, 1), (job.end, -1)) if t is not None
    )  # at equal times an end (-1) sorts before a start
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def job_gpus(job: JobEvidence) -> set[str]:
    return {gpu for devices in job.visible for gpu in devices.split(",") if gpu}


def all_ended(run: SweepRun, statuses: Sequence[str]) -> Check:
    seen = [job.status for job in run.jobs]
    detail = f"summary.csv: {seen or 'missing'}; sweep exit status {run.returncode}"
    return Check(f"{run.label}: jobs ended {list(statuses)}", verdict(seen == statuses), detail)


def at_once(run: SweepRun, expected: int) -> Check:
    peak = most_at_once(run.jobs)
    pairs = [
        f"{a.job}+{b.job}"
        for i, a in enumerate(run.jobs)
        for b in run.jobs[i + 1 :]
        if overlap(a, b)
    ]
    detail = f"at most {peak} at once; overlapping: {', '.join(pairs) or 'none'}"
    return Check(f"{run.label}: {expected} job(s) at a time", verdict(peak == expected), detail)


def own_gpus(run: SweepRun, per_job: int, cpu: bool) -> Check:
    """Each job's every rank was given the same `per_job` GPUs, those the launcher says it gave,
    the job's device report saw as many, and jobs that ran at the same time shared none."""
    claim = f"{run.label}: each job on {per_job} GPU(s) of its own"
    if cpu:
        return Check(claim, NOT_SHOWN, "jobs on the CPU hold no GPU")
    wrong = [
        f"#{job.job} given {job.visible}, launcher {job.launched_gpus}, saw {job.devices}"
        for job in run.jobs
        if len(set(job.visible)) != 1
        or len(job_gpus(job)) != per_job
        or job.visible[0] != job.launched_gpus
        or len(job.devices) != per_job
    ]
    shared = [
        f"#{a.job} and #{b.job} both on {sorted(job_gpus(a) & job_gpus(b))}"
        for i, a in enumerate(run.jobs)
        for b in run.jobs[i + 1 :]
        if overlap(a, b) and job_gpus(a) & job_gpus(b)
    ]
    given = "; ".join(f"#{job.job}: {' / '.join(job.visible)}" for job in run.jobs)
    detail = "; ".join(wrong + shared) or f"CUDA_VISIBLE_DEVICES per rank: {given}"
    return Check(claim, verdict(bool(run.jobs) and not wrong and not shared), detail)


def side_by_side_checks(parallel: SweepRun, basic: SweepRun, slots: int, cpu: bool) -> list[Check]:
    jobs = len(parallel.jobs) or len(basic.jobs)
    ratio = basic.wall_s / parallel.wall_s
    faster = Check(
        f"parallel takes clearly less wall time (basic / parallel >= {CLEAR_SPEEDUP})",
        verdict(ratio >= CLEAR_SPEEDUP),
        f"{parallel.wall_s:.1f} s against {basic.wall_s:.1f} s: {ratio:.2f}x",
    )
    return [
        all_ended(parallel, ["completed"] * jobs),
        all_ended(basic, ["completed"] * jobs),
        at_once(parallel, min(slots, jobs)),
        own_gpus(parallel, 1, cpu),
        at_once(basic, 1),
        faster,
    ]


def ddp_queue_checks(run: SweepRun, gpus: int, cpu: bool) -> list[Check]:
    ranks = [job.ranks for job in run.jobs]
    checks = [
        all_ended(run, ["completed"] * 2),
        Check(
            f"{run.label}: each job ran {gpus} ranks",
            verdict(bool(ranks) and all(r == gpus for r in ranks)),
            f"rank logs per job: {ranks}",
        ),
        own_gpus(run, gpus, cpu),
    ]
    if cpu:
        peak = most_at_once(run.jobs)
        detail = f"DDP jobs on the CPU take no GPU: n_jobs=2 let {peak} run at once"
        return [*checks, Check(f"{run.label}: one DDP job at a time", NOT_SHOWN, detail)]
    return [*checks, at_once(run, 1)]


def optuna_checks(
    run: SweepRun, trials: list[dict], best: dict, slots: int, cpu: bool
) -> list[Check]:
    expected = len(run.jobs)
    states = {t["number"]: t["state"] for t in trials}
    counts = {state: list(states.values()).count(state) for state in sorted(set(states.values()))}
    summary = {job.job: job.status for job in run.jobs}
    mismatched = [
        f"#{n}: journal {s}, summary {summary.get(n)}"
        for n, s in states.items()
        if STATES.get(s) != summary.get(n)
    ]
    complete = [t for t in trials if t["state"] == "complete"]
    best_trial = max(complete, key=lambda t: t["value"])["number"] if complete else None
    written = {k: v for k, v in best.get("trials", {}).items() if v}
    return [
        Check(
            "every trial in the journal, each finished",
            verdict(len(trials) == expected > 0 and all(s in STATES for s in states.values())),
            f"{len(trials)} trials for {expected} jobs: {counts}",
        ),
        Check("a trial was pruned", verdict(counts.get("pruned", 0) > 0), f"states: {states}"),
        Check(
            "summary.csv agrees with the journal",
            verdict(not mismatched and len(summary) == len(states)),
            "; ".join(mismatched) or f"statuses: {summary}",
        ),
        Check(
            "best.yaml written from the whole study",
            verdict(written == counts and best.get("trial") == best_trial),
            f"best.yaml: trial {best.get('trial')}, counts {written or 'missing'};"
            f" journal's best {best_trial}",
        ),
        at_once(run, slots),
        own_gpus(run, 1, cpu),
    ]


def failure_checks(run: SweepRun, cpu: bool) -> list[Check]:
    jobs = {job.job: job for job in run.jobs}
    if sorted(jobs) != [0, 1, 2]:
        return [all_ended(run, ["failed", "completed", "completed"])]
    failed, other, next_job = jobs[0], jobs[1], jobs[2]
    record = read_json(Path(failed.directory) / "run.json")
    trained = record.get("status") == "failed" and "non-finite" in failed.error
    took = job_gpus(failed) == job_gpus(next_job) and len(job_gpus(failed)) == 1
    handed = (
        None not in (failed.end, next_job.start, other.end)
        and failed.end <= next_job.start < other.end  # type: ignore[operator]
    )
    place = "(CPU: a slot)" if cpu else "on its GPU " + ",".join(sorted(job_gpus(failed)))
    return [
        all_ended(run, ["failed", "completed", "completed"]),
        Check(
            f"#0 failed inside its run, after the config checks{'' if cpu else ', on its GPU'}",
            verdict(trained and (cpu or bool(failed.visible))),
            f"run.json: {record.get('status')}; CUDA_VISIBLE_DEVICES {failed.visible or '-'};"
            f" error: {failed.error[:120]}",
        ),
        Check(
            f"#2 started when #0 ended {place}, while #1 still ran",
            verdict(handed and (cpu or took)),
            f"#0 ended {failed.end} s, #2 started {next_job.start} s on"
            f" {next_job.visible or 'CPU'}, #1 ended {other.end} s",
        ),
        Check(
            "the sweep exits non-zero",
            verdict(run.returncode not in (0, None)),
            f"exit status {run.returncode}",
        ),
    ]


# --- running sweeps ------------------------------------------------------------------------------


def sweep_command(overrides: list[str], outputs: Path, cpu: bool) -> list[str]:
    command = [sys.executable, "train.py", "-m", *overrides, *QUIET, f"paths.outputs_dir={outputs}"]
    if cpu and "hydra/launcher=parallel" in overrides:
        command.append("hydra.launcher.n_jobs=2")
    return command


def follow(log: Path, offset: int, prefix: str) -> int:
    """Print the launcher's lines the log gained since `offset`; the new offset."""
    with log.open("rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    complete = text[: text.rfind("\n") + 1]
    for line in complete.splitlines():
        if hydra := HYDRA_LINE.match(line):
            print(f"  {prefix} {hydra.group(2).strip().split(' -> ')[0][:160]}")
    return offset + len(complete.encode())


def run_sweep(
    scenario: str, label: str, overrides: list[str], args: argparse.Namespace
) -> SweepRun:
    outputs = Path(args.outputs, f"{scenario}-{label}")
    command = sweep_command(overrides, outputs, args.cpu)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""} if args.cpu else dict(os.environ)
    log = Path(args.outputs, f"{scenario}-{label}.log")
    print(f"[{scenario}/{label}] {shlex.join(['python', *command[1:]])}")
    t0, clock, offset = datetime.now(), harness.Console(), 0

    def watch() -> None:  # the launcher's lines as they come
        nonlocal offset
        offset = follow(log, offset, f"[{scenario}/{label} +{clock.elapsed():.0f}s]")

    done = harness.run_fresh(
        command, log, args.timeout, cwd=PROJECT, env=env, grace_s=STOP_S, watch=watch
    )
    watch()
    sweep_dirs = sorted(outputs.glob("train/multiruns/*"))
    sweep_dir = sweep_dirs[-1] if sweep_dirs else None
    launches = parse_launcher_log(done.text(), t0)
    jobs = read_jobs(sweep_dir, launches, t0) if sweep_dir else []
    ended = "stopped at the timeout" if done.status is None else f"exit {done.status}"
    print(f"[{scenario}/{label}] {done.wall_s:.1f} s wall, {ended}, {len(jobs)} jobs")
    wall = round(done.wall_s, 2)
    return SweepRun(label, command, wall, done.status, str(sweep_dir), str(log), jobs)


@dataclass
class Scenario:
    name: str
    sweeps: list[SweepRun]
    checks: list[Check]
    extra: dict = field(default_factory=dict)


def side_by_side(args: argparse.Namespace) -> Scenario:
    seeds = ",".join(str(seed) for seed in range(1, args.jobs + 1))
    grid = ["experiment=digits_cnn", f"seed={seeds}", f"trainer.max_epochs={args.epochs}", *FULL]
    parallel = run_sweep("side-by-side", "parallel", [*grid, "hydra/launcher=parallel"], args)
    basic = run_sweep("side-by-side", "basic", [*grid, "hydra/launcher=basic"], args)
    checks = side_by_side_checks(parallel, basic, args.slots, args.cpu)
    return Scenario("side-by-side", [parallel, basic], checks)


def ddp_queue(args: argparse.Namespace) -> Scenario:
    grid = ["experiment=digits_cnn", "trainer=ddp", "seed=1,2", "trainer.max_epochs=2", *FULL]
    run = run_sweep("ddp-queue", "parallel", [*grid, "hydra/launcher=parallel"], args)
    return Scenario("ddp-queue", [run], ddp_queue_checks(run, args.slots, args.cpu))


def search(args: argparse.Namespace) -> Scenario:
    overrides = [
        "hparams_search=digits_optuna",
        f"hydra.sweeper.n_trials={args.trials}",
        f"hydra.sweeper.n_jobs={args.slots}",
        f"hydra.sweeper.pruner={PRUNER}",
        f"hydra.sweeper.sampler.seed={SAMPLER_SEED}",
        "trainer.max_epochs=4",
        *FULL,
        "hydra/launcher=parallel",
    ]
    run = run_sweep("optuna", "parallel", overrides, args)
    sweep_dir = Path(run.sweep_dir or "")
    journal = sweep_dir / "optuna.journal"
    trials = read_study(sweep_dir) if journal.is_file() else []
    best_file = sweep_dir / "best.yaml"
    best = yaml.safe_load(best_file.read_text()) if best_file.is_file() else {}
    checks = optuna_checks(run, trials, best, args.slots, args.cpu)
    return Scenario("optuna", [run], checks, {"trials": trials, "best": best})


def failure(args: argparse.Namespace) -> Scenario:
    # lr=1000 passes every config check and diverges within the first epoch (NaN guard).
    grid = ["experiment=digits_cnn", "model.optimizer.lr=1000,0.002,0.001"]
    grid += [f"trainer.max_epochs={args.epochs}", *FULL, "hydra/launcher=parallel"]
    run = run_sweep("failure", "parallel", grid, args)
    return Scenario("failure", [run], failure_checks(run, args.cpu))


RUNNERS: dict[str, Callable[[argparse.Namespace], Scenario]] = {
    "side-by-side": side_by_side,
    "ddp-queue": ddp_queue,
    "optuna": search,
    "failure": failure,
}


# --- the report ----------------------------------------------------------------------------------


def gpus_here() -> list[str]:
    """`nvidia-smi -L`'s lines (name and UUID of each GPU); [] without a driver."""
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line for line in listed.stdout.splitlines() if line.startswith("GPU ")]


def where(job: JobEvidence) -> str:
    if not job.visible:
        return "CPU"
    ranks = f" ({len(job.visible)} ranks)" if len(job.visible) > 1 else ""
    return " / ".join(dict.fromkeys(job.visible)) + ranks


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def ran(job: JobEvidence) -> list[str]:
    return [seconds(job.start), seconds(job.end), job.status]


def markdown(scenarios: list[Scenario], machine: str) -> str:
    lines = [f"## Sweeps side by side on {machine} ({datetime.now():%Y-%m-%d})", ""]
    for scenario in scenarios:
        lines += [f"### {scenario.name}", ""]
        for run in scenario.sweeps:
            lines += [f"`{shlex.join(['python', *run.command[1:]])}`", ""]
        sweeps = []
        for run in scenario.sweeps:
            setup = [j.first_log - j.start for j in run.jobs if j.first_log and j.start is not None]
            median = f"{statistics.median(setup):.1f}" if setup else "-"
            exit_status = "timed out" if run.returncode is None else str(run.returncode)
            sweeps.append([run.label, f"{run.wall_s:.1f}", exit_status, median])
        columns = ["sweep", "wall s", "exit", "per job: launch to first log line s, median"]
        lines += [*harness.markdown_table(columns, "lrlr", sweeps), ""]
        jobs = [
            [run.label, str(job.job), where(job), ", ".join(job.devices) or "CPU", *ran(job)]
            for run in scenario.sweeps
            for job in run.jobs
        ]
        columns = ["sweep", "job", "GPU(s) given", "GPUs seen", "start s", "end s", "status"]
        lines += [*harness.markdown_table(columns, "lrllrrl", jobs), ""]
        lines += [f"- **{c.verdict}**: {c.claim}: {c.detail}" for c in scenario.checks]
        lines.append("")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--outputs", help="sweep outputs and logs (default: a new temp dir)")
    parser.add_argument("--json", help="results, rewritten after each scenario")
    parser.add_argument("--cpu", action="store_true", help="on the CPU, 2 jobs at once")
    parser.add_argument("--jobs", type=int, default=4, help="side-by-side's sweep size")
    parser.add_argument("--epochs", type=int, help="side-by-side and failure (30; --cpu 2)")
    parser.add_argument("--trials", type=int, default=4, help="optuna's trials")
    parser.add_argument("--timeout", type=float, default=180, help="s per sweep")
    args = parser.parse_args(argv)
    args.epochs = args.epochs or (2 if args.cpu else 30)
    args.outputs = args.outputs or tempfile.mkdtemp(prefix="gpu-sweeps-")
    return args


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # a TextIOWrapper
    args = parse_args()
    gpus = gpus_here()
    if not args.cpu and len(gpus) < 2:
        sys.exit(f"gpu_sweeps: nvidia-smi -L lists {len(gpus)} GPU(s), 2 are needed: or use --cpu")
    args.slots = 2 if args.cpu else len(gpus)
    machine = (
        "the CPU (--cpu: GPU placement not shown)"
        if args.cpu
        else f"{len(gpus)} x " + (gpus[0].split(":", 1)[1].split("(UUID")[0].strip())
    )

    def stopped(signum: int, frame: FrameType | None) -> None:
        sys.exit(128 + signum)  # through run_sweep's finally: the sweep is stopped too

    signal.signal(signal.SIGTERM, stopped)
    Path(args.outputs).mkdir(parents=True, exist_ok=True)
    print(f"gpu_sweeps on {machine}: {' '.join(args.scenarios)}; outputs in {args.outputs}")
    done: list[Scenario] = []
    for name in args.scenarios:
        done.append(RUNNERS[name](args))
        for check in done[-1].checks:
            print(f"  [{name}] {check.verdict}: {check.claim} ({check.detail})")
        if args.json:
            record = {"machine": machine, "mode": "cpu" if args.cpu else "gpu"}
            harness.save_json(Path(args.json), record | {"scenarios": [asdict(s) for s in done]})
    print("\n" + markdown(done, machine))


if __name__ == "__main__":
    main()
