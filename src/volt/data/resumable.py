"""What volt's data modules share: a global batch divided over the processes, and where training
stands in the data, which checkpoints keep so that a resumed run goes on from mid-epoch."""

from typing import Any

import lightning.pytorch as pl


class ResumableDataModule(pl.LightningDataModule):
    """A data module whose `batch_size` is global (each of N processes loads batch_size / N of
    it) and whose checkpointed state is the epoch and the batches done in it. A subclass takes
    the point to resume from once, with `take_resume_point()`, as it makes the training batches."""

    batch_size: int

    def __init__(self) -> None:
        super().__init__()
        self._resume_at: dict[str, int] | None = None

    @property
    def per_process_batch_size(self) -> int:
        processes = self.trainer.world_size if self.trainer is not None else 1
        if self.batch_size % processes:
            fixed = max(processes, self.batch_size // processes * processes)
            raise ValueError(
                f"data.batch_size={self.batch_size} does not divide over {processes} processes; "
                f"use a multiple of {processes}, e.g. data.batch_size={fixed}"
            )
        return self.batch_size // processes

    def state_dict(self) -> dict[str, Any]:
        """Where training stands in the data (saved in checkpoints): epoch and batches done."""
        if self.trainer is None:
            return {}
        # `processed` counts the batches whose step ran, the one being saved after included.
        progress = self.trainer.fit_loop.epoch_loop.batch_progress.current
        done = progress.processed  # type: ignore[attr-defined]  # a _ProcessedTracker at run time
        return {"epoch": self.trainer.current_epoch, "batches_done": done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume_at = state or None

    def take_resume_point(self) -> dict[str, int] | None:
        """The epoch and batches done that a checkpoint restored, once: None afterwards, or when
        nothing was restored."""
        at, self._resume_at = self._resume_at, None
        return at
