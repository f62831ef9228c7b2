"""Several writers on one store (streams/app/shared_windows.py, WindowCloser's shared mode), without I/O."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from streams.app.metrics import WorkerMetrics
from streams.app.shared_windows import SharedProgress
from streams.app.window_closer import WindowCloser
from streams.settings import Settings, WindowConfig
from streams.store.aggregates_store import record_writer_progress, writer_progress
from streams.store.requests_store import fetch_window_records


class ProgressTable:
    def __init__(self) -> None:
        self.rows: dict[int, float] = {}
        self.calls: list[str] = []

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        self.calls.append(fn.__name__)
        if fn is record_writer_progress:
            self.rows.update(args[1])
            return None
        if fn is writer_progress:
            return dict(self.rows)
        if fn is fetch_window_records:
            return []
        return None


def test_progress_is_the_minimum_over_every_partition_and_unknown_until_all_reported() -> None:
    table = ProgressTable()
    clock = [0.0]
    a = SharedProgress(table.call, "db", "a", clock=lambda: clock[0])
    b = SharedProgress(table.call, "db", "b", clock=lambda: clock[0])
    assert asyncio.run(a.exchange({0: 5_000.0, 2: 7_000.0}, range(4))) is None  # 1 and 3 never reported
    assert asyncio.run(b.exchange({1: 6_000.0, 3: 9_000.0}, range(4))) == 5_000.0
    clock[0] = 0.5  # throttled: a does not read b's rows yet, and does not write
    writes = table.calls.count("record_writer_progress")
    assert asyncio.run(a.exchange({0: 8_000.0, 2: 8_000.0}, range(4))) is None
    assert table.calls.count("record_writer_progress") == writes
    clock[0] = 1.0
    assert asyncio.run(a.exchange({0: 8_000.0, 2: 8_000.0}, range(4))) == 6_000.0


def _closer(store: Callable[..., Any]) -> WindowCloser:
    settings = Settings(windows=WindowConfig(idle_close_s=1.0))
    return WindowCloser(settings, WorkerMetrics("writer", "w"), store, _publish, clock=lambda: 1_800_000_000.0)


async def _publish(topic: str, key: bytes, value: bytes) -> None:
    return None


def test_a_writer_between_assignments_closes_nothing() -> None:
    table = ProgressTable()
    closer = _closer(table.call)
    closer.open = {1_799_990_000_000 // 60_000 * 60_000}
    closer.watermark = 1_800_000_000_000.0  # far past the window, as recovery may leave it
    closer.all_partitions = set(range(8))
    closer.request_partitions = []
    asyncio.run(closer.on_records([], polled_s=5.0))
    assert closer.closed == {} and len(closer.open) == 1


def test_a_non_owner_closes_nothing_and_the_owner_closes_once_every_partition_passed() -> None:
    table = ProgressTable()
    owner, other = _closer(table.call), _closer(table.call)
    ws = 1_799_990_000_000 // 60_000 * 60_000
    for closer, parts in ((owner, [0, 2]), (other, [1, 3])):
        closer.all_partitions = {0, 1, 2, 3}
        closer.request_partitions = parts
        closer.open = {ws}
        for p in parts:
            closer.source_watermarks.observe(0, p, 1_800_000_000_000.0)
    assert owner.is_owner() and not other.is_owner()
    asyncio.run(owner.on_records([], polled_s=0.0))
    assert owner.closed == {}  # partitions 1 and 3 have no progress yet
    asyncio.run(other.on_records([], polled_s=0.0))
    assert ws in other.closed and "fetch_window_records" not in table.calls  # the non-owner computes nothing
    owner.shared._last_exchange = None  # type: ignore[union-attr]  # read the table again now
    asyncio.run(owner.on_records([], polled_s=0.0))
    assert ws in owner.closed and "fetch_window_records" in table.calls


def test_a_writer_that_gains_the_lowest_partition_resumes_once_and_the_old_owner_stops_judging() -> None:
    table = ProgressTable()
    first, second = _closer(table.call), _closer(table.call)
    resumed: list[str] = []

    async def resume_second() -> None:
        resumed.append("second")

    second.ownership_hooks.append(resume_second)
    for closer, parts in ((first, [0, 1]), (second, [2, 3])):
        closer.all_partitions = {0, 1, 2, 3}
        closer.request_partitions = parts
        asyncio.run(closer.on_records([], polled_s=0.0))
    assert first.is_owner() and not second.is_owner() and resumed == []
    # A rebalance: partition 0 moves to the second writer.
    first.request_partitions, second.request_partitions = [1], [0, 2, 3]
    asyncio.run(first.on_records([], polled_s=0.0))
    asyncio.run(second.on_records([], polled_s=0.0))
    assert not first.is_owner() and second.is_owner() and resumed == ["second"]
    asyncio.run(second.on_records([], polled_s=0.0))
    assert resumed == ["second"]  # once per handover, not per batch
