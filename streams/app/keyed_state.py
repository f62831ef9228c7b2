"""What the join's and the OTLP mapping's folds share: a core whose state is one changelog value per key.

Both keep their open work (requests, traces) in a core that marks what it touched as dirty and can restore
and drop it by partition; :class:`KeyedStateFold` turns that into the runner's ``take_dirty``, ``restore``
and ``revoke`` (:class:`streams.kafka.batches.BatchFold`).

Restoring reads each newly owned changelog partition from its start to the end offset seen when restoring
began, keeps the latest value per key and loads the live ones into the core. It runs before the
partition's input is fetched, so nothing is folded on missing state.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.app.metrics import WorkerMetrics
from streams.kafka.batches import Outputs
from streams.kafka.topics import kafka_client_kwargs
from streams.settings import Settings

log = logging.getLogger("ttft.state")


class KeyedCore(Protocol):
    """A core with one packed state per key on a partition (None: forgotten, a tombstone)."""

    def dirty(self) -> dict[str, tuple[int, bytes | None]]: ...

    def restore(self, key: str, packed: bytes, partition: int) -> object: ...

    def revoke(self, partitions: set[int]) -> object: ...


class KeyedStateFold:
    """The state half of a fold over a :class:`KeyedCore` whose changelog is ``changelog``."""

    core: KeyedCore

    def __init__(
        self, settings: Settings, metrics: WorkerMetrics, changelog: str, wall_clock: Callable[[], float] = time.time
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.changelog = changelog
        self._wall = wall_clock
        self.dead_letter_topic = settings.topic("dead-letter")

    def take_dirty(self) -> Outputs:
        """One changelog write per key touched since the last call, on its partition."""
        state: Outputs = defaultdict(list)
        by_partition: dict[int, list[tuple[bytes | None, bytes | None]]] = {}  # state's lists, by partition
        for key, (partition, packed) in self.core.dirty().items():
            writes = by_partition.get(partition)
            if writes is None:
                writes = by_partition[partition] = state[(self.changelog, partition)]
            writes.append((key.encode(), packed))
        return state

    async def restore(self, partitions: list[TopicPartition]) -> None:
        await restore_partitions(self.settings, self.changelog, self.state_partitions(partitions), self.core)

    def revoke(self, partitions: set[TopicPartition]) -> None:
        self.core.revoke(set(self.state_partitions(partitions)))

    def state_partitions(self, partitions: Iterable[TopicPartition]) -> list[int]:
        """The core's (and the changelog's) partitions of these input partitions: their numbers, unless a
        fold reads several topics into one core."""
        return sorted(tp.partition for tp in partitions)


#: How long one restore may take before the worker gives up (the group then moves the partitions on).
RESTORE_TIMEOUT_S = 120.0


async def restore_partitions(settings: Settings, topic: str, partitions: list[int], core: KeyedCore) -> int:
    """Load the latest state of every live key of ``partitions`` into ``core``; returns how many."""
    if not partitions:
        return 0
    tps = [TopicPartition(topic, p) for p in partitions]
    consumer = AIOKafkaConsumer(
        enable_auto_commit=False,
        max_partition_fetch_bytes=16 * 1_048_576,
        fetch_max_bytes=64 * 1_048_576,
        **kafka_client_kwargs(settings),
    )
    await consumer.start()
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    started = time.monotonic()
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        pending = {tp for tp in tps if ends[tp] > 0}
        while pending:
            if time.monotonic() - started > RESTORE_TIMEOUT_S:
                raise TimeoutError(f"restoring {topic} partitions {partitions} took over {RESTORE_TIMEOUT_S:.0f} s")
            batch = await consumer.getmany(*pending, timeout_ms=500, max_records=50_000)
            for tp, records in batch.items():
                for record in records:
                    if record.key is not None and record.offset < ends[tp]:
                        latest[record.key] = (tp.partition, record.value)
            for tp in list(pending):
                if await consumer.position(tp) >= ends[tp]:
                    pending.discard(tp)
    finally:
        await consumer.stop()
    restored = 0
    for key, (partition, packed) in latest.items():
        if packed is None:
            continue
        try:
            core.restore(key.decode(), packed, partition)
        except (ValueError, UnicodeDecodeError):
            log.warning("changelog partition %d: unreadable state for key %r; skipped", partition, key[:80])
            continue
        restored += 1
    log.info("restored %d requests from %s in %.1f s", restored, topic, time.monotonic() - started)
    return restored
