from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import orjson
from aiokafka import TopicPartition

from schemas.dead_letter import make_dead_letter
from streams.app.metrics import WorkerMetrics
from streams.app.window_closer import WindowCloser
from streams.app.writer import StoreWriter
from streams.settings import Settings, WindowConfig
from streams.store.aggregates_store import dead_letter_counts, stored_window_series
from streams.store.requests_store import fetch_window_records
from tests.support.records import make_record

IDLE_CLOSE_S = 30.0
POLL_S = 0.25  # an empty poll waits batch_timeout_ms (a binary fraction: the sums stay exact)
NOW_S = 1_800_000_000.0
HISTORICAL_MS = (NOW_S - 7_200) * 1000  # two hours ago: only the wall-clock fallback can close its window


class Clock:
    def __init__(self, now: float = NOW_S) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def fake_store_call(fn: Callable[..., Any], *args: Any) -> Any:
    if fn is fetch_window_records:
        return []
    if fn is dead_letter_counts:
        return {}
    if fn is stored_window_series:
        return []
    return None


async def ignore_publish(topic: str, key: bytes, value: bytes) -> None:
    return None


def settings() -> Settings:
    return Settings(windows=WindowConfig(idle_close_s=IDLE_CLOSE_S))


def closer_at(clock: Clock) -> WindowCloser:
    return WindowCloser(settings(), WorkerMetrics("writer", "w-1"), fake_store_call, ignore_publish, clock=clock)


def record(request_id: str, started_at: float = HISTORICAL_MS) -> dict[str, Any]:
    return make_record(request_id, started_at=started_at)


def empty_polls(closer: WindowCloser, clock: Clock, seconds: float) -> None:
    for _ in range(round(seconds / POLL_S)):
        clock.now += POLL_S
        asyncio.run(closer.on_records([], polled_s=POLL_S))


def test_a_long_store_outage_followed_by_records_is_not_idleness() -> None:
    clock = Clock()
    closer = closer_at(clock)
    asyncio.run(closer.on_records([record("r-1")], polled_s=0.01))
    # A batch of dead letters only, polled at once, whose insert waited out an hour of store outage.
    clock.now += 3_600
    asyncio.run(closer.on_records([], polled_s=0.0))
    # Then the join's backlog comes through.
    clock.now += 1
    asyncio.run(closer.on_records([record("r-2")], polled_s=0.0))
    assert closer.watermark is None and closer.closed == {} and len(closer.open) == 1


def test_empty_polls_for_idle_close_s_still_close_on_the_wall_clock() -> None:
    clock = Clock()
    closer = closer_at(clock)
    asyncio.run(closer.on_records([record("r-1")], polled_s=0.01))
    empty_polls(closer, clock, IDLE_CLOSE_S - 1)
    assert closer.closed == {}
    empty_polls(closer, clock, 1)
    settle_ms = 30_000 + 2_000 + 2 * 1_000  # join timeout + grace + 2 idle ticks (defaults)
    assert closer.watermark == clock.now * 1000 - settle_ms
    assert list(closer.closed) == [int(HISTORICAL_MS // 60_000 * 60_000)] and closer.open == set()
    assert closer.metrics.registry.get_sample_value("ttft_windows_closed_total") == 1


def test_records_restart_the_idle_time_and_store_time_between_polls_never_adds_to_it() -> None:
    clock = Clock()
    closer = closer_at(clock)
    asyncio.run(closer.on_records([record("r-1")], polled_s=0.01))
    empty_polls(closer, clock, IDLE_CLOSE_S - 1)
    asyncio.run(closer.on_records([record("r-2")], polled_s=0.05))
    empty_polls(closer, clock, IDLE_CLOSE_S / 2)
    clock.now += 600  # e.g. a window computation retried through a store outage
    asyncio.run(closer.on_records([], polled_s=0.0))
    empty_polls(closer, clock, IDLE_CLOSE_S / 2 - 1)
    assert closer.closed == {}
    empty_polls(closer, clock, 1)
    assert len(closer.closed) == 1


# --- through the writer: only the time spent waiting in polls reaches the closer --------------------------


class OutageClient:
    """``insert`` that fails once on dead letters after an hour of (fake) time, then works."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.failed = False

    def insert(self, table: str, rows: list[list[Any]], **_: Any) -> None:
        if table == "dead_letters" and not self.failed:
            self.failed = True
            self.clock.now += 3_600
            raise ConnectionError("ClickHouse is down")


class ScriptedConsumer:
    """Serves ``batches`` in order (each poll returns at once), then empty polls of ``POLL_S`` fake seconds."""

    def __init__(self, clock: Clock, batches: list[dict[TopicPartition, list[Any]]]) -> None:
        self.clock = clock
        self.batches = batches
        self.empty_polls = 0

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        if self.batches:
            return self.batches.pop(0)
        self.empty_polls += 1
        self.clock.now += POLL_S
        return {}

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        return None

    def highwater(self, tp: TopicPartition) -> int | None:
        return None

    def last_stable_offset(self, tp: TopicPartition) -> int | None:
        return None  # no transactions: the runner reads the high watermark

    def assignment(self) -> set[TopicPartition]:
        return set()

    async def stop(self) -> None:
        return None


def record_message(offset: int, value: dict[str, Any]) -> SimpleNamespace:
    return SimpleNamespace(offset=offset, key=value["request_id"].encode(), value=orjson.dumps(value))


def dead_letter_message(offset: int) -> SimpleNamespace:
    letter = make_dead_letter(
        "invalid_json",
        "not json",
        b"{",
        topic="ttft.stage-events",
        partition=0,
        offset=offset,
        kafka_timestamp_ms=None,
        max_original_bytes=64,
        received_at_ms=NOW_S * 1000,
    )
    return SimpleNamespace(offset=offset, key=None, value=letter.model_dump_json().encode())


def test_writer_blocked_on_the_store_does_not_close_windows_but_empty_polls_do() -> None:
    clock = Clock()
    requests, dead = TopicPartition("ttft.requests", 0), TopicPartition("ttft.dead-letter", 0)
    consumer = ScriptedConsumer(
        clock,
        [
            {requests: [record_message(0, record("r-1"))]},
            {dead: [dead_letter_message(0)]},  # its insert waits out the outage
            {requests: [record_message(1, record("r-2"))]},
        ],
    )
    writer = StoreWriter(settings(), WorkerMetrics("writer", "w-1"), stats_interval_s=None, clock=clock)
    writer.client = OutageClient(clock)
    writer.consumer = consumer  # type: ignore[assignment]
    closer = closer_at(clock)
    seen: list[tuple[int, float, bool]] = []

    async def on_batch(records: list[dict[str, Any]]) -> None:  # as writer_hooks.install_hooks wires it
        await closer.on_records(records, polled_s=writer.last_poll_s)
        seen.append((len(records), writer.last_poll_s, bool(closer.closed)))
        if closer.closed or consumer.empty_polls > 2 * IDLE_CLOSE_S / POLL_S:
            await writer.stop()

    writer.hooks.append(on_batch)
    asyncio.run(asyncio.wait_for(writer.run(), timeout=30))
    assert writer.metrics.registry.get_sample_value("ttft_insert_failures_total") == 1
    assert seen[:3] == [(1, 0.0, False), (0, 0.0, False), (1, 0.0, False)]  # the outage hour closed nothing
    assert len(closer.closed) == 1  # ...and empty polls did, after idle_close_s of them
    assert consumer.empty_polls == round(IDLE_CLOSE_S / POLL_S)


def test_time_the_broker_did_not_answer_restarts_the_idle_time() -> None:
    """A broker outage longer than idle_close_s is not silence: the empty polls it made restart the idle
    time (what the join emits meanwhile is on its way), so windows close idle_close_s after the broker
    answers again, never on the wall clock during the outage."""
    clock = Clock()
    closer = closer_at(clock)
    asyncio.run(closer.on_records([record("r-1")], polled_s=0.01))
    empty_polls(closer, clock, IDLE_CLOSE_S / 2)
    for _ in range(round(2 * IDLE_CLOSE_S / POLL_S)):  # an outage of twice idle_close_s
        clock.now += POLL_S
        asyncio.run(closer.on_records([], polled_s=POLL_S, answered=False))
    assert closer.closed == {} and closer.watermark is None
    empty_polls(closer, clock, IDLE_CLOSE_S - 1)
    assert closer.closed == {}
    empty_polls(closer, clock, 1)
    assert len(closer.closed) == 1


class OutageConsumer(ScriptedConsumer):
    """Owns one partition; the broker stops answering its fetches after ``answered`` empty polls and for
    ``unanswered`` more (aiokafka's last_poll_timestamp goes stale), then answers again."""

    def __init__(self, clock: Clock, batches: list[dict[TopicPartition, list[Any]]], answered: int, unanswered: int):
        super().__init__(clock, batches)
        self.outage = range(answered + 1, answered + unanswered + 1)

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition("ttft.requests", 0)}

    def last_poll_timestamp(self, tp: TopicPartition) -> int:
        stale_s = 60.0 if self.empty_polls in self.outage else 0.0
        return int((time.time() - stale_s) * 1000)


def test_the_writer_tells_the_closer_when_the_broker_did_not_answer() -> None:
    clock = Clock()
    answered, unanswered = round(IDLE_CLOSE_S / 2 / POLL_S), round(2 * IDLE_CLOSE_S / POLL_S)
    requests = TopicPartition("ttft.requests", 0)
    consumer = OutageConsumer(clock, [{requests: [record_message(0, record("r-1"))]}], answered, unanswered)
    writer = StoreWriter(settings(), WorkerMetrics("writer", "w-1"), stats_interval_s=None, clock=clock)
    writer.client = OutageClient(clock)
    writer.consumer = consumer  # type: ignore[assignment]
    closer = closer_at(clock)

    async def on_batch(records: list[dict[str, Any]]) -> None:  # as writer_hooks.install_hooks wires it
        await closer.on_records(records, polled_s=writer.last_poll_s, answered=writer.last_poll_answered)
        if closer.closed or consumer.empty_polls > 4 * IDLE_CLOSE_S / POLL_S:
            await writer.stop()

    writer.hooks.append(on_batch)
    asyncio.run(asyncio.wait_for(writer.run(), timeout=30))
    assert len(closer.closed) == 1
    # closed idle_close_s of answered polls after the outage, not idle_close_s after the last record
    assert consumer.empty_polls == answered + unanswered + round(IDLE_CLOSE_S / POLL_S)
