"""A search's trial, as its job sees it. Stopping it early: the job reports the watched metric to
the study after every validation, and ends as `pruned` when the study's pruner says so. Its value:
the watched metric as the module logs it (volt.metric_names), or the job fails (`unwatched`),
never a value of another metric, nor none.

The sweeper (`volt.sweeps.search`) names a job's trial in the job's environment
(`VOLT_OPTUNA_TRIAL`, through `hydra.job.env_set`); DDP ranks inherit it from rank 0. Only rank 0
opens the study (a journal file in the sweep directory); the verdict reaches the other ranks by a
broadcast, so every rank stops after the same validation.
"""

import logging
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from volt.errors import ConfigError
from volt.metric_names import find_watched

log = logging.getLogger("volt")

TRIAL_VARIABLE = "VOLT_OPTUNA_TRIAL"
JOURNAL_FILE = "optuna.journal"


def trial_in_environment() -> int | None:
    """The number of the search trial this process trains, or None outside a search."""
    number = os.environ.get(TRIAL_VARIABLE)
    return int(number) if number else None


def unwatched(watch: str, module: str, logged: Iterable[str]) -> ConfigError:
    """The error of a trial whose module does not log `watch`. Early stopping and the checkpoint
    may follow its validation loss instead (volt.callbacks.watched_metric); the study may not: it
    ranks every trial by one metric, in one direction."""
    names = ", ".join(sorted(logged)) or "nothing"
    return ConfigError(
        f"task.watch={watch!r} is what the search optimises, and {module} logs no such metric"
        f" (logged: {names}); set task.watch=<one of them> and task.mode=max|min"
    )


def open_journal(sweep_dir: Path) -> Any:
    """The Optuna storage of a sweep: an append-only journal file, not SQLite. Parallel jobs each
    write to the study (reports, verdicts) while the sweeper asks and tells; the journal takes a
    lock only for the moment of an append, where SQLite refuses a second writer with `database is
    locked`, and its lock (a symlink) also holds on NFS, where SQLite's fcntl locks may not."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(sweep_dir / JOURNAL_FILE)))


def default_pruner() -> Any:
    """The pruner of `hydra.sweeper.pruner: null`: a trial below the median of the finished ones
    at the same validation is stopped, once 5 trials have finished and from its third validation
    on (the first epochs say little about where a run ends)."""
    import optuna

    return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=2)


@dataclass(frozen=True)
class TrialLink:
    """Where rank 0 finds its trial: the sweep's journal, the study's name, the trial's number."""

    sweep_dir: Path
    study_name: str
    number: int


class TrialPruning(Callback):
    """Reports `watch` after each validation (step = the validation's index, counted across a
    resume) and stops the fit when `pruner` prunes the trial. `link` and `pruner` are rank 0's;
    the other ranks get None and only hear the verdict."""

    def __init__(self, watch: str, link: TrialLink | None, pruner: Any = None) -> None:
        self.watch = watch
        self.link = link
        self.pruner = pruner
        self.validations = 0  # kept in checkpoints: a resumed trial goes on from its last step
        self.pruned = False
        self._trial: Any = None  # rank 0's optuna.Trial, once set up
        self._reported: set[int] = set()

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit" or self.link is None or self._trial is not None:
            return
        import optuna

        storage = open_journal(self.link.sweep_dir)
        # RandomSampler: this study object only reports and prunes, and Trial() asks its sampler
        # about the search space, which TPE would work out from every trial so far.
        study = optuna.load_study(
            study_name=self.link.study_name,
            storage=storage,
            pruner=self.pruner,
            sampler=optuna.samplers.RandomSampler(),
        )
        study_id = storage.get_study_id_from_name(self.link.study_name)
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, self.link.number)
        self._trial = optuna.Trial(study, trial_id)
        # A trial redone after a kill has reported its first validations already.
        self._reported = set(storage.get_trial(trial_id).intermediate_values)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        step = self.validations
        self.validations += 1
        verdict = self._judge(trainer, step) if self._trial is not None else False
        if trainer.strategy.broadcast(verdict, src=0):
            self.pruned = True
            trainer.should_stop = True

    def _judge(self, trainer: pl.Trainer, step: int) -> bool:
        """Rank 0: report this validation's value and ask the pruner; True to stop here."""
        import optuna

        name = find_watched(trainer.callback_metrics, self.watch)
        if name is None:
            module = type(trainer.lightning_module).__name__
            raise unwatched(self.watch, module, trainer.callback_metrics)
        value = float(trainer.callback_metrics[name])
        if step not in self._reported and math.isfinite(value):
            self._trial.report(value, step)
            self._reported.add(step)
        if not self._trial.should_prune():
            return False
        # Told here, not by the sweeper: a sweep killed now still knows this trial is over.
        self._trial.study.tell(self._trial.number, state=optuna.trial.TrialState.PRUNED)
        log.info(
            "trial %d pruned after validation %d (%s=%.6g)",
            self._trial.number,
            step,
            self.watch,
            value,
        )
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"validations": self.validations}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.validations = state_dict["validations"]


def was_pruned(trainer: pl.Trainer) -> bool:
    callbacks = trainer.callbacks  # type: ignore[attr-defined]  # a property Lightning sets up
    return any(isinstance(c, TrialPruning) and c.pruned for c in callbacks)
