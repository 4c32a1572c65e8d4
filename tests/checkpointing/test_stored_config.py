"""Whether a module fits a checkpoint's weights, the one check resume and eval make before
anything loads them: names and shapes from the file's outline (a single file, a sharded folder,
an average's trained weights beside it), said in a few escaped names."""

from pathlib import Path

import pytest
import torch
from torch import nn

from volt.checkpointing import (
    begin_sharded_save,
    finish_sharded_save,
    read_weight_outline,
    weights_disagreement,
    write_sharded,
)
from volt.checkpointing.stored_config import NAME_CHARS

FORGED = (
    "\x1b[1A\x1b[2K\x1b[32mvolt: evaluation passed\n2026-11-28 01:00:00 INFO    volt: " + "x" * 500
)


def net(width: int = 3) -> nn.Module:
    return nn.Sequential(nn.Linear(4, width), nn.BatchNorm1d(width))


def test_what_does_not_fit_is_said_in_a_few_escaped_names() -> None:
    """A crafted file's thousand extra names, one a terminal escape and a forged log line of
    500 characters more: three shown, escaped and cut short, and how many more."""
    weights = dict(net().state_dict())
    weights |= {FORGED: torch.zeros(1)} | {f"extra.{i:04}": torch.zeros(1) for i in range(1000)}
    said = weights_disagreement(net(), weights)
    assert said.startswith("not in the model: ") and said.endswith(" and 998 more"), said
    assert said.isprintable() and ascii(FORGED)[: NAME_CHARS - 3] in said, said
    assert len(said) < 4 * NAME_CHARS
    # the control: torch's own refusal quotes every name as it is
    with pytest.raises(RuntimeError) as refused:
        net().load_state_dict(weights)
    assert FORGED in str(refused.value) and "extra.0999" in str(refused.value)


def test_missing_names_and_shapes_are_said_and_not_strict_leaves_names_alone() -> None:
    weights = dict(net(5).state_dict())
    del weights["0.bias"]
    weights["head"] = "not a tensor"  # type: ignore[assignment]  # what a crafted file may hold
    said = weights_disagreement(net(), weights)
    assert said == (
        "not in the file: 0.bias; not in the model: head; other shapes: 0.weight (5, 4) in the"
        " file, (3, 4) in the model, 1.bias (5,) in the file, (3,) in the model, 1.running_mean"
        " (5,) in the file, (3,) in the model and 2 more"
    )
    assert weights_disagreement(net(), weights, strict=False).startswith("other shapes: 0.weight")
    assert weights_disagreement(net(), net().state_dict()) == ""


def test_a_sharded_checkpoint_and_an_averages_trained_weights_are_outlined(
    tmp_path: Path,
) -> None:
    """Resume reads names and shapes without a weight: from a sharded folder's metadata, and,
    under ema=, from the trained weights (`current_model_state`) beside the average."""
    target = tmp_path / "sharded.ckpt"
    folder = begin_sharded_save(target)
    write_sharded({"state_dict": net().state_dict(), "global_step": 1}, folder, coordinator=True)
    finish_sharded_save(folder, target)
    (outline,) = read_weight_outline(target).values()
    assert weights_disagreement(net(), outline) == ""
    assert weights_disagreement(net(5), outline).startswith("other shapes: 0.bias (3,) in the")
    single = tmp_path / "ema.ckpt"
    torch.save({"state_dict": net().state_dict(), "current_model_state": {}}, single)
    outlines = read_weight_outline(single)
    assert outlines["state_dict"]["0.weight"].device.type == "meta"
    assert weights_disagreement(net(), outlines["state_dict"]) == ""
    assert weights_disagreement(net(), outlines["current_model_state"]).startswith(
        "not in the file: 0.bias, 0.weight, 1.bias and 4 more"
    )
