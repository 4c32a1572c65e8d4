"""benchmarks/harness.py: what every benchmark's sides run through, on small real processes."""

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def harness(load_benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return load_benchmark("harness")


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_side_hands_its_result_over_in_its_log(harness: ModuleType, tmp_path: Path) -> None:
    code = f"import sys; print('noise'); print({harness.result_line({'x': 1})!r})"
    code += "; print('warning', file=sys.stderr)"
    done = harness.run_fresh(python(code), tmp_path / "logs" / "a.log", 60, cwd=tmp_path)
    assert (done.status, done.failure(), done.result()) == (0, None, {"x": 1})
    assert done.text().splitlines()[0] == "noise" and "warning" in done.text()
    assert done.wall_s > 0 and done.cpu_s > 0  # a fresh interpreter's start, at least
    assert done.check(["a"]) is done


def test_a_failed_side_says_why_from_its_log(harness: ModuleType, tmp_path: Path) -> None:
    code = "print('\\n'.join(map(str, range(30)))); raise SystemExit(3)"
    done = harness.run_fresh(python(code), tmp_path / "b.log", cwd=tmp_path)
    assert done.status == 3 and done.result() is None
    assert done.failure() == "exit status 3; the end of its log:\n    " + "\n    ".join(
        map(str, range(15, 30))
    )
    with pytest.raises(RuntimeError, match=r"^b-side: exit status 3;(.|\n)*b\.log\)$"):
        done.check(["b-side"])
    oom = harness.run_fresh(python("print('CUDA out of memory.'); exit(1)"), tmp_path / "c.log",
                            cwd=tmp_path)  # fmt: skip
    assert oom.failure() == "out of memory"


def test_a_side_past_its_timeout_ends_with_all_it_started(
    harness: ModuleType, tmp_path: Path
) -> None:
    pid_file = tmp_path / "grandchild.pid"
    grandchild = "import subprocess, sys, time; "
    grandchild += "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    grandchild += f"open({str(pid_file)!r}, 'w').write(str(p.pid)); print('started', flush=True); "
    grandchild += "time.sleep(60)"
    seen: list[str] = []
    log = tmp_path / "d.log"
    started = time.perf_counter()
    done = harness.run_fresh(
        python(grandchild), log, 3, cwd=tmp_path, grace_s=1, watch=lambda: seen.append(log.name)
    )
    assert time.perf_counter() - started < 20
    assert done.status is None and done.failure() == "timed out after 3 s"
    assert len(seen) >= 4  # every half second while it ran
    pid = int(pid_file.read_text())
    for _ in range(50):  # the grandchild is killed with its group (a zombie till it is reaped)
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"pid {pid}, started by the side, outlived it")


def test_windows_read_the_clock_after_the_warm_up_and_each_window(harness: ModuleType) -> None:
    syncs: list[int] = []
    windows = harness.Windows(2, 3, 2, lambda: syncs.append(len(syncs)))
    marked = [step for step in range(windows.total + 1) if windows.step_done(step)]
    assert marked == [2, 5, 8] and len(syncs) == 3 and windows.total == 8
    assert len(windows.seconds()) == 2 and all(s >= 0 for s in windows.seconds())
    assert windows.ms_per_step() == [1e3 * s / 3 for s in windows.seconds()]


def test_medians_and_spreads(harness: ModuleType) -> None:
    assert harness.spread([9.0, 10.0, 12.0]) == pytest.approx(0.3)
    assert harness.spread([0.0, 0.0]) == 0.0
    assert harness.summary([3.0, 1.0, 2.0]) == {
        "median": 2.0,
        "min": 1.0,
        "max": 3.0,
        "samples": [3.0, 1.0, 2.0],
    }


def test_results_are_saved_whole(harness: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    harness.save_json(path, {"rows": [1]})
    harness.save_json(path, {"rows": [1, 2]})
    assert json.loads(path.read_text()) == {"rows": [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no partial file left


def test_a_markdown_table_aligns_each_column(harness: ModuleType) -> None:
    assert harness.markdown_table(["a", "b"], "lr", [["x", "1"], ["y", ""]]) == [
        "| a | b |",
        "| --- | ---: |",
        "| x | 1 |",
        "| y |  |",
    ]


def test_a_page_gets_its_table_between_its_markers(harness: ModuleType, tmp_path: Path) -> None:
    page = harness.Page(tmp_path / "page.md", "<!-- t:begin -->", "<!-- t:end -->")
    page.path.write_text("# p\nbefore\n<!-- t:begin -->\nold\n<!-- t:end -->\nafter\n")
    page.check("bench")
    page.write("| new |")
    page.write("| newer |")
    assert (
        page.path.read_text() == "# p\nbefore\n<!-- t:begin -->\n| newer |\n<!-- t:end -->\nafter\n"
    )
    page.path.write_text("<!-- t:end -->\n<!-- t:begin -->\n")  # the wrong way round
    with pytest.raises(SystemExit, match=r"^bench: .*page\.md: no <!-- t:begin --> \.\.\. "):
        page.check("bench")


def test_a_log_is_followed_line_by_line_while_its_side_runs(
    harness: ModuleType, tmp_path: Path
) -> None:
    code = "import sys, time; print('one', flush=True); print('t', end='', flush=True)"
    code += "; time.sleep(1.5); print('wo\\n\\nthree', flush=True); time.sleep(1)"
    log, seen = tmp_path / "e.log", list[str]()
    tail = harness.LogTail(log, seen.append)
    harness.run_fresh(python(code), log, 30, cwd=tmp_path, watch=tail)
    assert seen == ["one", "two", "", "three"]  # shown while it ran; "t" waited for its end
    tail()
    assert len(seen) == 4
    assert (harness.PROJECT / "benchmarks" / "harness.py").is_file()


def test_a_plain_step_trains_volts_net_on_its_own_batches(harness: ModuleType) -> None:
    import torch

    from volt.build import build_datamodule, build_model

    cfg = harness.compose(["model.net.hidden_sizes=[8]", "data.num_workers=0"])
    assert cfg.trainer.max_epochs == 20 and cfg.model.net.hidden_sizes == [8]
    device = torch.device("cpu")
    harness.synchronize(device)  # nothing to wait for on the CPU
    assert harness.device_name() == "CPU" or torch.cuda.is_available()
    datamodule = build_datamodule(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    datamodule.trainer = harness.trainer_stand_in(device)  # as volt's batches ask of a trainer
    x, y = next(iter(datamodule.train_dataloader()))
    model = build_model(cfg.model, datamodule, cfg.task.from_data)
    optimizer = torch.optim.SGD(model.net.parameters(), lr=0.1)
    step = harness.plain_step(model.net, optimizer, device, "bf16-mixed", 0.1, clip=1e-3)
    before = [p.detach().clone() for p in model.net.parameters()]
    step(x, y)
    after = list(model.net.parameters())
    moved = [(p - b).abs().max().item() for p, b in zip(after, before, strict=True)]
    assert 0 < max(moved) <= 0.1 * 1e-3 + 1e-6  # a step of lr x the clipped gradient, at most
