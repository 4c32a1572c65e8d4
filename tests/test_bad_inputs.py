"""Bad input, table-driven: each case exits with one clear line naming the key, the value and the
fix (status 2; 1 for what Hydra refuses while composing), and outputs/ is exactly as it was: no
file changed, no file or directory added, whether volt refused before Hydra made the run
directory or removed the directory it had made."""

import hashlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra
from lightning.pytorch.accelerators import AcceleratorRegistry

from volt import eval as volt_eval
from volt import train as volt_train


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root with a hash of its bytes, and every directory: any change shows."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "/"
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def outputs(tmp_path: Path) -> Path:
    """An outputs/ that already holds a user's earlier run."""
    earlier = tmp_path / "outputs" / "train" / "runs" / "earlier"
    (earlier / "checkpoints").mkdir(parents=True)
    (earlier / "checkpoints" / "last.ckpt").write_bytes(b"the user's checkpoint")
    (earlier / "train.log").write_text("the user's log\n")
    return tmp_path / "outputs"


@pytest.fixture
def run_main(
    outputs: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., tuple[int, str]]]:
    """Runs an entry point in this process as the command line would; returns (exit code, stderr).
    In-process so that 30 cases cost seconds, not the import time of 30 interpreters."""

    def _run(args: list[str], entry: Callable[[], object] = volt_train.main) -> tuple[int, str]:
        GlobalHydra.instance().clear()
        monkeypatch.setattr(sys, "argv", ["train.py", *args, f"paths.outputs_dir={outputs}"])
        code: int | str | None = 0
        try:
            entry()
        except SystemExit as exit:
            code = exit.code
        return (code if isinstance(code, int) else 1), capsys.readouterr().err

    yield _run
    GlobalHydra.instance().clear()


def write(path: Path, content: bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return str(path)


# Hydra refuses these while composing, with its own message (exit status 1).
HYDRA_CASES: list[tuple[str, list[str], str]] = [
    ("unknown key", ["nonexistent=1"], "Could not override 'nonexistent'"),
    ("unknown nested key", ["data.batchsize=3"], "Could not override 'data.batchsize'"),
    ("unknown model", ["model=transformer"], "Could not find 'model/transformer'"),
    ("unknown data", ["data=imagenet"], "Could not find 'data/imagenet'"),
    ("unknown trainer", ["trainer=tpu9"], "Could not find 'trainer/tpu9'"),
    ("unknown compile", ["compile=fast"], "Could not find 'compile/fast'"),
    ("unknown experiment", ["experiment=nope"], "Could not find 'experiment/nope'"),
    ("unknown debug", ["debug=nope"], "Could not find 'debug/nope'"),
    ("bad override syntax", ["model.optimizer.lr=[1,"], "no viable alternative at input '[1,'"),
]
CASES: list[tuple[str, list[str], str]] = [
    # (id, overrides, expected text in stderr)
    ("batch size text", ["data.batch_size=many"], "data.batch_size='many' is not valid"),
    ("batch size zero", ["data.batch_size=0"], "data.batch_size=0 is not valid: use a positive"),
    ("batch size negative", ["data.batch_size=-8"], "data.batch_size=-8 is not valid"),
    ("batch size float", ["data.batch_size=1.5"], "data.batch_size=1.5 is not valid"),
    ("workers negative", ["data.num_workers=-1"], "data.num_workers=-1 is not valid"),
    ("val fraction one", ["data.val_fraction=1.0"], "data.val_fraction=1.0 is not valid"),
    ("precision short", ["precision=16"], "precision=16 is not valid: use one of 64-true"),
    ("precision typo", ["precision=bf16"], "precision='bf16' is not valid"),
    ("precision legacy", ["precision=fp16"], "precision='fp16' is not valid"),
    ("seed negative", ["seed=-1"], "seed=-1 is not valid"),
    ("seed text", ["seed=abc"], "seed='abc' is not valid"),
    ("lr zero", ["model.optimizer.lr=0"], "model.optimizer.lr=0 is not valid: use a positive"),
    ("lr text", ["model.optimizer.lr=fast"], "model.optimizer.lr='fast' is not valid"),
    ("max epochs text", ["trainer.max_epochs=ten"], "trainer.max_epochs='ten' is not valid"),
    ("max epochs -2", ["trainer.max_epochs=-2"], "trainer.max_epochs=-2 is not valid"),
    ("accelerator typo", ["trainer.accelerator=gpus"], "trainer.accelerator='gpus' is not valid"),
    ("compile mode typo", ["compile.mode=fastest"], "compile.mode='fastest' is not valid"),
    ("fullgraph text", ["compile=default", "compile.fullgraph=maybe"], "compile.fullgraph='maybe'"),
    ("matmul precision", ["matmul_precision=low"], "matmul_precision='low' is not valid"),
    ("tune typo", ["tune=batch"], "tune='batch' is not valid"),
    ("missing value", ["data.batch_size=???"], "data.batch_size has no value (???)"),
    ("nodes zero", ["trainer.num_nodes=0"], "trainer.num_nodes=0 is not valid"),
    ("no training data", ["data.test_fraction=0.9"], "leave no training data"),
    ("test fraction zero", ["data.test_fraction=0"], "data.test_fraction=0 is not valid"),
    (
        "batch over ranks",
        ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "data.batch_size=63"],
        "does not divide over 2 processes",
    ),
    ("adam eps in fp16", ["precision=16-true"], "model.optimizer.eps=1e-08: fp16 rounds it to 0"),
    # Path parts: every value that names a directory, and the directory they make.
    ("name escapes", ["name=../../../x"], "name='../../../x' is not valid"),
    ("task_name escapes", ["task_name=../../../x"], "task_name='../../../x' is not valid"),
    ("run dir outside", ["hydra.run.dir=elsewhere"], "is not inside paths.outputs_dir="),
    (
        "sweep value escapes",
        ["-m", "callbacks.model_checkpoint.filename=best,../../../x"],
        "callbacks.model_checkpoint.filename=../../../x: a sweep job's directory is named by",
    ),
    # Keys nothing reads: a plain section's by conf/, a `_target_` section's by its signature.
    ("unknown top-level key", ["+foo.bar=1"], "the train config has no top-level key 'foo'"),
    ("unknown section key", ["+compile.mod=default"], "did you mean compile.mode?"),
    (
        "trainer key typo",
        ["+trainer.max_epoch=5"],
        "trainer.max_epoch: lightning.pytorch.Trainer takes no argument 'max_epoch'; did you mean"
        " trainer.max_epochs",
    ),
    ("data key typo", ["+data.batchsize=3"], "data.batchsize: volt.data.digits.DigitsDataModule"),
    ("callback key typo", ["+callbacks.early_stopping.patiense=3"], "early_stopping.patience?"),
    ("logger kwargs typo", ["+logger.tensorboard.flush_sec=5"], "logger.tensorboard.flush_secs?"),
    (
        "strategy kwargs typo",
        ["trainer=ddp", "+trainer.strategy.find_unused_parameter=true"],
        "did you mean trainer.strategy.find_unused_parameters",
    ),
    ("set by volt", ["+model.num_classes=3"], "model.num_classes is set by volt"),
    # What Lightning refuses only when it builds the Trainer, after the run directory exists.
    ("devices zero", ["trainer.devices=0"], "trainer.devices=0 is not valid"),
    ("devices negative", ["trainer=cpu", "trainer.devices=-2"], "trainer.devices=-2 is not valid"),
    ("strategy typo", ["trainer.strategy=ddpp"], "trainer.strategy='ddpp' is not a strategy"),
    ("limit batches", ["trainer.limit_val_batches=1.5"], "trainer.limit_val_batches=1.5 is not"),
    ("clip algorithm", ["+trainer.gradient_clip_algorithm=max"], "gradient_clip_algorithm='max'"),
    ("prefetch zero", ["data.prefetch_factor=0"], "data.prefetch_factor=0 is not valid"),
    # Only the library can tell: its error in one line, the directory it was made for removed.
    ("refused by Lightning", ["+trainer.max_time=abc"], "Trainer refused its arguments: Misc"),
    # Any error in volt's Hydra callbacks ends the run; Hydra alone would only warn and go on.
    ("error in a callback", ["hydra.run.dir=${oc.env:VOLT_UNSET_X}"], "volt: error: Interpolation"),
]
if not torch.cuda.is_available():
    CASES += [
        ("gpu without gpu", ["trainer=gpu"], "no CUDA GPU is visible"),
        ("cuda without gpu", ["trainer.accelerator=cuda"], "no CUDA GPU is visible"),
    ]
CASES += [
    (f"{name} absent", [f"trainer.accelerator={name}"], f"trainer.accelerator='{name}' but this")
    for name in ("mps", "tpu")
    if not AcceleratorRegistry[name]["accelerator"].is_available()
]


def assert_refused(err: str, message: str, outputs: Path, before: dict[str, str]) -> None:
    assert message in err, err
    assert "Traceback" not in err
    assert snapshot(outputs) == before


def volt_line(err: str, message: str) -> str:
    """The one line volt printed, holding the whole of `message`."""
    lines = [line for line in err.splitlines() if line.startswith("volt: ") and message in line]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    ("overrides", "message"), [c[1:] for c in HYDRA_CASES], ids=[c[0] for c in HYDRA_CASES]
)
def test_refused_by_hydra(
    overrides: list[str], message: str, run_main: Callable[..., tuple[int, str]], outputs: Path
) -> None:
    before = snapshot(outputs)
    code, err = run_main(overrides)
    assert code == 1
    assert_refused(err, message, outputs, before)


@pytest.mark.parametrize(
    ("overrides", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_training_input(
    overrides: list[str], message: str, run_main: Callable[..., tuple[int, str]], outputs: Path
) -> None:
    before = snapshot(outputs)
    code, err = run_main(overrides)
    assert code == 2, err
    assert_refused(err, message, outputs, before)
    volt_line(err, message)


# {garbage}: a file that is not a checkpoint; {foreign}: a checkpoint volt did not write.
EVAL_CASES: list[tuple[list[str], str]] = [
    (["ckpt_path=missing.ckpt"], "ckpt_path='missing.ckpt' is not valid: use an existing"),
    (["ckpt_path={tmp}"], "is not valid: use an existing checkpoint file"),
    (["ckpt_path={garbage}"], "cannot be used"),
    (["ckpt_path={foreign}"], "was not written by volt's training"),
    (["ckpt_path={garbage}", "mode=train"], "mode='train' is not valid: use test or predict"),
    (["ckpt_path={garbage}", "precision=8-true"], "precision='8-true' is not valid"),
    (["ckpt_path={garbage}", "batch_size=0"], "batch_size=0 is not valid"),
    (["mode=test"], "ckpt_path has no value (???)"),
    (["ckpt_path={garbage}", "name=../../../x"], "name='../../../x' is not valid"),
    (["ckpt_path={garbage}", "task_name=../../x"], "task_name='../../x' is not valid"),
    (["ckpt_path={garbage}", "+foo.bar=1"], "the eval config has no top-level key 'foo'"),
    (["ckpt_path={garbage}", "+batchsize=3"], "did you mean batch_size?"),
    (
        [
            "-m",
            "ckpt_path={garbage}",
            "data_root=a,../../../x",
            "hydra.job.config.override_dirname.exclude_keys=[ckpt_path]",
        ],
        "data_root=../../../x: a sweep job's directory is named by its overrides",
    ),
]
if not AcceleratorRegistry["mps"]["accelerator"].is_available():
    EVAL_CASES.append((["ckpt_path={garbage}", "accelerator=mps"], "accelerator='mps' but this"))


@pytest.mark.parametrize(("overrides", "message"), EVAL_CASES)
def test_bad_eval_input(
    overrides: list[str],
    message: str,
    tmp_path: Path,
    run_main: Callable[..., tuple[int, str]],
    outputs: Path,
) -> None:
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {}}, foreign)
    files = {"tmp": tmp_path, "garbage": write(tmp_path / "garbage.ckpt", b"not a ckpt")}
    args = [o.format(foreign=foreign, **files) for o in overrides]
    before = snapshot(outputs)
    code, err = run_main(args, entry=volt_eval.main)
    assert code == 2, err
    assert_refused(err, message, outputs, before)
    volt_line(err, message)


def test_missing_data_files_are_one_clear_line(
    run_main: Callable[..., tuple[int, str]], tmp_path: Path, outputs: Path
) -> None:
    """Only the data module can tell (in prepare_data, when the fit starts): the run directory
    Hydra made for it is gone again, and nothing else changed."""
    before = snapshot(outputs)
    code, err = run_main(["data=mnist", f"data.root={tmp_path / 'nowhere'}", "data.download=false"])
    assert code == 2
    line = volt_line(err, f"data.root={tmp_path / 'nowhere'}: MNIST files not found")
    assert "train-images-idx3-ubyte" in line
    assert "Traceback" not in err
    assert snapshot(outputs) == before


def test_a_named_run_that_existed_is_kept(
    run_main: Callable[..., tuple[int, str]], tmp_path: Path, outputs: Path
) -> None:
    """Refused after Hydra wrote into it, a run directory that was there before stays."""
    code, err = run_main(["name=earlier", "+trainer.max_time=abc"])
    assert code == 2, err
    assert "Trainer refused its arguments" in err
    assert (outputs / "train" / "runs" / "earlier" / "checkpoints" / "last.ckpt").is_file()
    assert (
        (outputs / "train" / "runs" / "earlier" / "train.log")
        .read_text()
        .startswith("the user's log\n")
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["resume=true"], "resume=true needs a run name"),
        (["name=new-run", "resume=true"], "name=new-run with resume=true, but"),
        (["name=has/slash"], "name='has/slash' is not valid"),
    ],
)
def test_bad_resume_requests(
    overrides: list[str], message: str, run_main: Callable[..., tuple[int, str]], outputs: Path
) -> None:
    before = snapshot(outputs)
    code, err = run_main(overrides)
    assert code == 2, err
    assert_refused(err, message, outputs, before)
