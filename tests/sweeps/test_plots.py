"""search.png's axes: the labels of a learning rate's log axis stay apart and say their values."""

import itertools

import pytest

from volt.sweeps.plots import label_log_axis


def shown_labels(axis: object) -> list[object]:
    ticks = [*axis.xaxis.get_major_ticks(), *axis.xaxis.get_minor_ticks()]  # type: ignore[attr-defined]
    low, high = axis.get_xlim()  # type: ignore[attr-defined]
    return [
        t.label1
        for t in ticks
        if t.label1.get_visible() and t.label1.get_text() and low <= t.get_loc() <= high
    ]


# The last two: a few trials close together (two of them, 2026-11-28, labelled `4e-04`, `4e-04`,
# `5e-04`, `6e-04`, `6e-04`, `6e-04`).
@pytest.mark.parametrize(
    ("low", "high"),
    [(1e-4, 3e-2), (3e-4, 2e-3), (1e-5, 1e-1), (3.75e-4, 6.57e-4), (1e-3, 1.2e-3)],
)
def test_log_axis_labels_do_not_overlap(low: float, high: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(4, 3.5))  # one panel of search.png
    axis.scatter([low, (low * high) ** 0.5, high], [0.9, 0.95, 0.93])
    label_log_axis(axis)
    figure.tight_layout()
    figure.canvas.draw()
    labels = shown_labels(axis)
    assert len(labels) >= 2, [t.get_text() for t in labels]
    for tick in axis.xaxis.get_major_ticks():  # each label says its tick's value
        if tick.label1 in labels:
            assert float(tick.label1.get_text()) == pytest.approx(tick.get_loc())
    boxes = [t.get_window_extent() for t in labels]
    overlapping = [
        (a.get_text(), b.get_text())
        for (a, box_a), (b, box_b) in itertools.combinations(zip(labels, boxes, strict=True), 2)
        if box_a.overlaps(box_b)
    ]
    plt.close(figure)
    assert not overlapping
