"""search.png: a search's objective against each parameter it searched, one panel per parameter,
read from the study in the sweep directory (finished trials as dots, pruned ones as grey crosses
at their last reported value)."""

import io
import math
from pathlib import Path
from typing import Any

from volt.folder_files import write_replacing
from volt.sweeps.pruning import JOURNAL_FILE, open_journal

PLOT_FILE = "search.png"


def plot_search(sweep_dir: Path) -> Path | None:
    """Draw search.png from the sweep's study; None when the sweep is not a search or no trial
    has a value yet."""
    if not (sweep_dir / JOURNAL_FILE).is_file():
        return None
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, and no GUI toolkit to import
    import matplotlib.pyplot as plt
    import optuna
    from optuna.distributions import CategoricalDistribution, json_to_distribution
    from optuna.trial import TrialState

    storage = open_journal(sweep_dir)
    (summary,) = storage.get_all_studies()
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    space = {k: json_to_distribution(v) for k, v in study.user_attrs["search_space"].items()}
    shown = (TrialState.COMPLETE, TrialState.PRUNED)
    trials = [t for t in study.get_trials(deepcopy=False, states=shown) if t.value is not None]
    if not trials or not space:
        return None
    objective = study.user_attrs.get("objective", "objective")
    figure, axes = plt.subplots(1, len(space), figsize=(4 * len(space), 3.5), squeeze=False)
    for axis, (name, distribution) in zip(axes[0], space.items(), strict=True):
        for state, style in ((TrialState.COMPLETE, "o"), (TrialState.PRUNED, "x")):
            chosen = [t for t in trials if t.state == state and name in t.params]
            if isinstance(distribution, CategoricalDistribution):
                xs = [distribution.choices.index(t.params[name]) for t in chosen]
            else:
                xs = [t.params[name] for t in chosen]
            color = "tab:blue" if state == TrialState.COMPLETE else "grey"
            label = state.name.lower()
            axis.scatter(xs, [t.value for t in chosen], marker=style, color=color, label=label)
        if isinstance(distribution, CategoricalDistribution):
            axis.set_xticks(range(len(distribution.choices)))
            axis.set_xticklabels([str(c) for c in distribution.choices])
        elif getattr(distribution, "log", False):
            label_log_axis(axis)
        axis.set_xlabel(name)
        axis.set_ylabel(objective)
        axis.grid(alpha=0.3)
    axes[0][0].legend(loc="best", fontsize="small")
    figure.suptitle(f"{study.study_name}: {len(trials)} trials ({study.direction.name.lower()})")
    figure.tight_layout()
    path = sweep_dir / PLOT_FILE
    image = io.BytesIO()
    figure.savefig(image, format="png", dpi=100)
    plt.close(figure)
    write_replacing(path, sweep_dir, image.getvalue())  # a link at search.png is not followed
    return path


def label_log_axis(axis: Any) -> None:
    """A log x axis labelled at each decade (at 1, 2 and 5 of it over a short range), as `2e-04`,
    slanted; matplotlib's default labels minor ticks too where the range spans less than about
    two decades (a learning rate's usual range), and those ran into each other. Over less than
    half a decade (a few trials close together) three evenly spaced values, as `1.1e-03`: whole
    decades left one label there, or labels of one digit showed `6e-04` thrice."""
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    axis.set_xscale("log")
    low, high = axis.get_xlim()
    decades = math.log10(high / low)
    subs = (1.0, 2.0, 5.0) if decades < 1.5 else (1.0,)  # as room allows
    locator = MaxNLocator(nbins=3) if decades < 0.5 else LogLocator(base=10, subs=subs)
    axis.xaxis.set_major_locator(locator)
    axis.xaxis.set_major_formatter(FuncFormatter(lambda value, _: _exponent_label(value)))
    axis.xaxis.set_minor_formatter(NullFormatter())
    axis.tick_params(axis="x", labelrotation=45)


def _exponent_label(value: float) -> str:
    """`value` as `4e-04` or `1.2e-03`: with the fewest decimals (up to 3) that show it whole."""
    labels = (f"{value:.{decimals}e}" for decimals in range(3))
    return next((s for s in labels if math.isclose(float(s), value, rel_tol=1e-6)), f"{value:.3e}")
