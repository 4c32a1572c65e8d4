"""volt's Optuna search without training: the study, batches, continuing and best.yaml, with a
launcher that answers at once (tests/sweeps/test_search_runs.py runs real ones)."""

from collections.abc import Sequence
from pathlib import Path

import optuna
import pytest
import yaml
from hydra.core.utils import JobReturn, JobStatus
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.samplers import GridSampler, RandomSampler
from optuna.trial import TrialState

from volt.errors import ConfigError
from volt.sweeps.pruning import TRIAL_VARIABLE
from volt.sweeps.search import (
    BEST_FILE,
    Search,
    SearchSpace,
    _contiguous,
    job_dir_name,
    open_study,
    parse_search_space,
)

SPACE = {
    "model.optimizer.lr": "tag(log, interval(1e-4, 1e-1))",
    "data.batch_size": "choice(32, 64)",
}


class Killed(Exception):
    """Stands for the sweep being killed while a batch runs."""


class FakeLauncher:
    """Returns each job's lr as its value; `kill_at`: the launch (0-based) that never returns."""

    def __init__(self, kill_at: int | None = None, fail: Sequence[int] = ()) -> None:
        self.launches: list[tuple[list[list[str]], int]] = []
        self.kill_at = kill_at
        self.fail = set(fail)

    def __call__(self, jobs: list[list[str]], first: int) -> list[JobReturn]:
        if len(self.launches) == self.kill_at:
            raise Killed
        self.launches.append((jobs, first))
        results = []
        for number, job in enumerate(jobs, start=first):
            assert f"hydra.job.env_set.{TRIAL_VARIABLE}={number}" in job
            assert job[-1].startswith(f"hydra.sweep.subdir='{number}_")
            lr = next(float(o.split("=")[1]) for o in job if o.startswith("model.optimizer.lr="))
            status = JobStatus.FAILED if number in self.fail else JobStatus.COMPLETED
            results.append(JobReturn(status=status, _return_value=lr))
        return results


def study_in(tmp_path: Path, space: SearchSpace, seeds: list[int] | None = None) -> optuna.Study:
    def sampler_for(trials_so_far: int) -> RandomSampler:
        if seeds is not None:
            seeds.append(trials_so_far)
        return RandomSampler(seed=trials_so_far)

    return open_study(tmp_path, "s", "maximize", space, sampler_for)


def test_the_search_space_comes_from_params_and_the_command_line() -> None:
    space = parse_search_space(
        {
            "a": "interval(0, 1)",
            "b": "tag(log, interval(1e-4, 1e-1))",
            "c": "tag(int, interval(1, 8))",
        },
        ["d=x,y", "e=range(2, 9, 3)", "name=grid", "f=choice(true, false)"],
    )
    assert space.distributions == {
        "a": FloatDistribution(0.0, 1.0),
        "b": FloatDistribution(1e-4, 1e-1, log=True),
        "c": IntDistribution(1, 8),
        "d": CategoricalDistribution(["x", "y"]),
        "e": IntDistribution(2, 8, step=3),
        "f": CategoricalDistribution([True, False]),
    }
    assert space.fixed == ["name=grid"]
    assert space.overrides({"a": 0.5, "b": 0.01, "c": 3, "d": "y", "e": 5, "f": False}) == [
        "name=grid", "a=0.5", "b=0.01", "c=3", "d=y", "e=5", "f=false"
    ]  # fmt: skip
    # The job directory: every parameter, floats short, nothing that would nest a directory.
    name = job_dir_name(3, {"model.optimizer.lr": 0.0007802732879310522, "d": "a/b", "c": 3})
    assert name == "3_model.optimizer.lr=0.0007803,d=a_b,c=3"
    with pytest.raises(ConfigError, match="nothing to search"):
        parse_search_space({}, ["name=grid"])


def test_batches_hold_trials_that_follow_one_another() -> None:
    class T:
        def __init__(self, number: int) -> None:
            self.number = number

    batches = _contiguous([T(n) for n in (5, 2, 3, 4, 8)], 2)  # type: ignore[misc]
    assert [[t.number for t in b] for b in batches] == [[2, 3], [4, 5], [8]]


def test_trials_go_out_in_batches_of_n_jobs_and_best_is_written(tmp_path: Path) -> None:
    space = parse_search_space(SPACE, ["name=s"])
    launcher = FakeLauncher(fail=[3])
    study = study_in(tmp_path, space)
    Search(study, space, launcher, tmp_path, "val/acc_best").run(n_trials=5, n_jobs=2)
    assert [(len(jobs), first) for jobs, first in launcher.launches] == [(2, 0), (2, 2), (1, 4)]
    states = [t.state for t in study.trials]
    assert states == [TrialState.COMPLETE] * 3 + [TrialState.FAIL, TrialState.COMPLETE]
    best = yaml.safe_load((tmp_path / BEST_FILE).read_text())
    values = {t.number: t.value for t in study.trials if t.state == TrialState.COMPLETE}
    assert best["value"] == max(values.values())
    assert best["trial"] == max(values, key=values.__getitem__)
    assert best["params"] == study.trials[best["trial"]].params
    assert best["trials"]["complete"] == 4 and best["trials"]["fail"] == 1
    assert best["objective"] == "val/acc_best"


def test_a_killed_search_redoes_its_running_trials_then_adds_new_ones(tmp_path: Path) -> None:
    space = parse_search_space(SPACE, ["name=s"])
    seeds: list[int] = []
    study = study_in(tmp_path, space, seeds)
    with pytest.raises(Killed):
        Search(study, space, FakeLauncher(kill_at=1), tmp_path, "v").run(n_trials=6, n_jobs=2)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2 + [TrialState.RUNNING] * 2
    interrupted = {t.number: t.params for t in study.trials[2:]}
    assert yaml.safe_load((tmp_path / BEST_FILE).read_text())["trials"]["complete"] == 2

    # The same command again: the same study, from the journal file.
    study = study_in(tmp_path, space, seeds)
    launcher = FakeLauncher()
    Search(study, space, launcher, tmp_path, "v").run(n_trials=5, n_jobs=2)
    (redo, redo_first), (new, new_first) = launcher.launches
    assert redo_first == 2 and len(redo) == 2  # the interrupted trials, as they were numbered
    for number, job in enumerate(redo, start=2):
        assert [f"{k}={v}" for k, v in interrupted[number].items()] == job[1:3]
    assert (new_first, len(new)) == (4, 1)  # then up to n_trials
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 5
    assert [t.params for t in study.trials[2:4]] == list(interrupted.values())
    assert seeds == [0, 4]  # seeded anew: the continuation does not draw trial 0's params again

    # A larger n_trials adds trials and leaves the others alone.
    launcher = FakeLauncher()
    Search(study_in(tmp_path, space), space, launcher, tmp_path, "v").run(n_trials=7, n_jobs=4)
    assert [(len(jobs), first) for jobs, first in launcher.launches] == [(2, 5)]


def test_a_grid_search_ends_when_its_grid_is_done(tmp_path: Path) -> None:
    # GridSampler asks the study to stop after the last point, which Optuna refuses outside
    # study.optimize(); the search ends there with every point tried once (one at a time: trials
    # asked together may draw the same point).
    space = parse_search_space({"model.optimizer.lr": "choice(0.01, 0.1, 1.0)"}, ["name=s"])
    grid = {"model.optimizer.lr": [0.01, 0.1, 1.0]}
    study = open_study(tmp_path, "s", "maximize", space, lambda _: GridSampler(grid, seed=0))
    launcher = FakeLauncher()
    Search(study, space, launcher, tmp_path, "v").run(n_trials=10, n_jobs=1)
    assert sorted(t.params["model.optimizer.lr"] for t in study.trials) == [0.01, 0.1, 1.0]
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    assert yaml.safe_load((tmp_path / BEST_FILE).read_text())["value"] == 1.0


def test_a_search_whose_trials_all_failed_fails(tmp_path: Path) -> None:
    space = parse_search_space(SPACE, [])
    search = Search(study_in(tmp_path, space), space, FakeLauncher(fail=[0, 1]), tmp_path, "v")
    with pytest.raises(ConfigError, match="no trial of study s finished"):
        search.run(n_trials=2, n_jobs=1)
    assert yaml.safe_load((tmp_path / BEST_FILE).read_text())["trials"]["fail"] == 2


def test_a_trial_the_job_pruned_stays_pruned(tmp_path: Path) -> None:
    space = parse_search_space(SPACE, [])
    study = study_in(tmp_path, space)

    def prunes_its_trial(jobs: list[list[str]], first: int) -> list[JobReturn]:
        study.tell(first, state=TrialState.PRUNED)  # what TrialPruning does in the job
        return [JobReturn(status=JobStatus.COMPLETED, _return_value=0.5)]

    Search(study, space, prunes_its_trial, tmp_path, "v").run(n_trials=1, n_jobs=1)
    assert study.trials[0].state == TrialState.PRUNED


def test_a_study_is_continued_only_with_its_own_space_and_direction(tmp_path: Path) -> None:
    space = parse_search_space(SPACE, [])
    study_in(tmp_path, space)
    other = parse_search_space({"model.optimizer.lr": "interval(0.1, 0.2)"}, [])
    with pytest.raises(ConfigError, match="search space of study s"):
        study_in(tmp_path, other)
    with pytest.raises(ConfigError, match="made to maximize"):
        open_study(tmp_path, "s", "minimize", space, lambda n: RandomSampler())
