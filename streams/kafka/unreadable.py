"""Records the Kafka client cannot read, and how the runner gets past them without losing their neighbours.

The broker accepts a record whose header key is not UTF-8 (Kafka's Java client decodes it leniently;
librdkafka, and so kcat, send any bytes), but aiokafka decodes header keys strictly: the fetch that holds
such a record raises ``UnicodeDecodeError`` out of ``getmany``, the records it had read for other
partitions with it are dropped, and every later fetch raises again at the same offset. One such producer
used to stop the join for every tenant: it exited uncommitted and each restart failed the same way.

:func:`salvage` is what the runner does instead: every partition goes back to the offset it has folded to,
each is read alone, and one that fails is read again record by record up to the failing record. That
record becomes a *stand-in*: a record with no key and no value, carrying the error in the header
:data:`UNREADABLE_HEADER`, which each fold dead-letters (:func:`unreadable_letter`). Its bytes stay in the
topic at its offset; the consumer continues after it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from schemas.dead_letter import DeadLetter, make_dead_letter
from streams.kafka.positions import stopped_at

log = logging.getLogger("ttft.runner")

#: The header of a stand-in record: the error that made the record at its offset unreadable.
UNREADABLE_HEADER = "ttft-unreadable"
#: What ``getmany`` raises on a record it cannot parse (a header key that is not UTF-8).
UNREADABLE_ERRORS: tuple[type[Exception], ...] = (UnicodeDecodeError,)

Records = dict[TopicPartition, list[ConsumerRecord[Any, Any]]]


def stand_in(tp: TopicPartition, offset: int, error: BaseException) -> ConsumerRecord[Any, Any]:
    """The record folded in place of the unreadable one at ``offset``."""
    detail = f"{type(error).__name__}: {error}"[:300].encode()
    return ConsumerRecord(
        tp.topic, tp.partition, offset, -1, 0, None, None, None, -1, -1, [(UNREADABLE_HEADER, detail)]
    )


def unreadable_letter(
    record: ConsumerRecord[Any, Any], received_at_ms: float, max_original_bytes: int
) -> DeadLetter | None:
    """The dead letter of a stand-in record (``not_utf8``, where to find the bytes), None for any other."""
    if record.value is not None or not record.headers or record.headers[0][0] != UNREADABLE_HEADER:
        return None
    error = (record.headers[0][1] or b"").decode("utf-8", "replace")
    where = f"{record.topic} partition {record.partition} offset {record.offset}"
    return make_dead_letter(
        "not_utf8",
        f"the Kafka record at {where} cannot be read: a header key is not UTF-8, which Kafka requires ({error}). "
        f"Its bytes stay in the topic (kcat -C -t {record.topic} -p {record.partition} -o {record.offset} -c 1)",
        b"",
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        kafka_timestamp_ms=None,
        max_original_bytes=max_original_bytes,
        received_at_ms=received_at_ms,
    )


async def salvage(
    consumer: AIOKafkaConsumer, starts: Mapping[TopicPartition, int], poll_ms: int, batch_max: int
) -> Records:
    """Read past an unreadable record (see the module docstring): ``starts`` are the offsets each partition
    has been folded to. Returns the records read, a stand-in in place of each unreadable one."""
    for tp, offset in starts.items():
        consumer.seek(tp, offset)  # the failed fetch moved positions past records never returned
    paused = consumer.paused()
    out: Records = {}
    for tp in sorted(starts):
        if tp in paused:
            continue
        try:
            got = await consumer.getmany(tp, timeout_ms=poll_ms, max_records=batch_max)
            records = got.get(tp, [])
        except UNREADABLE_ERRORS:
            consumer.seek(tp, starts[tp])
            records = await _up_to_unreadable(consumer, tp, poll_ms, batch_max)
        if records:
            out[tp] = records
    return out


async def _up_to_unreadable(
    consumer: AIOKafkaConsumer, tp: TopicPartition, poll_ms: int, limit: int
) -> list[ConsumerRecord[Any, Any]]:
    """``tp`` read one record at a time until one fails (then its stand-in ends the list, and the consumer
    continues after it), nothing more is fetched, or ``limit`` records were read."""
    records: list[ConsumerRecord[Any, Any]] = []
    while len(records) < limit:
        try:
            got = await consumer.getmany(tp, timeout_ms=poll_ms, max_records=1)
        except UNREADABLE_ERRORS as exc:
            offset = stopped_at(consumer, tp)
            if offset is None:
                raise
            log.error("%s: the record at offset %d cannot be read (%s); dead-lettered, reading on", tp, offset, exc)
            consumer.seek(tp, offset + 1)
            records.append(stand_in(tp, offset, exc))
            return records
        if not got:
            return records
        records += got[tp]
    return records
