"""Where the consumer is on a partition, read from aiokafka's own state without waiting (aiokafka 0.14).

aiokafka answers ``position()`` only as a coroutine that may wait for the fetcher; the runner asks while a
step holds its lock, so it reads the same state directly. tests/unit/test_fetched_position.py pins both
readings against the installed aiokafka.
"""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, TopicPartition


def fetched_position(consumer: AIOKafkaConsumer, tp: TopicPartition) -> int | None:
    """The consumer's position on ``tp`` (the offset after the last record it returned or skipped), or None
    while it has none. ``await consumer.position(tp)`` answers the same from the same state, but waits for
    the fetcher when there is no position yet; this never waits (aiokafka 0.14's subscription state)."""
    try:
        state = consumer._subscription.subscription.assignment.state_value(tp)
    except (AttributeError, KeyError):
        return None
    if state is None or not state.has_valid_position:
        return None
    position: int = state.position
    return position


def stopped_at(consumer: AIOKafkaConsumer, tp: TopicPartition) -> int | None:
    """After ``getmany`` raised on a record of ``tp``: that record's offset, as the fetcher's buffered result
    of ``tp`` knows it (aiokafka 0.14); else the consumer's position."""
    try:
        result = consumer._fetcher._records.get(tp)
        records = getattr(result, "_partition_records", None)
        if records is not None:
            return int(records.next_fetch_offset)
    except AttributeError:
        pass
    return fetched_position(consumer, tp)
