"""DDP whose extra ranks start from the run's resolved config (`volt.strategies.launcher`), with
the model wrapped on the stream that trains. (`sync_batchnorm=true` is volt's SyncBatchNorm:
`volt.build.apply_toggles` chooses it.)

The launcher is volt's because Lightning's re-runs the command line (see its module docstring);
`_setup_model` is overridden for a stream mismatch described where it happens.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.strategies import DDPStrategy as LightningDDPStrategy
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from volt.strategies.launcher import run_config_launcher


class DDPStrategy(LightningDDPStrategy):
    """Lightning's DDPStrategy, with ranks started from `rank_config` (see the module docstring).

    `rank_config` is the run's resolved config (`volt.training.train` writes it before building
    the Trainer). Other keyword arguments go to Lightning's DDPStrategy (e.g.
    `find_unused_parameters`).
    """

    def __init__(
        self, rank_config: str | Path, trusted_targets: Sequence[str] = (), **ddp_kwargs: Any
    ) -> None:
        super().__init__(start_method="popen", **ddp_kwargs)
        self.rank_config = Path(rank_config)
        # Rank 0's own allow-list, handed to the ranks on their command line: the list stored in
        # the run directory's file is data and may not widen itself (volt.config.targets).
        self.trusted_targets = list(trusted_targets)

    @override
    def _configure_launcher(self) -> None:
        # Lightning calls this once, when the Trainer has given the strategy its devices.
        self._launcher = run_config_launcher(self, "DDP", self.rank_config, self.trusted_targets)

    @override
    def _setup_model(self, model: nn.Module) -> DistributedDataParallel:
        # Lightning wraps the model on a side stream. DDP then keeps gradient-accumulation nodes
        # made on that stream while backward runs on the default one, so gradients wait across
        # streams every step (torch 2.11 warns: "The AccumulateGrad node's stream does not match
        # ..."; measured on 2 x H200: DDP slower than one GPU). Wrap it on the stream that trains.
        device_ids = self.determine_ddp_device_ids()
        return DistributedDataParallel(module=model, device_ids=device_ids, **self._ddp_kwargs)
