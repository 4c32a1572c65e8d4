"""What README.md and docs/*.md show keeps working.

- Every `python train.py ...` and `python -m volt.eval ...` command they show (in a code block or
  inline, also through torchrun, `make train ARGS=...` or the volt-* scripts) composes and passes
  volt's own checks, as `python train.py` does before it makes a run directory: on the CPU, for
  GPU, multi-GPU, SLURM and server commands too (only the check of this machine's devices is left
  out). A `$ command` followed by a `volt: ...` line must fail with exactly that line.
- Every other `python -m volt...` module they name exists; every `benchmarks/` script exists and
  takes the options shown.
- Every relative link resolves to a file, and every `#anchor` to a heading of that file.
- The tables the benchmarks generate sit between their markers in the page each benchmark writes.
"""

import ast
import importlib.util
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import initialize_config_dir
from hydra._internal.utils import get_args_parser
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from hydra.types import RunMode

from tests.in_process import RunHere
from volt.config import CONF_DIR, PROJECT_ROOT
from volt.config.composition import VERSION_BASE, check_command_line
from volt.config.keys import check_added_keys, check_target_arguments
from volt.config.redaction import refuse_literal_secrets
from volt.config.run_dirs import check_run_dir
from volt.config.validation import check_config
from volt.errors import ConfigError

PAGES = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]

# Commands that cannot compose as shown, and why. Keyed by the command as the page shows it.
CANNOT_COMPOSE = {
    "python train.py logger.<name>.api_key='${oc.env:API_KEY}'": (
        "a pattern: <name> stands for a logger of the user's whose class takes an api_key; none"
        " of volt's loggers takes one (MLflow and W&B read their keys from the environment)"
    ),
}
# Placeholders the pages write, and a value that stands in for each.
PLACEHOLDERS = {"<partition>": "gpu", "<option>": "digits", "<name>": "my-run", "<run>": "my-run"}
# The own-model example (`model=line data=line`): its files are tests/user_task.py and
# tests/user_task_conf/, where a user's own conf/ files would be; tests/ is a folder of this
# checkout but not a package, so it is trusted by name (as tests/test_contract.py does).
OWN_MODEL = [
    f"hydra.searchpath=[file://{PROJECT_ROOT / 'tests' / 'user_task_conf'}]",
    "trusted_targets=[tests]",
]
# Packages of optional extras; a command that needs one is skipped where it is not installed.
EXTRAS = {
    "mlflow": "mlflow",
    "wandb": "wandb",
    "optuna": "optuna",
    "hparams_search": "optuna",
    "submitit": "hydra_plugins.hydra_submitit_launcher",
}
# The markers each benchmark writes its table between.
BENCHMARKS_WITH_TABLES = ("perf.py", "ddp_scaling.py", "gpt_scaling.py")

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
INLINE = re.compile(r"`([^`]+)`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
COMMAND = re.compile(
    r"^(python (train\.py|-m volt\S*|benchmarks/\S+)|torchrun .*train\.py|make train ARGS=|"
    r"volt-(train|eval|env)|bash benchmarks/|benchmarks/\S+\.py)"
)


@dataclass(frozen=True)
class Shown:
    """A command as a page shows it; `error`: the line it must fail with, if any."""

    page: str
    line: int
    text: str
    error: str | None = None

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"[:120]


def without_comment(line: str) -> str:
    """The command without a trailing `# ...` comment, its spaces collapsed."""
    return " ".join(re.sub(r"\s#\s.*$", "", line).split())


def outside_fences(text: str) -> str:
    """The page with its fenced blocks blanked, line numbers kept."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def shown_commands(page: Path) -> Iterator[Shown]:
    text = page.read_text()
    name = str(page.relative_to(PROJECT_ROOT))
    for block in FENCE.finditer(text):
        first = text.count("\n", 0, block.start()) + 1
        lines = block.group(0).splitlines()[1:-1]
        joined: list[tuple[int, str]] = []  # lines continued with a backslash are one command
        for i, line in enumerate(lines):
            if joined and joined[-1][1].endswith("\\"):
                joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line.strip())
            else:
                joined.append((first + 1 + i, line.strip()))
        for k, (number, line) in enumerate(joined):
            prompt = line.startswith("$ ")
            command = without_comment(line.removeprefix("$ "))
            if COMMAND.match(command):
                after = joined[k + 1][1] if k + 1 < len(joined) else ""
                error = after if prompt and after.startswith("volt: ") else None
                yield Shown(name, number, command, error)
    prose = outside_fences(text)
    for span in INLINE.finditer(prose):
        command = " ".join(span.group(1).split())
        if COMMAND.match(command):
            yield Shown(name, prose.count("\n", 0, span.start()) + 1, command)


SHOWN = [shown for page in PAGES for shown in shown_commands(page)]


def argv_of(shown: Shown) -> tuple[str, list[str]] | None:
    """(config name, Hydra's argv) for a command that composes a config; None for the others."""
    words = [w for w in shlex.split(shown.text, comments=True) if w != "..."]
    if words[:2] == ["make", "train"]:
        return "train", shlex.split(words[2].removeprefix("ARGS="))
    if words[0] == "torchrun":
        return "train", words[words.index("train.py") + 1 :]
    if words[:2] == ["python", "train.py"] or words[0] == "volt-train":
        return "train", words[1 + (words[0] == "python") :]
    if words[:3] == ["python", "-m", "volt.eval"] or words[0] == "volt-eval":
        argv = words[3 if words[0] == "python" else 1 :]
        # Alone it names the entry point in prose ("`python -m volt.eval` rebuilds ..."): eval
        # has no run without a checkpoint, so it is checked as a module.
        return ("eval", argv) if argv else None
    return None


def with_stand_ins(config_name: str, argv: list[str], checkpoint: Path) -> list[str]:
    """Placeholders replaced; a checkpoint to evaluate is a stand-in file (reading one is
    volt.eval's own tests' business), also where `...` stands for it; the own-model example finds
    its config files."""
    given = config_name != "eval" or any(w.startswith("ckpt_path=") for w in argv)
    out = [] if given else [f"ckpt_path={checkpoint}"]
    for word in argv:
        for placeholder, value in PLACEHOLDERS.items():
            word = word.replace(placeholder, value)
        out.append(f"ckpt_path={checkpoint}" if word.startswith("ckpt_path=") else word)
    if "model=line" in out:
        out += OWN_MODEL
    return out


def check_before_start(config_name: str, argv: list[str]) -> None:
    """What `python train.py` / `python -m volt.eval` check before a run directory exists
    (volt.hydra_callbacks), but this machine's devices: compose each job's config, then check
    the run's config as Hydra hands it to volt."""
    args = get_args_parser().parse_args(argv)
    if args.multirun:  # every job's config (one per option of a config-group sweep)
        check_command_line(config_name, argv)
    mode = RunMode.MULTIRUN if args.multirun else RunMode.RUN
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), **VERSION_BASE):
        loader = GlobalHydra.instance().config_loader()
        config = loader.load_configuration(config_name, args.overrides, run_mode=mode)
        refuse_literal_secrets(config)
        check_target_arguments(config)
        check_added_keys(config)
        check_config(config)
        check_run_dir(config)


def skip_without_extras(text: str) -> None:
    for word, package in EXTRAS.items():
        if word in text and importlib.util.find_spec(package.split(".")[0]) is None:
            pytest.skip(f"needs the {package} package (an extra)")


COMPOSING = [s for s in SHOWN if argv_of(s) is not None]
# Each command once, named by where it is first shown.
UNIQUE = list({s.text: s for s in reversed(COMPOSING)}.values())[::-1]


def test_the_pages_show_commands() -> None:
    """The extraction below finds what it should (else every test after it passes vacuously)."""
    pages = {s.page for s in COMPOSING}
    assert {"README.md", "docs/gpu.md", "docs/many_gpus.md", "docs/gpt.md"} <= pages
    assert len(COMPOSING) > 40
    assert any(s.error for s in COMPOSING)  # the error examples of docs/configuration.md
    assert set(CANNOT_COMPOSE) <= {s.text for s in COMPOSING}, "an exception no page shows"


@pytest.mark.parametrize("shown", UNIQUE, ids=str)
def test_command_composes(shown: Shown, tmp_path: Path) -> None:
    skip_without_extras(shown.text)
    parsed = argv_of(shown)
    assert parsed is not None
    checkpoint = tmp_path / "last.ckpt"
    checkpoint.touch()
    config_name, argv = parsed
    argv = with_stand_ins(config_name, argv, checkpoint)
    try:
        if shown.text in CANNOT_COMPOSE:  # still true, or it leaves the list
            with pytest.raises((ConfigError, ConfigCompositionException)):
                check_before_start(config_name, argv)
        elif shown.error is None:
            check_before_start(config_name, argv)
        else:
            with pytest.raises(ConfigError) as refused:
                check_before_start(config_name, argv)
            assert f"volt: config error: {refused.value}" == shown.error
    finally:
        GlobalHydra.instance().clear()


OTHERS = [s for s in SHOWN if argv_of(s) is None]


@pytest.mark.parametrize("shown", OTHERS, ids=str)
def test_module_or_script_exists(shown: Shown) -> None:
    """`python -m volt.x` names a module; a benchmark script exists and takes the options shown
    (its source defines each `--option`; gpu_checks.sh has each step shown)."""
    words = [w for w in shlex.split(shown.text, comments=True) if w != "..."]
    if words[0].startswith("volt-"):
        assert f"\n{words[0]} = " in (PROJECT_ROOT / "pyproject.toml").read_text(), words[0]
        return
    if words[:2] == ["python", "-m"]:
        assert importlib.util.find_spec(words[2]) is not None, f"no module {words[2]}"
        return
    script = next(w for w in words if w.startswith("benchmarks/"))
    source = (PROJECT_ROOT / script).read_text()
    if script.endswith(".sh"):
        steps = words[words.index(script) + 1 :]
        assert all(re.search(rf"^\s*{re.escape(s)}\)", source, re.M) for s in steps), steps
        return
    # (`--` alone ends the options: what follows is passed on, e.g. train.py overrides)
    for option in (w.split("=")[0] for w in words if w.startswith("--") and w != "--"):
        assert f'"{option}"' in source, f"{script} takes no {option}"


def headings(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings: lower case, punctuation dropped, spaces as -."""
    anchors: set[str] = set()
    for line in outside_fences(page.read_text()).splitlines():
        if m := re.match(r"#{1,6} (.+)", line):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            taken = slug
            n = 0
            while taken in anchors:  # GitHub numbers a repeated heading
                n += 1
                taken = f"{slug}-{n}"
            anchors.add(taken)
    return anchors


LINKS = [
    (page, match.group(1), outside_fences(page.read_text()).count("\n", 0, match.start()) + 1)
    for page in PAGES
    for match in LINK.finditer(outside_fences(page.read_text()))
    if not re.match(r"[a-z]+:", match.group(1))  # http:, https:, mailto:
]


@pytest.mark.parametrize(
    ("page", "link"),
    [(page, link) for page, link, _ in LINKS],
    ids=[f"{p.relative_to(PROJECT_ROOT)}:{n}:{link}" for p, link, n in LINKS],
)
def test_link_resolves(page: Path, link: str) -> None:
    path, _, anchor = link.partition("#")
    target = (page.parent / path).resolve() if path else page
    assert target.is_file(), f"{link}: no file {target}"
    if anchor:
        assert anchor in headings(target), f"{link}: {target.name} has no heading #{anchor}"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {
        (PROJECT_ROOT / link.partition("#")[0]).resolve() for p, link, _ in LINKS if p == PAGES[0]
    }
    unlinked = [page.name for page in PAGES[1:] if page.resolve() not in linked]
    assert not unlinked, f"README.md links no {unlinked}"


def table_target(script: Path) -> tuple[Path, list[str]]:
    """(the page `--readme` rewrites, the tables the script writes there), read from its source:
    `README = REPO / "docs" / "x.md"`, and `<!-- x:begin -->` for each table x."""
    tree = ast.parse(script.read_text())
    parts: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "README" for t in node.targets
        ):
            constants = [c for c in ast.walk(node.value) if isinstance(c, ast.Constant)]
            parts = [str(c.value) for c in sorted(constants, key=lambda c: c.col_offset)]
    tables = {
        m.group(1)
        for c in ast.walk(tree)
        if isinstance(c, ast.Constant) and isinstance(c.value, str)
        if (m := re.fullmatch(r"<!-- ([\w-]+):begin -->", c.value))
    }
    return PROJECT_ROOT.joinpath(*parts), sorted(tables)


@pytest.mark.parametrize("script", BENCHMARKS_WITH_TABLES)
def test_benchmark_writes_its_table_between_markers_of_its_page(script: str) -> None:
    page, tables = table_target(PROJECT_ROOT / "benchmarks" / script)
    assert page.is_file() and page != PROJECT_ROOT / "README.md", page
    assert tables, f"{script} names no <!-- ...:begin --> marker"
    text = page.read_text()
    for table in tables:
        begin, end = f"<!-- {table}:begin -->", f"<!-- {table}:end -->"
        assert text.count(begin) == 1 and text.count(end) == 1, (page.name, table)
        assert text.index(begin) < text.index(end)
        assert begin not in (PROJECT_ROOT / "README.md").read_text()


# The README's commands that run in seconds on the CPU, run for real, in the order a newcomer
# would type them: (as the README shows it, as run here). `{ckpt}` is the checkpoint the first run
# wrote; every run writes under the test's own outputs folder. What `train.py` and `-m volt.eval`
# run, runs in the test's process (run_volt_here): the commands' results are the point here, and
# a fresh interpreter's start is tested elsewhere (tests/test_cli.py); `volt.env` in its own.
EVAL = "python -m volt.eval ckpt_path=outputs/train/runs/<run>/checkpoints/last.ckpt"
RUN_FOR_REAL = [
    ("python train.py", "train.py"),
    ("python train.py name=my-run", "train.py name=my-run"),
    ("python train.py name=my-run", "train.py name=my-run"),  # again: finished, nothing to do
    (EVAL, "-m volt.eval ckpt_path={ckpt}"),
    (
        "python -m volt.eval ckpt_path=... mode=predict",
        "-m volt.eval ckpt_path={ckpt} mode=predict",
    ),
    ("python train.py debug=fdr", "train.py debug=fdr"),
    ("python train.py --cfg job", "train.py --cfg job"),
    ("python -m volt.env", "-m volt.env"),
]


@pytest.mark.slow  # seven commands here and volt.env in a process: about a minute on 2 cores
def test_the_quick_commands_of_the_readme_run(run_volt_here: RunHere, tmp_path: Path) -> None:
    readme = (PROJECT_ROOT / "README.md").read_text()
    outputs = tmp_path / "outputs"
    ckpt = ""
    for shown, run in RUN_FOR_REAL:
        assert f"`{shown}`" in readme, f"the README no longer shows {shown!r}: update RUN_FOR_REAL"
        args = shlex.split(run.format(ckpt=ckpt))
        if args[0] == "train.py":
            result = run_volt_here(args[1:])
        elif args[:2] == ["-m", "volt.eval"]:
            result = run_volt_here(args[2:], module="volt.eval")
        else:
            command = [sys.executable, *args]
            result = subprocess.run(
                command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300
            )
        assert result.returncode == 0, f"{shown}\n{result.stderr[-3000:]}"
        if not ckpt and run == "train.py":
            (found,) = (outputs / "train" / "runs").glob("*/checkpoints/last.ckpt")
            ckpt = str(found)
    assert "already finished" in (outputs / "train" / "runs" / "my-run" / "train.log").read_text()
    assert list((outputs / "eval").rglob("predictions.csv"))
