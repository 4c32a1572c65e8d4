"""`python -m volt.eval ckpt_path=...`: rebuild a run from its checkpoint (a file, or a sharded
checkpoint's folder) and test or predict (volt.evaluation)."""

from pathlib import Path

from hydra.errors import InstantiationException
from omegaconf import DictConfig

from volt.config.composition import hydra_main
from volt.config.run_dirs import remove_run_dir_made_here
from volt.console import exit_on_config_error, exit_on_unexpected_error
from volt.data.downloads import DataNotFoundError
from volt.errors import ConfigError


@hydra_main(config_name="eval", on_config_error=exit_on_config_error)
def main(cfg: DictConfig) -> None:
    # Imported once the config composed: torch and Lightning take seconds to import, which a
    # composition error, --cfg and --help do not wait for.
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    from volt.evaluation import evaluate
    from volt.runs.stop_signals import stop_on_signals

    try:
        # SIGTERM and Ctrl+C stop it at once with one line: Lightning's own handler only sets a
        # flag that test and predict never read (a checkpoint's endless generation ran on).
        with stop_on_signals(None, named=False) as stopper:
            stopper.at("evaluating")
            evaluate(cfg)
    except Exception as error:
        user_caused = (
            ConfigError,
            DataNotFoundError,
            InstantiationException,
            MisconfigurationException,
        )
        if not isinstance(error, user_caused):
            exit_on_unexpected_error(error)  # its traceback and line, without Hydra's hint
        # Refused before it evaluated: the run directory Hydra made holds nothing to keep.
        remove_run_dir_made_here(Path(cfg.paths.output_dir))
        exit_on_config_error(error)


if __name__ == "__main__":
    main()
