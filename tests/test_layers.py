"""Imports run one way: entry points -> build -> rooms -> leaves (README "Layout").

Read from the source with `ast`, so an import inside a function counts as much as one at the top.
A room may use another room only through that room's public face (the package itself,
`from volt.checkpointing import ...`), never its internals (`volt.checkpointing.atomic_io`).
"""

import ast
from pathlib import Path

import pytest

import volt

PACKAGE = Path(volt.__file__).parent
ENTRY = {"train", "eval", "env", "rank", "hydra_callbacks"}
LEAVES = {"errors", "collectives"}
# Under every room and over the leaves: the one way to open a run folder's files, and the names a
# module logs a watched metric under.
SHARED = {"folder_files", "metric_names"}
ROOMS = {
    "config",
    "data",
    "models",
    "nets",
    "callbacks",
    "strategies",
    "checkpointing",
    "runs",
    "sweeps",
    "loggers",
    "console",
    "gpu",
    "tuning",
    "device_report",
    "hook_dispatch",
}
# training (what a run does: prepare, fit, test) and evaluation (eval's run: rebuild, test or
# predict) sit on rebuild (a trained run from its checkpoint), which sits on build (configs ->
# objects).
LAYER = {**dict.fromkeys(ENTRY, 0), "training": 1, "evaluation": 1, "rebuild": 1.5, "build": 2}
LAYER.update(dict.fromkeys(ROOMS, 3))
LAYER.update(dict.fromkeys(SHARED, 3.5))
LAYER.update(dict.fromkeys(LEAVES, 4))


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py"))


def top(path: Path) -> str:
    """The first name under volt/: `callbacks` for volt/callbacks/finite_guard.py."""
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def volt_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return [n for n in names if n == "volt" or n.startswith("volt.")]


def test_every_module_has_a_layer() -> None:
    unplaced = {top(p) for p in modules()} - set(LAYER) - {"__init__"}
    assert not unplaced, f"add {unplaced} to a layer in this test and to the README's Layout"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_run_one_way(path: Path) -> None:
    home = top(path)
    if home == "__init__":
        return
    for name in volt_imports(path):
        parts = name.split(".")
        if len(parts) == 1:
            pytest.fail(f"{path.name}: `import volt` names no layer")
        target = parts[1]
        if target == home:
            continue
        if target in ROOMS and home in ROOMS:
            assert len(parts) == 2, (
                f"{path}: imports {name}, an internal of the {target} room; use its public "
                f"face `from volt.{target} import ...`"
            )
        else:
            assert LAYER[target] > LAYER[home], (
                f"{path}: imports {name}: {target} is not below {home}"
            )
