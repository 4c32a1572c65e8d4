"""An Optuna search run as a Hydra sweep: trials asked in batches of `n_jobs`, each batch handed to
Hydra's launcher at once (a parallel launcher runs them side by side), each job's return value
(the watched metric's best) told back as the trial's value.

The study lives in the sweep directory (`optuna.journal`, see `volt.sweeps.pruning.open_journal`),
so the same command with the same `name=` continues it: finished trials are kept, trials that
were running when the sweep was killed are run again with their own number and parameters (in
their own job directory, so a named sweep resumes them from their last checkpoint), and new
trials are asked until the study holds `n_trials`. Job number = trial number.

After every batch the best trial so far is written to `best.yaml` in the sweep directory.
"""

import logging
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import optuna
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import (
    ChoiceSweep,
    IntervalSweep,
    Override,
    RangeSweep,
)
from hydra.core.utils import JobReturn, JobStatus
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
    distribution_to_json,
)
from optuna.trial import FrozenTrial, TrialState

from volt.errors import ConfigError
from volt.folder_files import write_replacing
from volt.sweeps.pruning import TRIAL_VARIABLE, open_journal

log = logging.getLogger("volt")

BEST_FILE = "best.yaml"
MAX_DIR_NAME = 200  # bytes; file systems allow 255
# Hands a batch of jobs to the launcher: (overrides of each job, number of the first job).
Launch = Callable[[list[list[str]], int], Sequence[JobReturn]]


@dataclass(frozen=True)
class SearchSpace:
    distributions: dict[str, BaseDistribution]  # what the sampler picks, in a fixed order
    fixed: list[str]  # overrides every trial gets as given (the command line's plain ones)

    def overrides(self, params: Mapping[str, Any]) -> list[str]:
        """A trial's job overrides: the fixed ones, then `key=value` for each parameter."""
        return [*self.fixed, *(f"{k}={_override_value(params[k])}" for k in self.distributions)]


def _override_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def job_dir_name(number: int, params: Mapping[str, Any]) -> str:
    """`3_model.optimizer.lr=0.0007803,data.batch_size=64`: a trial's job directory. Hydra's
    default name holds every override in full (a float's 17 digits), past the 255 bytes a file
    name may have with a few parameters; the exact values are in the job's .hydra/overrides.yaml."""
    shown = ",".join(f"{k}={f'{v:.4g}' if isinstance(v, float) else v}" for k, v in params.items())
    return re.sub(r"[^\w.,=+-]", "_", f"{number}_{shown}")[:MAX_DIR_NAME]


def parse_search_space(params: Mapping[str, str], arguments: Sequence[str]) -> SearchSpace:
    """`hydra.sweeper.params` and the command line's overrides: a sweep value (`interval(a, b)`,
    `choice(...)`, `a,b,c`, `range(...)`, with `tag(log, ...)` / `tag(int, ...)`) is a parameter
    to search; a plain value is passed to every trial."""
    lines = [f"{key}={value}" for key, value in params.items()] + list(arguments)
    distributions: dict[str, BaseDistribution] = {}
    fixed = []
    for override in OverridesParser.create().parse_overrides(lines):
        key = override.get_key_element()
        if override.is_sweep_override():
            distributions[key] = _distribution(override)
        else:
            fixed.append(f"{key}={override.get_value_element_as_str()}")
    if not distributions:
        raise ConfigError(
            "hydra/sweeper=volt_optuna has nothing to search: give hydra.sweeper.params (e.g."
            " model.optimizer.lr: interval(1e-4, 1e-2)) or a sweep on the command line"
        )
    return SearchSpace(distributions, fixed)


def _distribution(override: Override) -> BaseDistribution:
    sweep = override.value()
    key = override.get_key_element()
    values: list[Any] = list(override.sweep_iterator()) if override.is_discrete_sweep() else []
    if isinstance(sweep, ChoiceSweep):
        if not all(v is None or isinstance(v, bool | int | float | str) for v in values):
            raise ConfigError(
                f"{key}={override.get_value_element_as_str()}: Optuna's choices are plain values"
                " (numbers, strings, bools, null); pick a config group option by name instead"
            )
        return CategoricalDistribution(values)
    if isinstance(sweep, RangeSweep):
        step = sweep.step if sweep.step is not None else 1
        if all(isinstance(v, int) for v in values):
            return IntDistribution(values[0], values[-1], step=int(step))
        return FloatDistribution(float(values[0]), float(values[-1]), step=float(step))
    if isinstance(sweep, IntervalSweep) and sweep.start is not None and sweep.end is not None:
        log_scale = "log" in sweep.tags
        if "int" in sweep.tags:
            return IntDistribution(int(sweep.start), int(sweep.end), log=log_scale)
        return FloatDistribution(sweep.start, sweep.end, log=log_scale)
    raise ConfigError(
        f"{key}={override.get_value_element_as_str()}: the search takes interval(), choice(),"
        " range() or a,b,c; write the values out instead"
    )


def open_study(
    sweep_dir: Path,
    study_name: str,
    direction: Literal["minimize", "maximize"],
    space: SearchSpace,
    sampler_for: Callable[[int], optuna.samplers.BaseSampler],
) -> optuna.Study:
    """The sweep's study, made or continued. `sampler_for(trials so far)`: a sampler seeded anew
    per continuation, so a continued search does not draw its first trials' parameters again."""
    study = optuna.create_study(
        storage=open_journal(sweep_dir),
        study_name=study_name,
        direction=direction,
        load_if_exists=True,
    )
    study.sampler = sampler_for(len(study.trials))
    if study.direction.name.lower() != direction:
        raise ConfigError(
            f"hydra.sweeper.direction={direction}, but study {study_name} in {sweep_dir} was"
            f" made to {study.direction.name.lower()}: keep the direction, or give a new name="
        )
    stored = study.user_attrs.get("search_space")
    given = {k: distribution_to_json(d) for k, d in space.distributions.items()}
    if stored is not None and stored != given:
        raise ConfigError(
            f"the search space of study {study_name} in {sweep_dir} was {sorted(stored)}, now"
            f" {sorted(given)} (or other ranges): continue it with the same params, or give a"
            " new name="
        )
    study.set_user_attr("search_space", given)
    return study


def _contiguous(trials: Sequence[FrozenTrial], size: int) -> Iterator[list[FrozenTrial]]:
    """Batches of at most `size` trials whose numbers follow one another: a launcher numbers the
    jobs of a batch from its first."""
    batch: list[FrozenTrial] = []
    for trial in sorted(trials, key=lambda t: t.number):
        if batch and (len(batch) == size or trial.number != batch[-1].number + 1):
            yield batch
            batch = []
        batch.append(trial)
    if batch:
        yield batch


class Search:
    def __init__(
        self,
        study: optuna.Study,
        space: SearchSpace,
        launch: Launch,
        sweep_dir: Path,
        objective: str,
    ) -> None:
        self.study = study
        self.space = space
        self.launch = launch
        self.sweep_dir = sweep_dir
        self.objective = objective  # the metric a trial's value is, for best.yaml
        self.stopped = False  # the sampler asked the study to stop (GridSampler: grid done)
        study.set_user_attr("objective", objective)  # for search.png's axis

    def run(self, n_trials: int, n_jobs: int) -> list[Sequence[JobReturn]]:
        """Redo the trials a killed sweep left running, then ask new ones, `n_jobs` at a time,
        until the study holds `n_trials`."""
        returns = []
        interrupted = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if interrupted:
            log.info(
                "continuing study %s: %d trials kept, %d interrupted ones run again (%s)",
                self.study.study_name,
                len(self.study.trials) - len(interrupted),
                len(interrupted),
                ", ".join(str(t.number) for t in interrupted),
            )
        for batch in _contiguous(interrupted, n_jobs):
            returns.append(self._run_batch(batch))
        while not self.stopped and (left := n_trials - len(self.study.trials)) > 0:
            asked = [self.study.ask(self.space.distributions) for _ in range(min(n_jobs, left))]
            frozen = self.study.get_trials(deepcopy=False)
            returns.append(self._run_batch([frozen[t.number] for t in asked]))
        self.write_best()
        states = {t.state for t in self.study.get_trials(deepcopy=False)}
        if TrialState.COMPLETE not in states and TrialState.PRUNED not in states:
            # Every trial failed: a mistake in the command, not a bad region of the space.
            raise ConfigError(
                f"no trial of study {self.study.study_name} finished: each job's error is in"
                f" its metrics.json and train.log under {self.sweep_dir}"
            )
        return returns

    def _run_batch(self, trials: list[FrozenTrial]) -> Sequence[JobReturn]:
        jobs = [
            [
                *self.space.overrides(t.params),
                # Set in conf/hydra/default.yaml, so a plain override: Hydra's launcher leaves
                # hydra.* out of the jobs it lists, where ++hydra... showed.
                f"hydra.job.env_set.{TRIAL_VARIABLE}={t.number}",
                f"hydra.sweep.subdir='{job_dir_name(t.number, t.params)}'",
            ]
            for t in trials
        ]
        results = self.launch(jobs, trials[0].number)
        for trial, result in zip(trials, results, strict=True):
            self._tell(trial, result)
        self.write_best()
        return results

    def _tell(self, trial: FrozenTrial, result: JobReturn) -> None:
        """The job's value, or FAIL; a trial the job itself pruned stays pruned."""
        if result.status == JobStatus.FAILED:  # its return_value would raise the job's error
            self._told(trial.number, None, TrialState.FAIL)
            return
        value = result.return_value
        if value is None or not math.isfinite(float(value)):
            log.warning("trial %d returned %r: counted as failed", trial.number, value)
            self._told(trial.number, None, TrialState.FAIL)
        else:
            self._told(trial.number, float(value), None)

    def _told(self, number: int, value: float | None, state: TrialState | None) -> None:
        try:
            self.study.tell(number, value, state=state, skip_if_finished=True)
        except RuntimeError as error:
            # GridSampler calls study.stop() once every point of its grid has a trial, which
            # Optuna (5.0.0) refuses outside study.optimize(); the trial's result is stored
            # before that (in a `finally`). End the search here, as optimize() would.
            if "Study.stop" not in str(error):
                raise
            log.info("the sampler stopped study %s after trial %d", self.study.study_name, number)
            self.stopped = True

    def write_best(self) -> None:
        """best.yaml: the best trial so far (its parameters as overrides too) and how many trials
        ended how; replaced whole, so a reader never sees half of one."""
        trials = self.study.get_trials(deepcopy=False)
        record: dict[str, Any] = {
            "study": self.study.study_name,
            "objective": self.objective,
            "direction": self.study.direction.name.lower(),
            "trials": {s.name.lower(): sum(t.state == s for t in trials) for s in TrialState},
        }
        completed = [t for t in trials if t.state == TrialState.COMPLETE]
        if completed:
            best = self.study.best_trial
            record.update(
                trial=best.number,
                value=best.value,
                params=best.params,
                overrides=self.space.overrides(best.params)[len(self.space.fixed) :],
            )
        path = self.sweep_dir / BEST_FILE
        write_replacing(path, self.sweep_dir, yaml.safe_dump(record, sort_keys=False))
