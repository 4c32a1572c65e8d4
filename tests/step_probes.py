"""Callbacks that tests add to a run with `+callbacks.<name>={_target_: tests.step_probes...}`
(and `trusted_targets=[tests]`) to see what training really ran, not what the config asked for:
the dtypes and memory formats inside the first training step, whether the forward was compiled.
Each writes JSON into the run directory, so in-process runs and subprocesses are read alike."""

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn
from torch._dynamo.utils import counters
from torch.utils.hooks import RemovableHandle

WEIGHTED = (nn.Linear, nn.Conv2d)


def _channels_last(tensor: Tensor) -> bool | None:
    if tensor.dim() != 4:
        return None
    return tensor.is_contiguous(memory_format=torch.channels_last)


class RecordFirstStep(Callback):
    """<run dir>/first_step.json: during the first training step, each Linear and Conv2d as it
    ran (its input's shape, its input's and output's dtype, whether autocast was on, whether its
    input and weight were channels_last), and the dtypes of the LightningModule's parameters.

    Forward hooks run inside the step, under whatever autocast context Lightning's precision
    plugin opened around it. Not for compiled modules: the hooks would be traced into the graph.
    """

    def __init__(self) -> None:
        self.layers: list[dict[str, Any]] = []
        self.handles: list[RemovableHandle] = []

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step != 0 or batch_idx != 0:
            return
        for name, module in pl_module.named_modules():
            if isinstance(module, WEIGHTED):
                self.handles.append(module.register_forward_hook(self._recorder(name)))

    def _recorder(self, name: str) -> Any:
        def record(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
            (x,) = inputs
            self.layers.append(
                {
                    "name": name,
                    "input_shape": list(x.shape),
                    "input_dtype": str(x.dtype),
                    "output_dtype": str(output.dtype),
                    "autocast": torch.is_autocast_enabled(x.device.type),
                    "input_channels_last": _channels_last(x),
                    "weight_channels_last": _channels_last(module.weight),
                }
            )

        return record

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any
    ) -> None:
        if not self.handles:
            return
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        record = {
            "layers": self.layers,
            "parameter_dtypes": sorted({str(p.dtype) for p in pl_module.parameters()}),
        }
        Path(trainer.default_root_dir, "first_step.json").write_text(json.dumps(record))


class RecordCompilation(Callback):
    """<run dir>/compilation.json at the end of training: the modules whose call torch.compile
    replaced, how many graphs TorchDynamo produced during the fit, and (on a GPU) whether
    Inductor's CUDA graph trees ran and how often they were skipped."""

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.graphs_before = counters["stats"]["unique_graphs"]

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        record = {
            "compiled_modules": [
                name
                for name, module in pl_module.named_modules()
                if getattr(module, "_compiled_call_impl", None) is not None
            ],
            "graphs": counters["stats"]["unique_graphs"] - self.graphs_before,
            "cuda_graph_trees": self._cuda_graph_trees(trainer),
            "cuda_graph_skips": counters["inductor"]["cudagraph_skips"],
        }
        Path(trainer.default_root_dir, "compilation.json").write_text(json.dumps(record))

    @staticmethod
    def _cuda_graph_trees(trainer: pl.Trainer) -> bool:
        device = trainer.strategy.root_device
        if device.type != "cuda":
            return False
        from torch._inductor.cudagraph_trees import get_manager

        return get_manager(device.index, create_if_none_exists=False) is not None


def read_record(run_dir: Path | str, name: str) -> dict[str, Any]:
    """The JSON a probe above wrote into `run_dir`."""
    return json.loads(Path(run_dir, f"{name}.json").read_text())
