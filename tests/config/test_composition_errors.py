"""An override Hydra cannot compose ends as volt's one line, exit 2, before anything is written:
the real `python train.py ...` for each kind of composition error, and the check itself for the
finer cases and for command lines it must let through."""

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra

from volt.config import PROJECT_ROOT
from volt.config.composition import check_command_line
from volt.errors import ConfigError


@dataclass(frozen=True)
class Case:
    command: list[str]  # after `python`
    line: str  # the whole of volt's line after "volt: config error: ", or its start (with "...")


TRAIN = ["train.py"]
CASES = {
    "unknown key": Case(
        [*TRAIN, "trainer.max_epoch=3"],
        "trainer.max_epoch=3: trainer has no key 'max_epoch'; did you mean trainer.max_epochs=3"
        " or trainer.min_epochs=3 or trainer.max_steps=3? (to add a key that conf/ does not set:"
        " +trainer.max_epoch=3)",
    ),
    "unknown option": Case(
        [*TRAIN, "model=nonexistent"],
        "model=nonexistent: config group model has no option 'nonexistent'; options: cnn, gpt,"
        " mlp, resnet",
    ),
    "unknown group": Case(
        [*TRAIN, "modle=mlp"],
        "modle=mlp: the train config has no key or config group 'modle'; did you mean model=mlp?",
    ),
    "added twice": Case(
        [*TRAIN, "+trainer.max_epochs=3"],
        "+trainer.max_epochs=3: trainer.max_epochs is set already; write trainer.max_epochs=3 to"
        " change it",
    ),
    "removed but absent": Case(
        [*TRAIN, "~trainer.max_epoch"],
        "~trainer.max_epoch: trainer has no key 'max_epoch'; did you mean ~trainer.max_epochs or"
        " ~trainer.min_epochs or ~trainer.max_steps?",
    ),
    "unreadable": Case(
        [*TRAIN, "trainer.max_epochs=["],
        "trainer.max_epochs=[: Hydra cannot read this override (no viable alternative at input"
        " '['); write key=value, a list as key=[a,b], ...",
    ),
    # volt's conf/ is plain YAML, typed later by volt's own checks (`trainer.max_epochs=abc`);
    # Hydra's own settings are typed, and refused while composing.
    "wrong type": Case(
        [*TRAIN, "hydra.job.chdir=maybe"],
        "hydra.job.chdir=maybe: Value 'maybe' is not a valid bool (type str)",
    ),
    "multirun": Case(
        [*TRAIN, "-m", "trainer.max_epoch=3,4"],
        "trainer.max_epoch=3,4: trainer has no key 'max_epoch'; did you mean trainer.max_epochs=3,4"
        " or ...",
    ),
    # Hydra composes the second job only after it made the sweep directory.
    "multirun, a later job": Case(
        [*TRAIN, "-m", "model=mlp,nonexistent"],
        "model=mlp,nonexistent: config group model has no option 'nonexistent'; options: cnn,"
        " gpt, mlp, resnet",
    ),
    "eval": Case(
        ["-m", "volt.eval", "ckpt_path=missing.ckpt", "trainer.max_epoch=3"],
        "trainer.max_epoch=3: trainer has no key 'max_epoch'; did you mean trainer.max_epochs=3"
        " or ...",
    ),
}


def run(case: Case, outputs: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *case.command, f"paths.outputs_dir={outputs}"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.fixture(scope="module")
def results(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, tuple[Future[subprocess.CompletedProcess[str]], Path]]]:
    """Every command started at once: each costs an interpreter's start-up (torch, Lightning),
    not the check, so two at a time they take half the time."""
    root = tmp_path_factory.mktemp("composition")
    # Each child gets its own copy of the environment. Without `env`, CPython (3.11.7 seen) execs
    # the vfork child with the process's shared `environ`, which pytest's main thread rewrites
    # (PYTEST_CURRENT_TEST) at every test phase: the exec then read a freed block and failed with
    # "OSError: [Errno 14] Bad address" (CI, stop 47).
    env = dict(os.environ)
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {
            name: (pool.submit(run, case, root / f"outputs{i}", env), root / f"outputs{i}")
            for i, (name, case) in enumerate(CASES.items())
        }


@pytest.mark.parametrize("name", CASES)
def test_one_line_exit_2_nothing_written(
    name: str, results: dict[str, tuple[Future[subprocess.CompletedProcess[str]], Path]]
) -> None:
    future, outputs = results[name]
    result = future.result()
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    line = result.stderr.strip().removeprefix("volt: config error: ")
    expected = CASES[name].line
    if expected.endswith("..."):
        assert line.startswith(expected.removesuffix("...")), line
    else:
        assert line == expected
    assert not outputs.exists()


@pytest.fixture
def check() -> Iterator[None]:
    GlobalHydra.instance().clear()
    yield
    GlobalHydra.instance().clear()


@pytest.mark.usefixtures("check")
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["model=mpl"],
            "model=mpl: config group model has no option 'mpl'; did you mean model=mlp?",
        ),
        (["experimnt=digits_cnn"], "; did you mean experiment=digits_cnn?"),
        (["-m", "data=digits,mnsit"], "data=digits,mnsit: config group data has no option 'mnsit'"),
        (["+experiment=digits_cnn"], "chooses experiment already (experiment: null); write exp"),
        (["trainer.fo.bar=1"], "trainer.fo.bar=1: trainer has no key 'fo'; known: _target_, acc"),
        (
            ["hydra.jb.chdir=true"],
            "hydra.jb.chdir=true: hydra has no key 'jb'; did you mean hydra.job",
        ),
        (["-m", "hydra.job.chdir=true,false"], "Hydra's own settings cannot be swept"),
        # The key as typed is kept whole, so the fix can be pasted: here a range sweep.
        (["-m", "sed=range(1,3)"], "did you mean seed=range(1,3)?"),
        (["seed=range(1,3)"], "seed=range(1,3): several values make a sweep, which runs only with"),
        (
            ["trainer.max_epochs=3,4"],
            "trainer.max_epochs=3,4: several values make a sweep, which runs only with -m"
            " (--multirun); as one value, a list is trainer.max_epochs=[3,4], a string is quoted:"
            " 'trainer.max_epochs=\"3,4\"'",
        ),
    ],
)
def test_the_line_names_the_override_and_the_fix(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        check_command_line("train", argv)
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.usefixtures("check")
@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["model=cnn", "trainer.max_epochs=1", "+trainer.gradient_clip_algorithm=norm"],
        ["~callbacks.progress_bar", "++trainer.max_epochs=2", "experiment=digits_cnn"],
        ["-m", "model=mlp,cnn", "model.optimizer.lr=1e-3,1e-2", "seed=range(0,50)"],
        ["-m", "data=glob(d*)"],
        # The search's config sets hydra.mode: Hydra sweeps without -m.
        ["hparams_search=digits_optuna", "seed=1,2"],
        ["hparams_search=digits_optuna", "model.optimizer.lr=tag(log, interval(1e-4, 1e-1))"],
        ["--help"],
    ],
)
def test_command_lines_that_compose_pass(argv: list[str]) -> None:
    check_command_line("train", argv)
