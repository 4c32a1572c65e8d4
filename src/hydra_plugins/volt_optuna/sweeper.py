"""The Hydra side of volt's Optuna search: settings in, a launcher out; `volt.sweeps.search` runs
the study. Optuna is imported only once a search starts (Hydra imports this module in every run)."""

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf


class VoltOptunaSweeper(Sweeper):
    def __init__(
        self,
        study_name: str,
        direction: str,
        n_trials: int,
        n_jobs: int,
        sampler: DictConfig | None,
        pruner: DictConfig | None,
        params: DictConfig,
    ) -> None:
        self.study_name = study_name
        self.direction = direction
        self.n_trials = n_trials
        self.n_jobs = n_jobs
        self.sampler = sampler
        self.params = {str(k): str(v) for k, v in params.items()}
        self.config: DictConfig | None = None
        self.launcher: Launcher | None = None
        self.hydra_context: HydraContext | None = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> list[Sequence[JobReturn]]:
        from volt.console import exit_on_config_error
        from volt.errors import ConfigError

        # One line and exit status 2, as volt's other refusals, not Hydra's report of an error
        # in a sweeper (a traceback and its HYDRA_FULL_ERROR hint).
        try:
            return self._search(arguments)
        except ConfigError as error:
            exit_on_config_error(error)

    def _search(self, arguments: list[str]) -> list[Sequence[JobReturn]]:
        from volt.errors import ConfigError
        from volt.sweeps.search import Search, open_study, parse_search_space

        assert self.config is not None and self.launcher is not None
        if self.direction not in ("minimize", "maximize"):
            raise ConfigError(
                f"hydra.sweeper.direction={self.direction!r}: use minimize or maximize (or leave"
                " it to task.mode)"
            )
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        space = parse_search_space(self.params, arguments)
        direction: Literal["minimize", "maximize"] = self.direction  # type: ignore[assignment]  # checked above
        study = open_study(sweep_dir, self.study_name, direction, space, self._sampler)
        watch = OmegaConf.select(self.config, "task.watch")
        search = Search(study, space, self._launch, sweep_dir, objective=f"{watch}_best")
        return search.run(self.n_trials, self.n_jobs)

    def _sampler(self, trials_so_far: int) -> Any:
        from volt.config.execution_whitelist import instantiate_whitelist

        given = self.sampler or {"_target_": "optuna.samplers.TPESampler"}
        config = OmegaConf.to_container(OmegaConf.create(given), resolve=True)
        assert isinstance(config, dict)
        if config.get("seed") is not None:
            config["seed"] += trials_so_far
        return instantiate(config, **instantiate_whitelist(["optuna.samplers"]))

    def _launch(self, jobs: list[list[str]], first_job: int) -> Sequence[JobReturn]:
        assert self.launcher is not None
        self.validate_batch_is_legal(jobs)
        return self.launcher.launch(jobs, initial_job_idx=first_job)
