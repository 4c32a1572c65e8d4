"""volt.models.classifier.Accuracy: torchmetrics' micro accuracy, counted in place."""

import pytest
import torch
from torchmetrics.classification import MulticlassAccuracy

from volt.models.classifier import Accuracy


def test_accuracy_is_torchmetrics_micro_accuracy_over_uneven_batches() -> None:
    generator = torch.Generator().manual_seed(0)
    ours, theirs = Accuracy(), MulticlassAccuracy(7, average="micro")
    for size in (5, 64, 1, 33):
        logits = torch.randn(size, 7, generator=generator)
        target = torch.randint(0, 7, (size,), generator=generator)
        target[: size // 2] = logits[: size // 2].argmax(-1)  # some hits, whatever the draw
        ours.update(logits, target)
        theirs.update(logits, target)
    assert ours.seen.item() == 103
    assert 0.4 < ours.compute().item() < 1.0
    torch.testing.assert_close(ours.compute(), theirs.compute())


def test_accuracy_counts_only_what_it_saw_since_a_reset() -> None:
    accuracy = Accuracy()
    with pytest.warns(UserWarning, match="called before the ``update``"):  # torchmetrics' own
        assert accuracy.compute().item() == 0.0  # as MulticlassAccuracy: nothing seen is 0
    accuracy.update(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), torch.tensor([1, 1]))
    assert accuracy.compute().item() == 0.5
    accuracy.reset()
    accuracy.update(torch.tensor([[0.0, 1.0]]), torch.tensor([1]))
    assert accuracy.compute().item() == 1.0
