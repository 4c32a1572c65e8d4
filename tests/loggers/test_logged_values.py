"""volt.loggers.logged_values: `self.log` moves a record only when something in it is elsewhere.
The meta device stands in for a second device on the CPU."""

from typing import Any

import pytest
import torch
from lightning.pytorch.trainer.connectors.logger_connector.result import (
    _ResultCollection,
    _ResultMetric,
)
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.aggregation import CatMetric
from torchmetrics.classification import MulticlassAccuracy

from volt.loggers import logged_values
from volt.loggers.logged_values import _all_on, skip_needless_moves

CPU = torch.device("cpu")
# The kinds of record a module makes: a step's value, an epoch mean (with its batch sizes), a
# maximum, and a torchmetrics metric logged as itself.
KINDS = {
    "step": {"on_step": True, "on_epoch": False},
    "epoch mean": {"on_step": False, "on_epoch": True},
    "step and epoch max": {"on_step": True, "on_epoch": True, "reduce_fx": "max"},
}


def records() -> dict[str, _ResultMetric]:
    results = _ResultCollection(training=True)
    for name, how in KINDS.items():
        for _ in range(2):  # the second call accumulates, as the next step's
            results.log("training_step", name, torch.tensor(0.5), batch_size=4, **how)
    accuracy = MulticlassAccuracy(num_classes=3)
    accuracy.update(torch.tensor([[0.1, 0.8, 0.1]]), torch.tensor([1]))
    results.log("training_step", "metric", accuracy, on_step=False, on_epoch=True)
    return {name: results[f"training_step.{name}"] for name in [*KINDS, "metric"]}


def lightnings_movables(record: _ResultMetric) -> int:
    """How many tensors and metrics Lightning's own `to` would move in `record`."""
    return len(lightnings_held(record))


def one_elsewhere(record: _ResultMetric, which: int) -> None:
    """Puts the `which`-th tensor or metric Lightning's walk meets on the meta device, in place."""
    met = iter(range(lightnings_movables(record)))

    def move_one(held: Tensor | Metric) -> Tensor | Metric:
        return held.to("meta") if next(met) == which else held

    record.__dict__.update(apply_to_collection(dict(record.__dict__), (Tensor, Metric), move_one))


@pytest.mark.parametrize("kind", [*KINDS, "metric"])
def test_the_short_cut_is_taken_only_when_nothing_lightning_moves_is_elsewhere(kind: str) -> None:
    assert _all_on(records()[kind], CPU)
    count = lightnings_movables(records()[kind])
    assert count >= (1 if kind == "metric" else 3)  # value, its default, ...
    for which in range(count):
        record = records()[kind]
        one_elsewhere(record, which)
        assert not _all_on(record, CPU), f"{kind}: held thing {which} on meta was not seen"


def test_a_logged_metric_is_judged_by_each_of_its_states() -> None:
    """A metric's `device` is only where it was last moved: a state elsewhere, states kept on
    the CPU by `compute_on_cpu` (which Lightning's move brought back at every call) and list
    states take Lightning's path."""
    record = records()["metric"]
    assert _all_on(record, CPU)
    record.value.tp = record.value.tp.to("meta")  # one state moved behind the metric's back
    assert record.value.device == CPU and not _all_on(record, CPU)
    for metric in (CatMetric(compute_on_cpu=True), CatMetric()):  # lists of tensors
        metric.update(torch.tensor([1.0]))
        results = _ResultCollection(training=True)
        results.log("training_step", "cat", metric, on_step=False, on_epoch=True)
        assert not _all_on(results["training_step.cat"], CPU)


def test_a_record_is_moved_once_not_at_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    moves: list[tuple[Any, ...]] = []
    lightnings_to = logged_values._lightnings_to

    def counted(record: _ResultMetric, *args: Any, **kwargs: Any) -> _ResultMetric:
        moves.append(args)
        return lightnings_to(record, *args, **kwargs)

    monkeypatch.setattr(logged_values, "_lightnings_to", counted)
    monkeypatch.setattr(_ResultMetric, "to", _ResultMetric.to)  # put back after the test
    skip_needless_moves()
    results = _ResultCollection(training=True)
    for step in range(100):
        results.log(
            "training_step", "loss", torch.tensor(float(step)), on_epoch=False, on_step=True
        )
        results.log("training_step", "acc", torch.tensor(1.0), on_epoch=True, batch_size=4)
    assert moves == []  # made on the CPU, logged from it: nothing to move (Lightning: 200 walks)
    assert results["training_step.loss"].value.item() == 99.0
    assert results["training_step.acc"].compute().item() == 1.0
    # Values from another device move each whole record there once, as Lightning does.
    for _ in range(3):
        results.log(
            "training_step", "loss", torch.tensor(0.0, device="meta"), on_step=True, on_epoch=False
        )
        results.log("training_step", "acc", torch.tensor(0.0, device="meta"), on_epoch=True)
    assert len(moves) == 2
    for name in ("loss", "acc"):
        held = lightnings_held(results[f"training_step.{name}"])
        assert {each.device.type for each in held} == {"meta"}


def lightnings_held(record: _ResultMetric) -> list[Tensor | Metric]:
    found: list[Any] = []
    apply_to_collection(dict(record.__dict__), (Tensor, Metric), found.append)
    return found
