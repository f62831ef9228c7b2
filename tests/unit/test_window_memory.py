"""The writer's copy of open windows (streams/app/window_memory.py) and the background close that uses it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson

from streams.app.metrics import WorkerMetrics
from streams.app.window_closer import WindowCloser
from streams.app.window_memory import WindowMemory, decode_held
from streams.core.windows import aggregate_window
from streams.settings import Settings, WindowConfig
from streams.store.aggregates_store import (
    dead_letter_counts,
    insert_window_aggregates,
    stored_window_series,
    window_fingerprint,
)
from streams.store.requests_store import fetch_window_records, store_form
from tests.support.records import make_record

WS = 1_800_000_000_000 - 7_200_000  # a window start two hours before NOW_S (a multiple of 60 s)
NOW_S = 1_800_000_000.0


def _records(n: int, ws: int = WS) -> list[dict[str, Any]]:
    return [
        make_record(
            f"r-{i}",
            started_at=ws + 10.4 * i + 0.3,  # fractions of a millisecond: the store rounds them
            first_token_at=ws + 10.4 * i + 900.7,
            ttft_ms=900.4 + i % 37,
            retrieval_ms=200.0 + i % 11,
            llm_ttft_ms=600.0,
        )
        for i in range(n)
    ]


def test_the_bytes_a_record_was_read_from_are_held_as_they_are() -> None:
    memory = WindowMemory(max_records=100)
    read, merged = _records(2)
    wire = orjson.dumps(read)
    stale_id = {id(merged): ({**merged}, b"not this one")}  # another object under the id: encoded again
    memory.add([read, merged], {id(read): (read, wire), **stale_id})
    blobs = memory.take(WS)
    assert blobs is not None and wire in blobs and any(b is wire for b in blobs)
    assert b"not this one" not in blobs
    assert decode_held(blobs) == [store_form(read), store_form(merged)]


def test_the_highest_record_version_wins_like_final_and_the_fingerprint_follows() -> None:
    memory = WindowMemory(max_records=100)
    old = make_record("r-1", started_at=WS + 5.0, status="timed_out", event_count=2)
    new = make_record("r-1", started_at=WS + 5.0, event_count=5)
    assert new["record_version"] > old["record_version"]
    memory.add([new, old])  # an older version arriving later changes nothing
    assert memory.fingerprint(WS) == (1, new["record_version"])
    other_tenant = make_record("r-1", started_at=WS + 5.0, tenant_id="globex")
    memory.add([other_tenant])
    assert memory.fingerprint(WS) == (2, new["record_version"] + other_tenant["record_version"])
    blobs = memory.take(WS)
    assert blobs is not None and sorted(r["tenant_id"] for r in decode_held(blobs)) == ["acme", "globex"]
    assert memory.fingerprint(WS) is None and memory.held_records == 0


def test_past_the_cap_a_window_spills_and_is_not_held() -> None:
    memory = WindowMemory(max_records=3)
    memory.add(_records(5))
    assert memory.fingerprint(WS) is None and memory.take(WS) is None
    memory.add(_records(2, ws=WS + 60_000))
    assert memory.fingerprint(WS + 60_000) is not None
    assert WindowMemory(max_records=0).fingerprint(WS) is None


def test_decoded_copies_equal_what_the_store_reads_back() -> None:
    records = _records(50)
    memory = WindowMemory(max_records=1_000)
    memory.add(records)
    blobs = memory.take(WS)
    assert blobs is not None
    decoded = sorted(decode_held(blobs), key=lambda r: r["request_id"])
    assert decoded == sorted((store_form(r) for r in records), key=lambda r: r["request_id"])
    assert decoded[1]["started_at"] == round(records[1]["started_at"])  # DateTime64(3): whole milliseconds


class FakeStore:
    """Holds the records the writer inserted; counts the reads a close makes."""

    def __init__(self, records: list[dict[str, Any]], delay_s: float = 0.0) -> None:
        self.records = [store_form(r) for r in records]
        self.calls: list[str] = []
        self.aggregates: list[dict[str, list[dict[str, Any]]]] = []
        self.delay_s = delay_s

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        self.calls.append(fn.__name__)
        await asyncio.sleep(self.delay_s)
        if fn is window_fingerprint:
            return len(self.records), sum(r["record_version"] for r in self.records)
        if fn is fetch_window_records:
            return list(self.records)
        if fn is dead_letter_counts:
            return {}
        if fn is stored_window_series:
            return []
        if fn is insert_window_aggregates:
            self.aggregates.append(args[1])
        return None


async def _publish(topic: str, key: bytes, value: bytes) -> None:
    return None


def _close_once(records: list[dict[str, Any]], store: FakeStore) -> WindowCloser:
    settings = Settings(windows=WindowConfig(idle_close_s=1.0))

    async def scenario() -> WindowCloser:
        closer = WindowCloser(
            settings, WorkerMetrics("writer", "w-1"), store.call, _publish, clock=lambda: NOW_S, background=True
        )
        await closer.on_records(records, polled_s=0.0)
        await closer.on_records([], polled_s=2.0)  # idle: the window is due, its close is queued
        assert store.aggregates == []  # the batch returned before the close ran
        await closer.stop()
        return closer

    return asyncio.run(scenario())


def test_a_background_close_from_the_copy_equals_one_from_the_store() -> None:
    records = _records(300)
    from_copy = FakeStore(records)
    _close_once(records, from_copy)
    assert "fetch_window_records" not in from_copy.calls
    from_store = FakeStore(records[:-1])  # the store holds something else: the copy is not used
    _close_once(records, from_store)
    assert "fetch_window_records" in from_store.calls
    expected = aggregate_window([store_form(r) for r in records], WS, Settings(windows=WindowConfig(idle_close_s=1.0)))
    assert from_copy.aggregates[0]["stage_windows"] == expected.stage_windows
    assert from_copy.aggregates[0]["window_health"] == expected.window_health


def test_a_failing_background_close_stops_the_next_batch() -> None:
    settings = Settings(windows=WindowConfig(idle_close_s=1.0))

    async def broken(fn: Callable[..., Any], *args: Any) -> Any:
        raise ValueError("a bug")

    async def scenario() -> None:
        closer = WindowCloser(
            settings, WorkerMetrics("writer", "w-1"), broken, _publish, clock=lambda: NOW_S, background=True
        )
        await closer.on_records(_records(3), polled_s=0.0)
        await closer.on_records([], polled_s=2.0)
        try:
            await closer.drain()
        except RuntimeError as exc:
            assert isinstance(exc.__cause__, ValueError)
        else:
            raise AssertionError("the failure was swallowed")
        await closer.stop()

    asyncio.run(scenario())


def test_a_held_record_costs_about_its_serialised_size() -> None:
    """orjson's output keeps its whole write buffer allocated; the copy must keep only the bytes."""
    import tracemalloc

    records = _records(3_000)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        memory = WindowMemory(max_records=10_000)
        memory.add(records)
        per_record = (tracemalloc.get_traced_memory()[0] - before) / len(records)
    finally:
        tracemalloc.stop()
    assert per_record < 1_500, f"{per_record:.0f} B per held record"


def test_a_closed_window_a_request_left_is_computed_again() -> None:
    """Issue 27 item 6: a request whose start moved (request_start came late) into another window left its
    old, closed window stale until a restart. The writer now names the windows requests left (vacated)."""
    settings = Settings(windows=WindowConfig(idle_close_s=1.0))
    store = FakeStore(_records(3))

    async def scenario() -> WindowCloser:
        closer = WindowCloser(
            settings, WorkerMetrics("writer", "w-1"), store.call, _publish, clock=lambda: NOW_S, background=True
        )
        await closer.on_records(_records(3), polled_s=0.0)
        await closer.on_records([], polled_s=2.0)  # idle: WS closes
        await closer.drain()
        assert closer.closed == {WS: 0}
        moved = make_record("r-0", started_at=WS + 60_000 + 5.0, late_events=1, event_count=6)
        store.records = [store_form(r) for r in _records(3)[1:]]  # FINAL: r-0 is no longer in WS
        await closer.on_records([moved], polled_s=0.0, vacated=[WS])
        await closer.drain()
        await closer.stop()
        return closer

    closer = asyncio.run(scenario())
    assert closer.closed[WS] == 1  # computed again, as an amendment
    of_ws = [a for a in store.aggregates if a["window_health"] and a["window_health"][0]["window_start"] == WS]
    assert len(of_ws) == 2
    assert sum(row["total"] for row in of_ws[-1]["window_health"]) == 2  # what the store holds for WS now
