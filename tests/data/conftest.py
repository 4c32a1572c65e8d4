"""Data tests never reach the network: any attempt to connect fails the test that made it."""

import socket
from collections.abc import Callable, Iterator
from types import ModuleType, SimpleNamespace
from urllib.error import URLError

import pytest
import torch


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Refusing is not enough: ensure_files turns any error into "the download failed", which a
    # download test expects anyway. So also record the attempt and fail the test at teardown.
    attempts: list[str] = []

    def refuse(*args: object, **kwargs: object) -> None:
        attempts.append(repr(args))
        raise OSError("tests/data must not reach the network")

    connect = socket.socket.connect

    def refuse_but_local(self: socket.socket, address: object) -> None:
        # Unix sockets stay: DataLoader workers hand tensors over through them.
        if self.family == socket.AF_UNIX:
            return connect(self, address)
        return refuse(self, address)

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse_but_local)
    yield
    assert not attempts, f"a test tried to reach the network: {attempts}"


@pytest.fixture
def fake_trainer() -> Callable[..., SimpleNamespace]:
    """fake_trainer(world_size=2, device="cpu", global_rank=1): what data modules ask a trainer."""

    def make(world_size: int = 1, device: str = "cpu", global_rank: int = 0) -> SimpleNamespace:
        strategy = SimpleNamespace(root_device=torch.device(device))
        return SimpleNamespace(
            world_size=world_size,
            global_rank=global_rank,
            strategy=strategy,
            overfit_batches=0,
            current_epoch=0,
        )

    return make


@pytest.fixture
def failing_download(monkeypatch: pytest.MonkeyPatch) -> Callable[[ModuleType], list[str]]:
    """failing_download(torchvision.datasets.mnist) makes that module's archive download raise
    URLError, as offline; returns the list of URLs it was asked for."""

    def _patch(module: ModuleType) -> list[str]:
        urls: list[str] = []

        def offline(url: str, *args: object, **kwargs: object) -> None:
            urls.append(url)
            raise URLError("no network in tests")

        monkeypatch.setattr(module, "download_and_extract_archive", offline)
        return urls

    return _patch
