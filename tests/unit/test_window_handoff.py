"""A window's held records reach the close process through a spooled in-memory file
(streams/app/window_handoff.py), whole and in order, and the close falls back to pickling them when the
close process cannot open it."""

from __future__ import annotations

import multiprocessing
import os
from array import array
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

from streams.app import window_closer, window_handoff
from streams.app.window_handoff import Spooled, read_spooled, release, spool
from tests.unit.test_window_memory import WS, FakeStore, _close_once, _records


def _read_in_child(spooled: Spooled) -> list[bytes]:
    return [bytes(blob) for blob in read_spooled(spooled)]


def test_spooled_records_reach_a_spawned_process_whole_and_in_order() -> None:
    blobs = [b"", b"{}", *(os.urandom(i % 700) for i in range(3 * window_handoff.SPOOL_CHUNK + 5))]
    spooled = spool(blobs)
    assert spooled is not None, "this host has memfd_create and /proc"
    fd, handle = spooled
    try:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            assert pool.submit(_read_in_child, handle).result(timeout=60) == blobs
    finally:
        release(fd)
    with pytest.raises(OSError):  # closed: the file is gone with its last descriptor
        os.fstat(fd)


def test_lengths_that_do_not_match_the_file_are_refused() -> None:
    spooled = spool([b"abc", b"de"])
    assert spooled is not None
    fd, handle = spooled
    try:
        with pytest.raises(ValueError, match="add up"):
            read_spooled(Spooled(handle.path, array("q", [3])))
    finally:
        release(fd)


def test_a_close_process_that_cannot_open_the_file_gets_the_records_pickled(monkeypatch: Any) -> None:
    def unreachable(blobs: list[bytes]) -> tuple[int, Spooled]:
        fd, handle = spool(blobs) or (-1, None)
        return fd, Spooled("/proc/0/fd/0", handle.lengths)  # type: ignore[union-attr]

    monkeypatch.setattr(window_closer, "spool", unreachable)
    records = _records(200)
    store = FakeStore(records)
    closer = _close_once(records, store)
    assert closer._spool is False
    assert "fetch_window_records" not in store.calls  # still closed from the copy
    assert store.aggregates and store.aggregates[0]["window_health"][0]["window_start"] == WS


def test_spool_steps_aside_without_memfd(monkeypatch: Any) -> None:
    monkeypatch.delattr(os, "memfd_create")
    assert spool([b"x"]) is None


def test_spool_steps_aside_when_the_host_refuses_the_file(monkeypatch: Any) -> None:
    def refused(name: str, flags: int = 0) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "memfd_create", refused)
    assert spool([b"x"]) is None
