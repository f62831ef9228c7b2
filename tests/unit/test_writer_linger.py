"""The writer's linger (issue 13): records arriving together are inserted and committed once, in order."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import TopicPartition

from streams.app.metrics import WorkerMetrics
from streams.app.writer import StoreWriter
from streams.settings import Settings
from tests.unit.test_writer_stats import NOW_S, REQUESTS, FakeClient, FakeConsumer, message, request


class RecordingClient(FakeClient):
    """Counts the inserts into ``requests`` (not only their rows)."""

    def __init__(self) -> None:
        super().__init__()
        self.request_inserts = 0

    def insert(self, table: str, data: list[list[Any]], column_oriented: bool = False, **kw: Any) -> None:
        self.request_inserts += table == "requests"
        super().insert(table, data, column_oriented, **kw)


def _run(linger_ms: int) -> tuple[RecordingClient, FakeConsumer, list[int]]:
    writer = StoreWriter(Settings(), WorkerMetrics("writer", "w-1"), stats_interval_s=None, linger_ms=linger_ms)
    client = writer.client = RecordingClient()
    p0, p1 = TopicPartition(REQUESTS, 0), TopicPartition(REQUESTS, 1)
    at = NOW_S * 1000
    consumer = FakeConsumer(
        [
            {p0: [message(0, request("r-1", at)), message(1, request("r-2", at))]},
            {p1: [message(0, request("r-3", at))]},
            {p0: [message(2, request("r-4", at))]},
        ],
        idle_s=0.01,
    )
    writer.consumer = consumer  # type: ignore[assignment]
    seen: list[int] = []

    async def on_batch(records: list[dict[str, Any]]) -> None:
        seen.append(len(records))
        if sum(seen) == 4:
            await writer.stop()

    writer.hooks.append(on_batch)
    asyncio.run(asyncio.wait_for(writer.run(), timeout=10))
    return client, consumer, seen


def test_records_arriving_within_the_linger_make_one_insert_and_one_commit() -> None:
    client, consumer, seen = _run(linger_ms=5_000)
    assert client.inserted == {"requests": 4} and client.request_inserts == 1 and seen == [4]
    p0, p1 = TopicPartition(REQUESTS, 0), TopicPartition(REQUESTS, 1)
    assert consumer.commits == [{p0: 3, p1: 1}]  # the last offset of each partition, after the insert


def test_without_a_linger_each_poll_is_its_own_batch() -> None:
    client, consumer, seen = _run(linger_ms=0)
    assert client.request_inserts == 3 and seen == [2, 1, 1] and len(consumer.commits) == 3


def test_the_linger_ends_when_a_poll_comes_back_empty() -> None:
    writer = StoreWriter(Settings(), WorkerMetrics("writer", "w-1"), stats_interval_s=None, linger_ms=60_000)
    writer.client = RecordingClient()
    tp = TopicPartition(REQUESTS, 0)
    consumer = FakeConsumer([{tp: [message(0, request("r-1", NOW_S * 1000))]}], idle_s=0.0)
    writer.consumer = consumer  # type: ignore[assignment]
    writer.hooks.append(lambda records: writer.stop() if records else None)
    asyncio.run(asyncio.wait_for(writer.run(), timeout=10))  # not 60 s: the empty poll ended the linger
    assert consumer.commits == [{tp: 1}]
