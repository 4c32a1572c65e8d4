import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from volt.runs import records
from volt.runs.records import installed_packages


def test_installed_packages_are_what_importlib_metadata_reads() -> None:
    parsed = sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions())
    assert installed_packages() == parsed


def test_installed_packages_read_the_header_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = tmp_path / "fake_pkg-1.2.dist-info"
    info.mkdir()
    # A field folded onto a second line, which looks like a field of its own, before the name.
    header = "Metadata-Version: 1.0\nSummary: a summary\n        Name: folded\n"
    header += "Name: fake-pkg\nVersion:1.2\nClassifier: A :: B\n"
    # The description begins after the first blank line, and may hold lines that look like fields.
    (info / "METADATA").write_text(header + "\nName: not-this\nVersion: 9.9\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert installed_packages() == ["fake-pkg==1.2"]
    assert [f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions()] == [
        "fake-pkg==1.2"
    ]  # as the email parser reads the whole file


def test_the_uncommitted_diff_is_kept_byte_for_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=volt", "-c", "user.email=volt@example.com"]
    (repo / "notes.txt").write_bytes(b"plain\n")
    for command in (["init", "-q"], ["add", "notes.txt"], ["commit", "-qm", "notes"]):
        subprocess.run([*git, *command], check=True)
    # UTF-8, which an ASCII locale cannot decode, and a Latin-1 byte, which UTF-8 cannot.
    (repo / "notes.txt").write_bytes("plain \u2014 caf\u00e9\n".encode() + b"caf\xe9\n")
    monkeypatch.setattr(records, "PROJECT_ROOT", repo)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with records.run_record(run_dir):
        pass
    diff = subprocess.run([*git, "diff", "HEAD"], capture_output=True, check=True).stdout
    assert b"caf\xe9" in diff
    assert (run_dir / "git.diff").read_bytes() == diff
