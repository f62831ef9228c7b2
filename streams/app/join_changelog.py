"""Restore the join's open requests from its compacted changelog (``join.consumer: batch``).

The changelog holds one value per request id: its packed :class:`streams.core.join_state.PendingRequest`,
or a tombstone once it was forgotten. Restoring reads each owned changelog partition from its start to
the end offset seen when restoring began, keeps the latest value per key and loads the live ones into
the core. It runs before the partition's stage events are fetched, so no event is folded on missing state.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.kafka.topics import kafka_client_kwargs
from streams.settings import Settings

log = logging.getLogger("ttft.join")

#: How long one restore may take before the worker gives up (the group then moves the partitions on).
RESTORE_TIMEOUT_S = 120.0


class Restorable(Protocol):
    """A core whose state is one changelog value per key (the join's requests, the OTLP traces)."""

    def restore(self, key: str, packed: bytes, partition: int) -> object: ...


async def restore_partitions(settings: Settings, topic: str, partitions: list[int], core: Restorable) -> int:
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
