"""Reads stage-events partitions beside Faust's consumer: committed offsets, and offset ranges to repair.

The join's Faust consumer is the only thing that commits; this reader never joins the group and never
commits. It answers two questions the adapter needs to keep every event (see ``streams/core/cursors.py``):
where the group stands on a partition (its committed offset, or the log start when nothing is committed),
and what records lie in ``[start, end)`` of a partition.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streams.kafka.topics import kafka_client_kwargs
from streams.settings import Settings

#: Give up reading a range after this long (the caller then leaves the hole to the next repair).
READ_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One stage-events record as the join folds it (``timestamp`` in seconds, like a Faust message)."""

    key: bytes | None
    value: bytes | None
    topic: str
    partition: int
    offset: int
    timestamp: float | None


class PartitionReader:
    """A group-less aiokafka consumer and admin client on one topic."""

    def __init__(self, settings: Settings, topic: str, group_id: str) -> None:
        self.topic = topic
        self.group_id = group_id
        self._kwargs = kafka_client_kwargs(settings)
        self._consumer: AIOKafkaConsumer | None = None
        self._admin: AIOKafkaAdminClient | None = None

    async def _clients(self) -> tuple[AIOKafkaConsumer, AIOKafkaAdminClient]:
        if self._consumer is None:
            consumer = AIOKafkaConsumer(
                **self._kwargs, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest"
            )
            await consumer.start()
            self._consumer = consumer
        if self._admin is None:
            admin = AIOKafkaAdminClient(**self._kwargs)
            await admin.start()
            self._admin = admin
        return self._consumer, self._admin

    async def committed(self, partitions: list[int]) -> dict[int, int]:
        """The group's committed offset per partition; the log start offset where nothing is committed."""
        consumer, admin = await self._clients()
        tps = [TopicPartition(self.topic, p) for p in partitions]
        offsets = await admin.list_consumer_group_offsets(self.group_id, partitions=tps)
        result: dict[int, int] = {}
        missing: list[TopicPartition] = []
        for tp in tps:
            meta = offsets.get(tp)
            if meta is not None and meta.offset >= 0:
                result[tp.partition] = meta.offset
            else:
                missing.append(tp)
        ends = await consumer.end_offsets(tps)
        # Past the log end (the topic was recreated): the consumer resets to the start, and so do we.
        missing += [tp for tp in tps if tp.partition in result and result[tp.partition] > ends[tp]]
        if missing:
            starts = await consumer.beginning_offsets(missing)
            result.update({tp.partition: int(offset) for tp, offset in starts.items()})
        return result

    async def read(self, partition: int, start: int, end: int) -> list[RawRecord]:
        """The records with ``start <= offset < end`` (fewer if the range no longer exists or time runs out)."""
        consumer, _ = await self._clients()
        tp = TopicPartition(self.topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, start)
        records: list[RawRecord] = []
        deadline = time.monotonic() + READ_TIMEOUT_S
        while time.monotonic() < deadline:
            batch = await consumer.getmany(tp, timeout_ms=500, max_records=5_000)
            for record in batch.get(tp, []):
                if start <= record.offset < end:
                    ts = record.timestamp
                    records.append(
                        RawRecord(
                            record.key,
                            record.value,
                            record.topic,
                            record.partition,
                            record.offset,
                            None if ts is None or ts < 0 else ts / 1000.0,
                        )
                    )
            if await consumer.position(tp) >= end:
                break
            if not batch:
                ends = await consumer.end_offsets([tp])
                if await consumer.position(tp) >= ends[tp]:
                    break  # the range ends past the log end: nothing more to read
        return records

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
        if self._admin is not None:
            await self._admin.close()
            self._admin = None
