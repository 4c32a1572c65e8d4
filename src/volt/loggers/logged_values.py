"""`self.log` without its per-call walk (Lightning-AI/pytorch-lightning#20388, open).

Lightning (2.0 to 2.6.6) keeps a record of each logged name, a torchmetrics `Metric`, and moves
it to the logged value's device at every `self.log` call (`_ResultCollection.log` calls
`_ResultMetric.to`). That `to` walks the record's whole `__dict__` through `apply_to_collection`:
its states and defaults, a dozen hook dictionaries, and its metadata dataclasses, which it
deep-copies, whether or not anything is elsewhere. On a 2-core CPU that is 170 of the 200 us a
call costs, for every logged name at every step, all of it host time the GPU waits behind in
a small model's step (issue #40).

`skip_needless_moves` makes `to(device)` return at once when every tensor and metric in the record
is on that device already: after the first call that is every call but one whose value came from
another device. Any other call takes Lightning's own path. Remove when volt requires a Lightning
with a fix (PR #21769 proposes the same short cut).
"""

from collections import OrderedDict
from inspect import Signature
from types import BuiltinFunctionType, FunctionType
from typing import Any

import torch
from lightning.pytorch.trainer.connectors.logger_connector.result import (
    _Metadata,
    _ResultMetric,
)
from torch import Tensor
from torchmetrics import Metric

_lightnings_to = _ResultMetric.to


def skip_needless_moves() -> None:
    """For the whole process, once: `self.log` skips the move of a record already in place."""
    _ResultMetric.to = _to_unless_there  # type: ignore[method-assign,assignment]


def _to_unless_there(record: _ResultMetric, *args: Any, **kwargs: Any) -> _ResultMetric:
    just_a_device = not kwargs and len(args) == 1 and isinstance(args[0], torch.device)
    if just_a_device and _all_on(record, args[0]):
        return record
    return _lightnings_to(record, *args, **kwargs)


def _all_on(record: _ResultMetric, device: torch.device) -> bool:
    """Every tensor and metric in the record is on `device`; False where unsure. A record holds
    them as attributes and in flat dictionaries (a metric's defaults), beside plain values; its
    metadata (`_Metadata`) holds names, flags and functions, so it is not looked into."""
    for value in record.__dict__.values():
        kind = type(value)
        if kind in _PLAIN or kind is _Metadata:
            continue
        if kind is dict or kind is OrderedDict:
            if not all(_on(inner, device) for inner in value.values()):
                return False
        elif not _on(value, device):
            return False
    return True


def _on(value: Any, device: torch.device) -> bool:
    if type(value) in _PLAIN:
        return True
    if isinstance(value, Tensor):
        return value.device == device
    return isinstance(value, Metric) and _metric_on(value, device)


def _metric_on(metric: Metric, device: torch.device) -> bool:
    """A metric logged as itself (`self.log("acc", self.acc)`): its `device` is only where it
    was last moved, so each state is looked at. Unsure, so False: states kept on the CPU
    (`compute_on_cpu`, which Lightning's move brought back at every call), list states (which grow
    with every update), and metrics holding other modules or buffers."""
    if metric.device != device or metric.compute_on_cpu:
        return False
    if metric._buffers or metric._parameters or metric._modules:
        return False
    states = [getattr(metric, name) for name in metric._defaults]
    return all(isinstance(state, Tensor) and state.device == device for state in states)


# The types of what a record holds beside its tensors that cannot hold one (matched exactly).
_PLAIN = frozenset(
    {
        bool,
        int,
        float,
        str,
        type(None),
        set,
        torch.device,
        torch.dtype,
        FunctionType,
        BuiltinFunctionType,
        Signature,
    }
)
