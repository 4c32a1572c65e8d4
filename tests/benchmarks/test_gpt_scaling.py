"""benchmarks/gpt_scaling.py: the GPT task on several GPUs, here at toy sizes on the CPU."""

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from volt.config import PROJECT_ROOT
from volt.nets.gpt import GPT

SCRIPT = PROJECT_ROOT / "benchmarks" / "gpt_scaling.py"
OLD_README = (
    "# volt\nbefore\n<!-- perf-gpt-multi:begin -->\nold\n<!-- perf-gpt-multi:end -->\nafter\n"
)


@pytest.fixture(scope="module")
def scaling(load_benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return load_benchmark("gpt_scaling")


def test_shapes_are_layers_by_width_in_heads_of_128(scaling: ModuleType) -> None:
    shape = scaling.parse_shape("40x3072")
    assert (shape.n_layer, shape.n_embd, shape.n_head, str(shape)) == (40, 3072, 24, "40x3072")
    counted = GPT(block_size=64, n_layer=2, n_head=1, n_embd=128).num_params(non_embedding=False)
    assert scaling.parse_shape("2x128").params(64) == counted
    with pytest.raises(argparse.ArgumentTypeError, match=r"write e\.g\. 40x3072"):
        scaling.parse_shape("40-3072")
    with pytest.raises(argparse.ArgumentTypeError, match=r"heads of 128: e\.g\. 40x3072"):
        scaling.parse_shape("40x3100")


def with_table(table: str) -> str:
    """OLD_README with `table` in place of what stood between its markers."""
    return OLD_README.replace("\nold\n", f"\n{table}\n")


def test_refused_readme_stops_before_anything_runs(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# volt, no markers\n")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--readme", str(readme), "--work", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"gpt_scaling: {readme}: no <!-- perf-gpt-multi:begin --> ... <!-- perf-gpt-multi:end -->"
        " lines to write the table between: add them"
    )
    assert list(tmp_path.iterdir()) == [readme]  # no run started


ABOUT = {  # as a benchmark on 2 GPUs saves it
    "machine": {
        "device": "NVIDIA H200",
        "gpus": 2,
        "torch": "2.11",
        "lightning": "2.6.6",
        "date": "2026-11-24",
    },
    "throughput": {
        "experiment": "gpt_bytes",
        "variant": "bf16-mixed, torch.compile",
        "block_size": 1024,
        "batch_per_gpu": 16,
        "warmup": 20,
        "steps": 50,
    },
    "largest": {
        "ladder": ["40x3072", "48x4096"],
        "batch_per_gpu": 8,
        "block_size": 1024,
        "precision": "bf16-mixed",
        "steps": 3,
    },
}


def run(name: str, gpus: int, tokens: float, peak: float | None) -> dict[str, object]:
    return {"run": name, "gpus": gpus, "tokens_per_s": tokens, "mfu": tokens / 1e6} | {
        "peak_gib": peak,
        "wall_s": 50 if name.startswith("plain") else 30,
    }


RECORDS = [  # in the order they ran, which is not the table's
    run("volt-ddp", 2, 780_000, 20.0),
    run("plain-1", 1, 400_000, 18.5) | {"params": 85_000_000},
    {"run": "volt-fsdp", "gpus": 2, "error": "timed out after 240 s", "wall_s": 240},
    run("volt-gpu", 1, 390_000, 19.0),
    run("plain-ddp", 2, 800_000, None),
    {"largest": "ddp", "shape": "40x3072", "params": 4.5e9, "outcome": "trained"}
    | {"peak_gib": 110.25, "wall_s": 60},
    {"largest": "ddp", "shape": "48x4096", "params": 9.7e9, "peak_gib": None, "wall_s": 0}
    | {"outcome": "out of memory, by arithmetic (not run): 144 GiB per GPU"},
    {"largest": "fsdp", "shape": "48x4096", "params": 9.7e9, "outcome": "trained"}
    | {"peak_gib": 108.0, "wall_s": 90},
]


def test_report_shows_scaling_against_the_same_sides_one_gpu(scaling: ModuleType) -> None:
    text = scaling.report(ABOUT, RECORDS)
    assert text.startswith("Measured 2026-11-24 on 2 x NVIDIA H200, torch 2.11, Lightning 2.6.6")
    assert "experiment=gpt_bytes (85.0M parameters), 16 windows of 1024 bytes per GPU" in text
    assert "(400 s for the 5 runs)" in text and "(150 s for 3 rungs)" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[1:6] == [
        "| plain PyTorch loop | 1 | 400,000 | 40.0% | 18.5 |  |  |",
        "| plain PyTorch loop, DistributedDataParallel | 2 | 800,000 | 80.0% | n/a | 2.00x |  |",
        "| volt, `trainer=gpu` | 1 | 390,000 | 39.0% | 19.0 |  | 0.975 |",
        "| volt, `trainer=ddp` | 2 | 780,000 | 78.0% | 20.0 | 2.00x | 0.975 |",
        "| volt, `trainer=fsdp` | 2 | failed: timed out after 240 s | | | | |",
    ]
    assert rows[7:] == [
        "| volt, `trainer=ddp` | 40x3072 | 4.50B | 110.2 | 48x4096 (9.70B): out of memory,"
        " by arithmetic (not run): 144 GiB per GPU |",
        "| volt, `trainer=fsdp` | 48x4096 | 9.70B | 108.0 | not tried: the ladder's top |",
    ]


def test_saved_results_go_into_the_readme_without_measuring(
    scaling: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Throughput and the largest GPTs measured apart, the largest ones twice: the later counts.
    stale = {"largest": "ddp", "shape": "2x128", "params": 1, "outcome": "trained", "wall_s": 1}
    parts = [
        ({"machine", "throughput", "largest"}, [*RECORDS[:5], stale]),
        ({"machine", "largest"}, RECORDS[5:]),
    ]
    files: list[str] = []
    for keys, records in parts:
        files.append(str(tmp_path / f"part{len(files)}.json"))
        about = {key: ABOUT[key] for key in keys}
        Path(files[-1]).write_text(json.dumps({"about": about, "records": records}))
    readme = tmp_path / "README.md"
    readme.write_text(OLD_README)
    argv = ["gpt_scaling.py", "--report", *files, "--readme", str(readme)]
    monkeypatch.setattr(sys, "argv", argv)
    scaling.main()
    assert readme.read_text() == with_table(scaling.report(ABOUT, RECORDS))


def test_a_rung_whose_optimiser_state_outgrows_a_gpu_is_not_run(
    scaling: ModuleType, tmp_path: Path
) -> None:
    options = dict(batch_per_gpu=None, warmup=None, steps=None, timeout=60.0, probe_steps=3)
    options |= dict(gpus=None, bucket_mb=None)
    options |= dict(runs=[], largest=[], compile_cache="cold", extra=[], trace=None)
    plan = scaling.make_plan(
        argparse.Namespace(tiny=True, probe_timeout=60.0, work=str(tmp_path), **options)
    )
    h200 = dataclasses.replace(plan, gpu_bytes=140 * 2**30)
    nine_billion = 9_000_000_000  # 16 bytes each: 134 GiB on one GPU, 67 on each of two
    assert scaling.beyond_memory("fsdp", nine_billion, h200) is None
    assert scaling.beyond_memory("ddp", nine_billion, h200) is None
    assert scaling.beyond_memory("ddp", 10_000_000_000, h200) == (
        "out of memory, by arithmetic (not run): 149 GiB per GPU for weights, gradients and"
        " AdamW state alone, of 140 GiB"
    )
    assert scaling.beyond_memory("ddp", 10**12, plan) is None  # the CPU: no bound, a probe


def test_a_second_benchmark_adds_to_the_results_of_the_first(
    scaling: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "results.json"
    plain = {"run": "plain-1", "gpus": 1, "tokens_per_s": 1.0, "mfu": None, "wall_s": 1.0}
    earlier = [
        {"run": "volt-ddp", "gpus": 2, "error": "timed out after 240 s", "wall_s": 240.0},
        plain,
        {"largest": "ddp", "shape": "1x128", "params": 1, "outcome": "trained", "wall_s": 1.0},
    ]
    about = {"machine": {"gpus": 2}, "throughput": {"steps": 50}, "largest": {"steps": 3}}
    path.write_text(json.dumps({"about": about, "records": earlier}))

    # Measuring volt-ddp and the largest GPTs again: their earlier records go.
    results = scaling.Results(
        path, {"machine": {"gpus": 4}, "largest": {"steps": 2}}, ["volt-ddp"], True
    )
    ddp = {"run": "volt-ddp", "gpus": 4, "tokens_per_s": 2.0, "mfu": None, "wall_s": 1.0}
    results.add(ddp)
    assert "volt-ddp on 4: 2 tokens/s (1 s)" in capsys.readouterr().out
    saved = json.loads(path.read_text())
    assert saved == {
        "about": {"machine": {"gpus": 4}, "throughput": {"steps": 50}, "largest": {"steps": 2}},
        "records": [plain, ddp],
    }
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no partial file left


@pytest.mark.slow  # 13 fresh interpreters importing torch and Lightning: 1.5 min on 2 cores
def test_tiny_run_measures_every_side_and_writes_the_readme_tables(
    scaling: ModuleType, tmp_path: Path
) -> None:
    readme, results = tmp_path / "README.md", tmp_path / "results.json"
    readme.write_text(OLD_README)
    command = [sys.executable, str(SCRIPT), "--tiny", "--largest", "--readme", str(readme)]
    command += ["--json", str(results), "--work", str(tmp_path / "work")]
    done = subprocess.run(
        command,
        cwd=PROJECT_ROOT,
        # One thread: on a loaded 2-core machine a second one spins waiting for a core.
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    saved = json.loads(results.read_text())
    runs = {r["run"]: r for r in saved["records"] if "run" in r}
    assert list(runs) == list(scaling.RUNS)
    for name, record in runs.items():
        assert "error" not in record, (name, record["error"])
        assert record["tokens_per_s"] > 0 and record["wall_s"] > 0
        assert record["gpus"] == (1 if name in ("plain-1", "volt-gpu") else 2)
        assert record["mfu"] is None and record["peak_gib"] is None  # a CPU has neither
        if name.startswith("volt"):  # TokenThroughput's timed windows, each its own rate
            assert record["window_tokens_per_s"] and min(record["window_tokens_per_s"]) > 0
    assert runs["plain-1"]["params"] == runs["plain-ddp"]["params"] > 0
    probes = [r for r in saved["records"] if "largest" in r]
    assert [(r["largest"], r["shape"], r["outcome"]) for r in probes] == [
        ("ddp", "2x128", "trained"),
        ("fsdp", "2x128", "trained"),  # the top rung: DDP trained them all
    ]
    assert all(r["params"] > 0 and r["wall_s"] > 0 for r in probes)

    table = scaling.report(saved["about"], saved["records"])
    assert readme.read_text() == with_table(table)
    assert table in done.stdout
    assert table.startswith("Measured ") and "on the CPU (2 processes)" in table
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + len(runs) + 1 + 2  # a header and a line per run, then per strategy
    for line in rows[1:6]:
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        assert float(cells[2].replace(",", "")) > 0
        if cells[1] == "2":
            assert float(cells[5].removesuffix("x")) > 0  # scaling over one process


@pytest.mark.parametrize("cache", ["cold", "shared"])
def test_both_sides_get_the_same_compile_cache_policy(
    scaling: ModuleType, tmp_path: Path, cache: str
) -> None:
    # A fresh machine's volt run compiled inside its timed windows while the plain loop's had
    # compiled before them (issue #40): every run now starts from an empty cache of its own, or
    # all share one; the report names which.
    options = dict(batch_per_gpu=None, warmup=None, steps=None, timeout=60.0, probe_steps=3)
    options |= dict(gpus=None, bucket_mb=None)
    options |= dict(runs=["plain-1"], largest=None, compile_cache=cache, extra=[], trace=None)
    plan = scaling.make_plan(
        argparse.Namespace(tiny=True, probe_timeout=60.0, work=str(tmp_path), **options)
    )
    plain, volt = (
        plan.cache_env(run)["TORCHINDUCTOR_CACHE_DIR"] for run in ("plain-1", "volt-gpu")
    )
    assert (plain == volt) is (cache == "shared")
    assert plan.cache_env("volt-gpu")["TRITON_CACHE_DIR"].startswith(volt)
    assert not Path(volt).exists()  # empty: nothing compiled there yet
    assert (
        scaling.about_this(plan, [], argparse.Namespace(runs=["plain-1"], largest=None))[
            "throughput"
        ]["compile_cache"]
        == cache
    )


def test_a_run_in_a_used_work_folder_gets_a_fresh_name(scaling: ModuleType, tmp_path: Path) -> None:
    # Its CSV windows are read back by glob under its outputs: a second volt-fsdp run in the
    # same --work read both runs' windows (2 H200s, 2026-11-28).
    assert scaling.fresh(tmp_path, "volt-fsdp", ".log") == tmp_path / "volt-fsdp.log"
    (tmp_path / "volt-fsdp").mkdir()
    assert scaling.fresh(tmp_path, "volt-fsdp", ".log") == tmp_path / "volt-fsdp-2.log"
    (tmp_path / "volt-fsdp-2.log").write_text("")
    assert scaling.fresh(tmp_path, "volt-fsdp", ".log") == tmp_path / "volt-fsdp-3.log"


class NotRun:
    """What harness.run_fresh returns in place of a run (commands_not_run)."""

    wall_s = 0.0

    def failure(self) -> str:
        return "not run"


def commands_not_run(scaling: ModuleType, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The commands `measure` would run, recorded in the returned list instead of run."""
    commands: list[list[str]] = []

    def run_fresh(command: list[str], *args: object, **kwargs: object) -> NotRun:
        commands.append(command)
        return NotRun()

    monkeypatch.setattr(scaling.harness, "run_fresh", run_fresh)
    return commands


def test_a_traced_benchmark_hands_the_folder_to_the_plain_runs_only(
    scaling: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = dict(batch_per_gpu=None, warmup=None, steps=None, timeout=60.0, probe_steps=3)
    options |= dict(gpus=None, bucket_mb=None)
    options |= dict(runs=["plain-ddp", "volt-ddp"], largest=None, compile_cache="cold", extra=[])
    plan = scaling.make_plan(
        argparse.Namespace(
            tiny=True, probe_timeout=60.0, work=str(tmp_path), trace="traces", **options
        )
    )
    commands = commands_not_run(scaling, monkeypatch)
    for run in ("plain-ddp", "volt-ddp"):
        assert scaling.measure(run, plan)["error"] == "not run"
    plain, volt = commands
    assert plain[plain.index("--trace") + 1] == str(Path("traces").resolve())
    assert "--trace" not in volt
    about = scaling.about_this(plan, [], argparse.Namespace(runs=["plain-ddp"], largest=None))
    assert about["throughput"]["traced"] == str(Path("traces").resolve())


def test_a_traced_benchmark_writes_no_readme(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(OLD_README)
    command = [sys.executable, str(SCRIPT), "--tiny", "--trace", str(tmp_path / "traces")]
    done = subprocess.run(
        [*command, "--readme", str(readme)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "leave out --readme" in done.stderr
    assert readme.read_text() == OLD_README and not (tmp_path / "traces").exists()
    done = subprocess.run(
        [*command, "--rounds", "2"], capture_output=True, text=True, timeout=120
    )  # fmt: skip
    assert done.returncode == 2 and "each round's traces would replace" in done.stderr


def test_rounds_alternate_the_order_and_report_volt_over_plain_per_round(
    scaling: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sides measured minutes apart on a machine whose speed drifts compare best within a round:
    the ddp ratio moved from 0.86x to 1.00x between calls on 2 x H200 (2026-11-28 and 29)."""
    order = []
    tokens = {("plain-ddp", 0): 1000.0, ("volt-ddp", 0): 900.0, ("volt-ddp", 1): None}
    tokens |= {("plain-ddp", 1): 1000.0, ("plain-ddp", 2): 800.0, ("volt-ddp", 2): 760.0}

    def measure(name: str, plan: object) -> dict[str, object]:
        order.append(name)
        rate = tokens[name, order.count(name) - 1]
        if rate is None:
            return {"run": name, "gpus": 2, "error": "timed out after 120 s", "wall_s": 120}
        return run(name, 2, rate, None)

    # An earlier call's rounds in the same results file: its fsdp run was measured beside a
    # plain run that this call measures again, so it has no plain run to be compared with.
    earlier = [run("plain-ddp", 2, 1200.0, None) | {"call": "earlier", "round": r} for r in (0, 1)]
    earlier += [run("volt-fsdp", 2, 1000.0, None) | {"call": "earlier", "round": r} for r in (0, 1)]
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"about": {}, "records": earlier}))
    monkeypatch.setattr(scaling, "measure", measure)
    options = dict(batch_per_gpu=None, warmup=None, steps=None, timeout=60.0, probe_steps=3)
    options |= dict(gpus=None, bucket_mb=None)
    options |= dict(largest=None, compile_cache="cold", extra=[], trace=None, json=str(results))
    args = argparse.Namespace(
        tiny=True, probe_timeout=60.0, work=str(tmp_path), runs=["plain-ddp", "volt-ddp"],
        rounds=3, **options,
    )  # fmt: skip
    text, _ = scaling.measured(args)
    assert order == ["plain-ddp", "volt-ddp", "volt-ddp", "plain-ddp", "plain-ddp", "volt-ddp"]
    rows = [line for line in text.splitlines() if line.startswith("| volt, `trainer=ddp`")]
    assert [row.split("|")[-2].strip() for row in rows] == ["0.900", "", "0.950"]
    assert rows[1].startswith("| volt, `trainer=ddp` (round 2) | 2 | failed: timed out")
    assert text.splitlines()[-2:] == [
        "- volt, `trainer=ddp` / plain, by round: 0.900, failed, 0.950; median of 2: 0.925",
        "- volt, `trainer=fsdp` / plain, by round: no plain run, no plain run; none",
    ]
    saved = json.loads(results.read_text())
    mine = [r for r in saved["records"] if r["call"] != "earlier"]
    assert [r["round"] for r in mine] == [0, 0, 1, 1, 2, 2]
    assert len({r["call"] for r in mine}) == 1


def test_each_round_of_a_side_compiles_from_an_empty_cache(
    scaling: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = dict(batch_per_gpu=None, warmup=None, steps=None, timeout=60.0, probe_steps=3)
    options |= dict(gpus=None, bucket_mb=None)
    options |= dict(runs=["volt-ddp"], largest=None, compile_cache="cold", extra=[], trace=None)
    plan = scaling.make_plan(
        argparse.Namespace(tiny=True, probe_timeout=60.0, work=str(tmp_path), **options)
    )
    caches = []

    def run_fresh(command: list[str], log: Path, *args: object, **kwargs: Any) -> object:
        log.with_suffix("").mkdir(parents=True)  # the run's outputs, as a real run leaves them
        caches.append(kwargs["env"]["TORCHINDUCTOR_CACHE_DIR"])
        return type("Failed", (), {"wall_s": 0.0, "failure": lambda self: "not run"})()

    monkeypatch.setattr(scaling.harness, "run_fresh", run_fresh)
    scaling.measure("volt-ddp", plan)
    scaling.measure("volt-ddp", plan)  # the next round's
    assert [Path(c).name for c in caches] == ["cache-volt-ddp", "cache-volt-ddp-2"]


def test_gpus_1_runs_both_ddp_sides_in_a_world_of_one(
    scaling: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # DDP's host work on one GPU, no communication: what showed on one H200 that volt's and the
    # plain loop's DDP steps are bound by their host (2026-11-29).
    options = dict(batch_per_gpu=None, warmup=None, steps=None, timeout=60.0, probe_steps=3)
    options |= dict(runs=["plain-ddp", "volt-ddp"], largest=None, compile_cache="cold", extra=[])
    namespace = argparse.Namespace(
        tiny=True, probe_timeout=60.0, work=str(tmp_path), trace=None, bucket_mb=25.0, **options
    )
    with pytest.raises(SystemExit, match=r"--gpus 3, 2 GPU\(s\) visible: give 1 to 2"):
        scaling.make_plan(argparse.Namespace(**vars(namespace), gpus=3))
    plan = scaling.make_plan(argparse.Namespace(**vars(namespace), gpus=1))
    commands = commands_not_run(scaling, monkeypatch)
    records = [scaling.measure(run, plan) for run in ("plain-ddp", "volt-ddp")]
    assert [r["gpus"] for r in records] == [1, 1]
    plain, volt = commands
    assert plain[plain.index("--plain-child") + 1] == "1" and "--plain-ddp" in plain
    assert "trainer=ddp" in volt and "trainer.devices=1" in volt
    # --bucket-mb reaches both DDP sides: the plain loop composes it under trainer=ddp
    assert "trainer.strategy.bucket_cap_mb=25.0" in volt
    assert "trainer.strategy.bucket_cap_mb=25.0" in plain[plain.index("--overrides") :]
    # volt's DDP run beside the plain DDP loop of its world: not beside the loop without DDP,
    # nor beside a DDP loop of two GPUs from another file given to --report
    rate = {("plain-1", 1): 1000.0, ("plain-ddp", 2): 900.0, ("volt-ddp", 1): 450.0}
    assert scaling.throughput_row(run("volt-ddp", 1, 450.0, None), rate)[-1] == ""
    rate[("plain-ddp", 1)] = 500.0
    assert scaling.throughput_row(run("volt-ddp", 1, 450.0, None), rate)[-1] == "0.900"
    rounds = {("call", r): dict(rate) for r in (0, 1)}
    assert scaling.by_round(rounds)[-1] == (
        "- volt, `trainer=ddp` (a world of one) / plain, by round: 0.900, 0.900; median of 2: 0.900"
    )


@pytest.mark.parametrize(
    ("given", "bucket_mb"), [([], 100), (["trainer.strategy.bucket_cap_mb=25"], 25)]
)
def test_the_plain_ddp_loop_buckets_gradients_as_volts_ddp_config(
    scaling: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
    given: list[str],
    bucket_mb: int,
) -> None:
    wrapped: list[dict[str, Any]] = []

    class Recorded(scaling.DistributedDataParallel):  # type: ignore[name-defined,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            wrapped.append(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(scaling, "DistributedDataParallel", Recorded)
    monkeypatch.chdir(tmp_path)  # the corpus file prepare_data writes
    overrides = ["experiment=gpt_bytes_tiny", "data.block_size=64", "data.batch_size=2"]
    overrides += [f"paths.data_dir={tmp_path}", *given]  # given: as --bucket-mb gives it
    rendezvous = tmp_path / "rendezvous"
    # in this process: what the rank sets for itself is put back for the tests after this one
    threads, matmul = torch.get_num_threads(), torch.get_float32_matmul_precision()
    try:
        with torch.random.fork_rng():
            scaling.plain_rank(0, 1, True, overrides, 1, 1, str(rendezvous))
    finally:
        torch.set_num_threads(threads)
        torch.set_float32_matmul_precision(matmul)
    assert [w["bucket_cap_mb"] for w in wrapped] == [bucket_mb]
    assert '"tokens_per_s"' in capsys.readouterr().out


def test_each_volt_runs_windows_are_printed_apart_from_the_page(scaling: ModuleType) -> None:
    """A stall inside a run shows as one slow window; the plain loop is timed as one window."""
    records = [
        run("plain-ddp", 2, 800_000, None),
        run("volt-fsdp", 2, 700_000, 5.0) | {"window_tokens_per_s": [800_000.0, 600_000.0]},
        run("volt-ddp", 2, 780_000, 7.0) | {"window_tokens_per_s": [780_000.0]},
    ]
    assert scaling.window_lines(records) == [
        "",
        "Each volt run's windows, and how far the slowest fell below the fastest:",
        "- volt, `trainer=fsdp` on 2: 800,000, 600,000 tokens/s (25.0% apart)",
    ]
    assert "600,000" not in scaling.report(ABOUT, records)  # the page keeps its one table
    assert scaling.window_lines(RECORDS) == []
