"""streams.ports: loopback ports below the ephemeral range, never the same one twice in a process.

CI failed once because two workers started a moment apart were given the same metrics port by the
bind-to-0 trick, and the writer exited on EADDRINUSE (test_ingest_guard, writer and join both on 56559).
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest

from streams import ports

pytestmark = pytest.mark.net


@pytest.fixture(autouse=True)
def _fresh_allocator(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    held: deque[int] = deque()
    monkeypatch.setattr(ports, "_handed_out", set())
    monkeypatch.setattr(ports, "_next", None)
    monkeypatch.setattr(ports, "_held", held)
    monkeypatch.setattr(ports, "LOCK_DIR", tmp_path / "locks")
    yield
    for fd in held:
        os.close(fd)


def _range_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, low: int, high: int = 60999) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text(f"{low}\t{high}\n")
    monkeypatch.setattr(ports, "_RANGE_FILE", path)


def test_a_port_is_never_handed_out_twice_though_nobody_bound_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _range_file(tmp_path, monkeypatch, 32768)
    given = [ports.free_port() for _ in range(300)]
    assert len(set(given)) == 300


def test_ports_come_from_below_the_ephemeral_range_in_the_xdist_workers_own_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _range_file(tmp_path, monkeypatch, 32768)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    given = [ports.free_port() for _ in range(50)]
    assert all(13_000 <= p < 14_000 for p in given), given


def test_another_workers_block_does_not_overlap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _range_file(tmp_path, monkeypatch, 32768)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    first = {ports.free_port() for _ in range(20)}
    monkeypatch.setattr(ports, "_next", None)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    second = {ports.free_port() for _ in range(20)}
    assert all(p < 11_000 for p in first) and all(11_000 <= p < 12_000 for p in second)


def test_a_port_someone_listens_on_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _range_file(tmp_path, monkeypatch, 32768)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", _a_bindable_port_in(10_000, 11_000)))
        listener.listen()
        taken = listener.getsockname()[1]
        monkeypatch.setattr(ports, "_next", taken)
        assert ports.free_port() == taken + 1


def test_a_port_another_process_handed_out_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test and the demo it starts share an xdist worker's block: a port one of them handed out (and its
    process has not bound yet) is locked against the other. Another open file description of the lock file
    stands in for the other process (flock locks conflict between descriptions, not only processes)."""
    _range_file(tmp_path, monkeypatch, 32768)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    port = _a_bindable_port_in(10_000, 10_998)
    ports.LOCK_DIR.mkdir()
    other = os.open(ports.LOCK_DIR / str(port), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        monkeypatch.setattr(ports, "_next", port)
        assert ports.free_port() == port + 1
        monkeypatch.setattr(ports, "_next", port)
        assert ports.free_ports(2)[0] > port  # a run holding it is skipped whole
    finally:
        os.close(other)


def test_only_the_latest_ports_stay_reserved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _range_file(tmp_path, monkeypatch, 32768)
    monkeypatch.setattr(ports, "HELD", 5)
    given = [ports.free_port() for _ in range(8)]
    assert len(ports._held) == 5
    oldest = os.open(ports.LOCK_DIR / str(given[0]), os.O_RDWR)
    newest = os.open(ports.LOCK_DIR / str(given[-1]), os.O_RDWR)
    try:
        fcntl.flock(oldest, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released: takes the lock
        with pytest.raises(BlockingIOError):
            fcntl.flock(newest, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(oldest)
        os.close(newest)


def test_consecutive_ports_for_a_process_that_takes_port_and_port_plus_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _range_file(tmp_path, monkeypatch, 32768)
    first, second = ports.free_ports(2)
    assert second == first + 1
    assert ports.free_port() not in (first, second)


def test_without_room_below_the_ephemeral_range_the_kernel_chooses_still_never_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _range_file(tmp_path, monkeypatch, 1024)
    given = [ports.free_port() for _ in range(100)]
    assert len(set(given)) == 100
    assert all(p >= 1024 for p in given)
    first, second = ports.free_ports(2)
    assert second == first + 1 and first not in given


def _a_bindable_port_in(first: int, end: int) -> int:
    for port in range(first, end - 1):
        if ports.port_is_free("127.0.0.1", port) and ports.port_is_free("127.0.0.1", port + 1):
            return port
    raise RuntimeError("no bindable port")
