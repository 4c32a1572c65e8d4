"""Data tests never reach the network: any attempt to connect fails the test that made it."""

import socket
from collections.abc import Callable, Iterator
from types import SimpleNamespace

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

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    yield
    assert not attempts, f"a test tried to reach the network: {attempts}"


@pytest.fixture
def fake_trainer() -> Callable[..., SimpleNamespace]:
    """fake_trainer(world_size=2, device="cpu"): the two things a data module asks its trainer."""

    def make(world_size: int = 1, device: str = "cpu") -> SimpleNamespace:
        strategy = SimpleNamespace(root_device=torch.device(device))
        return SimpleNamespace(world_size=world_size, strategy=strategy)

    return make
