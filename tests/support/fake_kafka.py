"""In-memory stand-ins for aiokafka's producer and group consumer, shared by the runner's unit suites.

They log what reaches the broker in order (``produce <topic>``, ``commit``), so a test can check the
runner's durability order: outputs, then state, then offsets.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import TopicPartition


class FakeBatch:
    def __init__(self) -> None:
        self.items: list[tuple[bytes | None, bytes | None]] = []

    def append(self, *, key: bytes | None, value: bytes | None, timestamp: Any) -> object:
        self.items.append((key, value))
        return object()

    def record_count(self) -> int:
        return len(self.items)


class FakeProducer:
    """Acknowledges every batch at once, or fails every batch for ``fail_topic``."""

    def __init__(self, fail_topic: str | None = None) -> None:
        self.fail_topic = fail_topic
        self.sent: list[tuple[str, int, list[tuple[bytes | None, bytes | None]]]] = []
        self.log: list[str] = []

    def create_batch(self) -> FakeBatch:
        return FakeBatch()

    async def send_batch(self, batch: FakeBatch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if topic == self.fail_topic:
            fut.set_exception(ConnectionError("broker gone"))
        else:
            self.sent.append((topic, partition, batch.items))
            self.log.append(f"produce {topic}")
            fut.set_result(None)
        return fut

    def values(self, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
        """(partition, key, value) of everything produced to ``topic``, in order."""
        return [(p, k, v) for t, p, items in self.sent if t == topic for k, v in items]


class FakeConsumer:
    """A group consumer that owns every partition of ``topic``; records commits, seeks and pauses."""

    def __init__(self, log: list[str], topic: str, partitions: int = 8) -> None:
        self.log = log
        self.topic = topic
        self.partitions = partitions
        self.commits: list[dict[TopicPartition, int]] = []
        self.seeks: list[tuple[TopicPartition, int]] = []
        self.paused: set[TopicPartition] = set()

    def highwater(self, tp: TopicPartition) -> int | None:
        return None

    def last_poll_timestamp(self, tp: TopicPartition) -> int | None:
        return None

    def last_stable_offset(self, tp: TopicPartition) -> int | None:
        return None  # no transactions: the runner reads the high watermark

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(self.topic, p) for p in range(self.partitions)}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))

    def pause(self, *tps: TopicPartition) -> None:
        self.paused |= set(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.paused -= set(tps)

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.commits.append(dict(offsets))
        self.log.append("commit")

    async def stop(self) -> None:
        return None
