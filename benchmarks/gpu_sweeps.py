"""Sweeps on the GPUs of one host (issue #25): what `hydra/launcher=parallel` does with them,
shown from what each sweep wrote.

    python benchmarks/gpu_sweeps.py --json sweeps.json        # all scenarios, on 2 GPUs
    python benchmarks/gpu_sweeps.py --scenarios side-by-side failure --epochs 20
    python benchmarks/gpu_sweeps.py --cpu                      # no GPU: the CPU, 2 jobs at once

Each scenario is a real `python train.py -m ...` from the repository root, stopped at --timeout.
side-by-side: `experiment=digits_cnn seed=1..N` one job per GPU (`hydra/launcher=parallel`, first,
so a cold start counts against it), then one at a time (`basic`). ddp-queue: 2 `trainer=ddp` jobs
that each want every GPU, so run in turn. optuna: `hparams_search=digits_optuna`, --trials trials
as many at once as there are GPUs, pruned from the second validation on. failure:
`model.optimizer.lr=1000,0.002,0.001`: volt's NaN guard stops the first job after it has trained
on its GPU, which goes to the third job.

The evidence, in seconds after the sweep started: the launcher's log lines (each job's launch,
GPUs, end); Lightning's `LOCAL_RANK: r - CUDA_VISIBLE_DEVICES: [..]` line in each rank's log;
device.json (the GPUs a job saw); run.json (how it ended; when, under the basic launcher, which
logs no end); summary.csv; a search's optuna.journal and best.yaml. --cpu runs the same sweeps on
the CPU (`hydra.launcher.n_jobs=2`, DDP jobs as 2 gloo ranks), where no job holds a GPU: GPU
placement and the DDP jobs' queueing are not shown there.
"""

import argparse
import csv
import itertools
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

import harness  # benchmarks/, the folder of this script, is first on sys.path
import yaml

QUIET = ["callbacks.progress_bar=null", "callbacks.model_summary=null"]
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
CLEAR_SPEEDUP = 1.2  # `parallel` is "clearly" faster than `basic` at this ratio of wall times
NOT_SHOWN = "not shown (CPU)"
# The second validation on, after 2 finished trials: a short search can show a pruned trial.
PRUNER = "{_target_:optuna.pruners.MedianPruner,n_startup_trials:2,n_warmup_steps:1}"
# Its first trials' learning rates 4.5e-3, 4.9e-2, then 1.2e-4 (too slow for 4 epochs: pruned) and
# 5.9e-3; the shipped 1234 draws none that the median pruner stops.
SAMPLER_SEED = 3
STATES = {"complete": "completed", "pruned": "pruned", "fail": "failed"}  # journal -> summary


@dataclass
class Launch:  # what the launcher's log says of one job
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
    label: str  # its launcher
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


@dataclass
class Scenario:
    name: str
    sweeps: list[SweepRun]
    checks: list[Check]
    extra: dict = field(default_factory=dict)


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


def read_json(path: Path) -> dict:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def job_evidence(row: dict[str, str], launch: Launch, t0: datetime) -> JobEvidence:
    directory = Path(row["dir"])
    logs = sorted(directory.glob("train*.log"))  # train.log, train_rank1.log, ...
    texts = [log.read_text(errors="replace") for log in logs]
    seen = {
        int(rank): gpus.replace(" ", "") for text in texts for rank, gpus in VISIBLE.findall(text)
    }
    log = directory / "train.log"
    first = LOG_TIME.match(log.read_text(errors="replace")) if log.is_file() else None
    ended = read_json(directory / "run.json").get("ended")  # the basic launcher logs no end
    end = seconds_after(ended, t0) if launch.end is None and ended else launch.end
    return JobEvidence(
        job=int(row["job"]),
        status=row["status"],
        visible=[seen[rank] for rank in sorted(seen)],
        ranks=len(logs),
        devices=[gpu["name"] for gpu in read_json(directory / "device.json").get("gpus", [])],
        launched_gpus=launch.gpus,
        start=launch.start,
        end=end,
        first_log=seconds_after(first.group(1), t0) if first else None,
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
    """Every trial of the search's study, read back from its journal; [] without one."""
    if not (journal := sweep_dir / "optuna.journal").is_file():
        return []
    import optuna  # only a search needs it
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(journal)))
    (study,) = storage.get_all_studies()
    trials = optuna.load_study(study_name=study.study_name, storage=storage).trials
    return [
        {"number": t.number, "state": t.state.name.lower(), "value": t.value, "params": t.params}
        for t in trials
    ]


# --- checks on the evidence ----------------------------------------------------------------------


def check(claim: str, ok: bool, detail: str) -> Check:
    return Check(claim, "yes" if ok else "NO", detail)


def overlapping(jobs: Sequence[JobEvidence]) -> list[tuple[JobEvidence, JobEvidence]]:
    return [
        (a, b)
        for a, b in itertools.combinations(jobs, 2)
        if None not in (a.start, a.end, b.start, b.end)
        and a.start < b.end and b.start < a.end  # type: ignore[operator]  # checked above
    ]  # fmt: skip


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
    return check(f"{run.label}: jobs ended {list(statuses)}", seen == statuses, detail)


def at_once(run: SweepRun, expected: int) -> Check:
    peak, pairs = most_at_once(run.jobs), [f"{a.job}+{b.job}" for a, b in overlapping(run.jobs)]
    detail = f"at most {peak} at once; overlapping: {', '.join(pairs) or 'none'}"
    return check(f"{run.label}: {expected} job(s) at a time", peak == expected, detail)


def own_gpus(run: SweepRun, per_job: int, cpu: bool) -> Check:
    """Each job's every rank was given the same `per_job` GPUs, those the launcher says it gave,
    the job's device report saw as many, and jobs that ran at the same time shared none."""
    claim = f"{run.label}: each job on {per_job} GPU(s) of its own"
    if cpu:
        return Check(claim, NOT_SHOWN, "jobs on the CPU hold no GPU")
    wrong = [
        f"#{job.job} given {job.visible}, launcher {job.launched_gpus}, saw {job.devices}"
        for job in run.jobs
        if set(job.visible) != {job.launched_gpus}
        or len(job_gpus(job)) != per_job
        or len(job.devices) != per_job
    ]
    shared = [
        f"#{a.job} and #{b.job} both on {sorted(job_gpus(a) & job_gpus(b))}"
        for a, b in overlapping(run.jobs)
        if job_gpus(a) & job_gpus(b)
    ]
    given = "; ".join(f"#{job.job}: {' / '.join(job.visible)}" for job in run.jobs)
    detail = "; ".join(wrong + shared) or f"CUDA_VISIBLE_DEVICES per rank: {given}"
    return check(claim, bool(run.jobs) and not wrong and not shared, detail)


def optuna_checks(
    run: SweepRun, trials: list[dict], best: dict, slots: int, cpu: bool
) -> list[Check]:
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
        check(
            "every trial in the journal, each finished",
            len(trials) == len(run.jobs) > 0 and all(s in STATES for s in states.values()),
            f"{len(trials)} trials for {len(run.jobs)} jobs: {counts}",
        ),
        check("a trial was pruned", counts.get("pruned", 0) > 0, f"states: {states}"),
        check(
            "summary.csv agrees with the journal",
            not mismatched and len(summary) == len(states),
            "; ".join(mismatched) or f"statuses: {summary}",
        ),
        check(
            "best.yaml written from the whole study",
            written == counts and best.get("trial") == best_trial,
            f"best.yaml: trial {best.get('trial')}, counts {written or 'missing'};"
            f" journal's best {best_trial}",
        ),
        at_once(run, slots),
        own_gpus(run, 1, cpu),
    ]


def failure_checks(run: SweepRun, cpu: bool) -> list[Check]:
    jobs = {job.job: job for job in run.jobs}
    ended = all_ended(run, ["failed", "completed", "completed"])
    if sorted(jobs) != [0, 1, 2]:
        return [ended]
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
        ended,
        check(
            f"#0 failed inside its run, after the config checks{'' if cpu else ', on its GPU'}",
            trained and (cpu or bool(failed.visible)),
            f"run.json: {record.get('status')}; CUDA_VISIBLE_DEVICES {failed.visible or '-'};"
            f" error: {failed.error[:120]}",
        ),
        check(
            f"#2 started when #0 ended {place}, while #1 still ran",
            handed and (cpu or took),
            f"#0 ended {failed.end} s, #2 started {next_job.start} s on"
            f" {next_job.visible or 'CPU'}, #1 ended {other.end} s",
        ),
        check(
            "the sweep exits non-zero",
            run.returncode not in (0, None),
            f"exit status {run.returncode}",
        ),
    ]


# --- the scenarios -------------------------------------------------------------------------------


def run_sweep(
    scenario: str, overrides: list[str], epochs: int, args: argparse.Namespace, launcher: str
) -> SweepRun:
    """`python train.py -m` with `overrides`, every job for all its `epochs` (the sides of a
    comparison do the same work), under `launcher`; the launcher's lines printed as they come."""
    outputs, name = Path(args.outputs, f"{scenario}-{launcher}"), f"{scenario}/{launcher}"
    command = [sys.executable, "train.py", "-m", *overrides, f"trainer.max_epochs={epochs}"]
    command += ["callbacks.early_stopping=null", f"hydra/launcher={launcher}", *QUIET]
    command.append(f"paths.outputs_dir={outputs}")
    if args.cpu and launcher == "parallel":
        command.append("hydra.launcher.n_jobs=2")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""} if args.cpu else None
    log = Path(args.outputs, f"{scenario}-{launcher}.log")
    print(f"[{name}] {shlex.join(['python', *command[1:]])}")
    t0, clock = datetime.now(), harness.Console()

    def show(line: str) -> None:
        if hydra := HYDRA_LINE.match(line):
            message = hydra.group(2).strip().split(" -> ")[0][:160]
            print(f"  [{name} +{clock.elapsed():.0f}s] {message}")

    tail = harness.LogTail(log, show)
    done = harness.run_fresh(
        command, log, args.timeout, cwd=harness.PROJECT, env=env, grace_s=STOP_S, watch=tail
    )
    tail()
    sweep_dir = max(outputs.glob("train/multiruns/*"), default=None)
    jobs = read_jobs(sweep_dir, parse_launcher_log(done.text(), t0), t0) if sweep_dir else []
    ended = "stopped at the timeout" if done.status is None else f"exit {done.status}"
    print(f"[{name}] {done.wall_s:.1f} s wall, {ended}, {len(jobs)} jobs")
    wall = round(done.wall_s, 2)
    return SweepRun(launcher, command, wall, done.status, str(sweep_dir), str(log), jobs)


def side_by_side(args: argparse.Namespace) -> Scenario:
    grid = ["experiment=digits_cnn", "seed=" + ",".join(map(str, range(1, args.jobs + 1)))]
    parallel = run_sweep("side-by-side", grid, args.epochs, args, "parallel")
    basic = run_sweep("side-by-side", grid, args.epochs, args, "basic")
    jobs, ratio = len(parallel.jobs) or len(basic.jobs), basic.wall_s / parallel.wall_s
    checks = [
        all_ended(parallel, ["completed"] * jobs),
        all_ended(basic, ["completed"] * jobs),
        at_once(parallel, min(args.slots, jobs)),
        own_gpus(parallel, 1, args.cpu),
        at_once(basic, 1),
        check(
            f"parallel takes clearly less wall time (basic / parallel >= {CLEAR_SPEEDUP})",
            ratio >= CLEAR_SPEEDUP,
            f"{parallel.wall_s:.1f} s against {basic.wall_s:.1f} s: {ratio:.2f}x",
        ),
    ]
    return Scenario("side-by-side", [parallel, basic], checks)


def ddp_queue(args: argparse.Namespace) -> Scenario:
    grid = ["experiment=digits_cnn", "trainer=ddp", "seed=1,2"]
    run, gpus = run_sweep("ddp-queue", grid, 2, args, "parallel"), args.slots
    ranks = [job.ranks for job in run.jobs]
    detail = f"DDP jobs on the CPU take no GPU: n_jobs=2 let {most_at_once(run.jobs)} run at once"
    checks = [
        all_ended(run, ["completed"] * 2),
        check(
            f"{run.label}: each job ran {gpus} ranks",
            bool(ranks) and all(r == gpus for r in ranks),
            f"rank logs per job: {ranks}",
        ),
        own_gpus(run, gpus, args.cpu),
        Check(f"{run.label}: one DDP job at a time", NOT_SHOWN, detail)
        if args.cpu
        else at_once(run, 1),
    ]
    return Scenario("ddp-queue", [run], checks)


def search(args: argparse.Namespace) -> Scenario:
    overrides = ["hparams_search=digits_optuna", f"hydra.sweeper.n_trials={args.trials}"]
    overrides += [f"hydra.sweeper.n_jobs={args.slots}", f"hydra.sweeper.pruner={PRUNER}"]
    overrides.append(f"hydra.sweeper.sampler.seed={SAMPLER_SEED}")
    run = run_sweep("optuna", overrides, 4, args, "parallel")
    trials = read_study(Path(run.sweep_dir or ""))
    best_file = Path(run.sweep_dir or "", "best.yaml")
    best = yaml.safe_load(best_file.read_text()) if best_file.is_file() else {}
    checks = optuna_checks(run, trials, best, args.slots, args.cpu)
    return Scenario("optuna", [run], checks, {"trials": trials, "best": best})


def failure(args: argparse.Namespace) -> Scenario:
    # lr=1000 passes every config check and diverges within the first epoch (NaN guard).
    grid = ["experiment=digits_cnn", "model.optimizer.lr=1000,0.002,0.001"]
    run = run_sweep("failure", grid, args.epochs, args, "parallel")
    return Scenario("failure", [run], failure_checks(run, args.cpu))


RUNNERS: dict[str, Callable[[argparse.Namespace], Scenario]] = {
    "side-by-side": side_by_side,
    "ddp-queue": ddp_queue,
    "optuna": search,
    "failure": failure,
}


# --- the report ----------------------------------------------------------------------------------


def gpus_here() -> list[str]:
    """The GPUs' names, from `nvidia-smi -L` (`GPU 0: <name> (UUID: ...)`); [] without a driver."""
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    lines = [line for line in listed.stdout.splitlines() if line.startswith("GPU ")]
    return [line.split(":", 1)[1].split("(UUID")[0].strip() for line in lines]


def where(job: JobEvidence) -> str:
    if not job.visible:
        return "CPU"
    ranks = f" ({len(job.visible)} ranks)" if len(job.visible) > 1 else ""
    return " / ".join(dict.fromkeys(job.visible)) + ranks


def ran(job: JobEvidence) -> list[str]:
    return [*("-" if t is None else f"{t:.1f}" for t in (job.start, job.end)), job.status]


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
    parser.add_argument("--scenarios", nargs="+", choices=list(RUNNERS), default=list(RUNNERS))
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
    machine = "the CPU (--cpu: GPU placement not shown)" if args.cpu else f"{len(gpus)} x {gpus[0]}"
    # SIGTERM exits through run_fresh's finally, which stops the sweep too
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    Path(args.outputs).mkdir(parents=True, exist_ok=True)
    print(f"gpu_sweeps on {machine}: {' '.join(args.scenarios)}; outputs in {args.outputs}")
    done: list[Scenario] = []
    for name in args.scenarios:
        done.append(RUNNERS[name](args))
        for c in done[-1].checks:
            print(f"  [{name}] {c.verdict}: {c.claim} ({c.detail})")
        if args.json:
            record = {"machine": machine, "mode": "cpu" if args.cpu else "gpu"}
            harness.save_json(Path(args.json), record | {"scenarios": [asdict(s) for s in done]})
    print("\n" + markdown(done, machine))


if __name__ == "__main__":
    main()
