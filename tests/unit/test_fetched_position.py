"""``fetched_position`` reads aiokafka's subscription state (the sync twin of ``await consumer.position()``):
pinned here against the installed aiokafka, so an upgrade that moves it fails in the fast tier.
tests/integration/test_transactional_input.py shows what depends on it: partitions whose last offsets are
transaction markers."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.kafka.positions import fetched_position


def test_reads_the_position_the_consumer_reports() -> None:
    async def positions() -> list[int | None]:
        consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")
        tp = TopicPartition("t", 0)
        seen = [fetched_position(consumer, tp)]  # nothing assigned
        consumer.assign([tp])
        seen.append(fetched_position(consumer, tp))  # assigned, no position yet
        state = consumer._subscription.subscription.assignment.state_value(tp)
        state.reset_to(42)
        seen.append(fetched_position(consumer, tp))
        state.consumed_to(45)  # what a fetch past a commit marker does
        seen += [fetched_position(consumer, tp), await consumer.position(tp)]
        return seen

    assert asyncio.run(positions()) == [None, None, 42, 45, 45]
