"""What a run prints reaches the console and the log file whatever the locale's encoding."""

import ast
import io
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.in_process import FAST, RunHere
from volt.config import PROJECT_ROOT

# The C locale with Python's coercion to C.UTF-8 and its UTF-8 mode off: stdout and open()
# encode in ASCII, as under LANG=en_US.ISO-8859-1 they would in Latin-1.
ASCII_LOCALE = {"LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}


def test_a_run_in_an_ascii_locale_escapes_what_the_console_cannot_print(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    result = subprocess.run(
        [sys.executable, "train.py", "debug=fdr", f"paths.outputs_dir={outputs}"],
        cwd=PROJECT_ROOT,
        env={**os.environ, **ASCII_LOCALE},
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Lightning's tips start with an emoji: printing one ended the run (UnicodeEncodeError), and
    # the log file's handler reported a logging error for each.
    assert result.returncode == 0, result.stderr[-3000:]
    assert "UnicodeEncodeError" not in result.stdout + result.stderr
    (log,) = outputs.glob("train/runs/*/train.log")
    assert "fast_dev_run" in log.read_text(encoding="utf-8")


def test_result_names_and_values_from_a_metrics_file_are_text_not_markup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A handed-over run's metrics.json may name anything: shown as written, nothing fails."""
    import lightning.pytorch  # noqa: F401  # sets the rank print_result asks (alone, it was unset)

    from volt.console import print_result

    crafted = {"[red]test/acc[/red]": 0.5, "val/loss\nforged": 1.0, "text": "x"}
    print_result(crafted, tmp_path)  # type: ignore[arg-type]  # values as a file may hold them
    out = capsys.readouterr().out
    assert "[red]test/acc[/red]" in out and "0.5000" in out
    # a line break in a name is shown escaped, on its line (volt.console.Terminal)
    assert "│ val/loss\\nforged " in out and "'x'" in out


def test_a_run_that_logged_no_metric_prints_no_empty_table(run_volt_here: RunHere) -> None:
    """No training batches and no test: nothing was validated or tested."""
    result = run_volt_here([*FAST, "trainer.limit_train_batches=0", "test=false"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "┃ metric" not in result.stdout, result.stdout  # the result table's header
    assert "Result: no metric was logged" in result.stdout


@pytest.mark.parametrize("verbose", [False, True])
def test_a_default_run_fits_a_screen_and_verbose_adds_the_config_tree(
    run_volt: Callable[..., subprocess.CompletedProcess[str]],
    run_volt_here: RunHere,
    tmp_path: Path,
    verbose: bool,
) -> None:
    """The config tree goes to config_tree.txt always, to the console with verbose=true only;
    Lightning's chatter that concerns no volt user (its cloud tip, a second model summary
    refused, a test table print_result repeats, a memory monitor idle on a CPU) is not said.
    Each epoch's throughput, the accelerators Lightning looked for, the seed and the checkpoint
    test restores are for train.log only: the console of a run fits one screen (40 lines). The
    quiet run in a fresh interpreter, as a user sees it; the verbose one through train.py's entry
    in this process."""
    run = run_volt_here if verbose else run_volt
    result = run(["trainer.max_epochs=3", "name=quiet", f"verbose={str(verbose).lower()}"])
    assert result.returncode == 0, result.stderr[-3000:]
    said = result.stdout + result.stderr
    run_dir = tmp_path / "outputs" / "train" / "runs" / "quiet"
    tree = (run_dir / "config_tree.txt").read_text()
    assert "model_checkpoint" in tree
    assert ("model_checkpoint" in said) == verbose
    for chatter in ("Tip:", "already configured with model summary", "Test metric", "inactive"):
        assert chatter not in said
    logged = (run_dir / "train.log").read_text()
    for line in ("epoch 2: ", "GPU available:", "Seed set to 42", "Loaded model weights from"):
        assert line in logged and line not in said, line
    # volt.console._LightningChatter knows Lightning 2.6.6's lines by how they begin: one that
    # Lightning rewords or adds is logged at INFO and reaches the console. Here it fails instead.
    by_lightning = re.findall(r"^\S+ \S+ (?!DEBUG)\w+ +lightning\.\S+ (.*)$", logged, re.M)
    assert by_lightning == ["`Trainer.fit` stopped: `max_epochs=3` reached."]
    assert "site-packages/lightning" not in said  # nor any of its warnings
    assert "testing the best checkpoint" in said
    if not verbose:
        assert len(said.splitlines()) <= 40, said


def test_with_verbose_a_refusal_of_the_built_objects_comes_before_any_tree(
    run_volt_here: RunHere,
) -> None:
    """What only the objects can tell (a data module lacking what task.from_data names) is
    refused in one line before the config tree would be printed (train.py's entry, in this
    process)."""
    conf = Path(__file__).parent / "user_task_conf"
    args = [f"hydra.searchpath=[file://{conf}]", "model=line", "data=line", "task=plain"]
    args += ["trusted_targets=[tests]", "+task.from_data={hidden:num_classes}", "~model.hidden"]
    result = run_volt_here([*args, "verbose=true"])
    assert result.returncode == 2, result.stderr[-3000:]
    assert "LineData has no attribute" in result.stderr
    assert "model_checkpoint" not in result.stdout + result.stderr


class ClosedPipe(io.StringIO):
    """A stdout whose reader went away: every write meets EPIPE."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_print_to_a_closed_console_stops_the_run_as_sigpipe_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rich's own answer was SystemExit(1), with no word and no record (volt.console)."""
    from rich.console import Console

    from volt.console import Terminal, stop_when_the_console_is_closed
    from volt.errors import TrainingInterrupted

    monkeypatch.setattr(Console, "on_broken_pipe", Console.on_broken_pipe)  # put back after
    monkeypatch.setattr(os, "dup2", lambda *args: None)  # not this test process's stdout
    stop_when_the_console_is_closed()
    for console in (Terminal(file=ClosedPipe()), Console(file=ClosedPipe())):
        with pytest.raises(TrainingInterrupted) as stopped:
            console.print("a line")
        assert stopped.value.code == 128 + signal.SIGPIPE
        assert console.quiet  # what follows goes nowhere


def strides_warning(sizes: str, grad: str, bucket: str) -> str:
    """DDP's reducer's warning as torch words it (reducer.cpp, torch 2.11 to 2.14)."""
    return (
        "Grad strides do not match bucket view strides. This may indicate grad was not created"
        " according to the gradient layout contract, or that the param's strides changed since"
        " DDP was constructed.  This is not an error, but may impair performance.\n"
        f"grad.sizes() = {sizes}, strides() = {grad}\nbucket_view.sizes() = {sizes}, strides() ="
        f" {bucket} (Triggered internally at"
        " /pytorch/torch/csrc/distributed/c10d/reducer.cpp:335.)"
    )


@pytest.mark.parametrize(
    ("sizes", "grad", "bucket", "silenced"),
    [
        # a 1x1 convolution compiled by inductor: the same bytes in the same order
        ("[256, 64, 1, 1]", "[64, 1, 64, 64]", "[64, 1, 1, 1]", True),
        # channels_last 3x3 weights: a real transpose, a strided copy every step
        ("[64, 32, 3, 3]", "[288, 1, 96, 32]", "[288, 9, 3, 1]", False),
        # a transposed matrix
        ("[1, 64]", "[1, 1]", "[64, 1]", False),
        # strides that do not fit the sizes: not the 1x1 case
        ("[256, 64, 1, 1]", "[32, 1, 32, 32]", "[64, 1, 1, 1]", False),
    ],
)
def test_only_the_one_by_one_convolutions_stride_warning_is_silenced(
    sizes: str, grad: str, bucket: str, silenced: bool
) -> None:
    from volt.console import ONE_BY_ONE_STRIDES

    # As warnings.filterwarnings compiles and matches a message filter.
    matched = re.compile(ONE_BY_ONE_STRIDES, re.I).match(strides_warning(sizes, grad, bucket))
    assert bool(matched) is silenced


# DDP over one gloo rank, a net with a 1x1 convolution compiled in place, as volt's compile= and
# trainer=ddp make it; prints each warning of its backward passes.
COMPILED_ONE_BY_ONE = """
import sys, warnings
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 1))
net.compile()
ddp = DistributedDataParallel(net)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    for _ in range(2):
        ddp(torch.randn(4, 3, 8, 8)).sum().backward()
dist.destroy_process_group()
for warning in seen:
    print(repr(str(warning.message)))
"""


@pytest.mark.slow  # a process of its own that compiles with inductor: about 6 s on 2 cores
def test_the_stride_warning_silenced_is_the_one_a_compiled_one_by_one_convolution_gives(
    tmp_path: Path,
) -> None:
    """The real warning, from this torch: the filter's pattern matches it word for word."""
    from volt.console import ONE_BY_ONE_STRIDES

    done = subprocess.run(
        [sys.executable, "-c", COMPILED_ONE_BY_ONE, str(tmp_path / "rendezvous")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    messages = [ast.literal_eval(line) for line in done.stdout.splitlines()]
    strides = [m for m in messages if m.startswith("Grad strides")]
    assert strides, messages  # the control: this torch still warns
    assert all(re.compile(ONE_BY_ONE_STRIDES, re.I).match(m) for m in strides), strides
