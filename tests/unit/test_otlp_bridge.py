"""The OTLP bridge's durability order with fake Kafka clients: events, then trace state, then the commit.

The same behaviour runs against the real broker in tests/integration/test_otlp_pipeline.py.
"""

from __future__ import annotations

import asyncio
import random

import orjson
import pytest
from aiokafka import ConsumerRecord, TopicPartition
from aiokafka.partitioner import DefaultPartitioner

from streams.app.metrics import WorkerMetrics
from streams.app.otlp_bridge import OtlpBridge
from streams.settings import load_settings
from tests.support.otlp_traffic import TraceSpec, build_trace, exports, request_message
from tests.unit.test_batch_join import FakeConsumer, FakeProducer

START_US = 1_796_000_000_000_000
TOPIC = "otlp_spans"


def _bridge(producer: FakeProducer) -> tuple[OtlpBridge, FakeConsumer]:
    settings = load_settings(topic_prefix="u")
    bridge = OtlpBridge(settings, WorkerMetrics("join", "unit"), wall_clock=lambda: START_US / 1e6 + 60)
    consumer = FakeConsumer(producer.log)
    consumer.assignment = lambda: {TopicPartition(TOPIC, p) for p in range(8)}  # type: ignore[method-assign]
    bridge.producer = producer  # type: ignore[assignment]
    bridge.consumer = consumer  # type: ignore[assignment]
    bridge._partitions = {bridge.stage_topic: list(range(8)), bridge.dead_letter_topic: list(range(8))}
    bridge.owned = {3}
    return bridge, consumer


def _records(spec: TraceSpec, pieces: int, first_offset: int = 0) -> list[ConsumerRecord[bytes, bytes]]:
    parts = exports(spec, random.Random(1), pieces)
    return [
        ConsumerRecord(
            TOPIC,
            3,
            first_offset + i,
            0,
            0,
            spec.trace_id.hex().encode(),
            request_message(spec, part).SerializeToString(),
            None,
            0,
            0,
            [],
        )  # type: ignore[call-arg]
        for i, part in enumerate(parts)
    ]


def _spec() -> TraceSpec:
    specs = (build_trace(random.Random(seed), 1, START_US, shape="gen_ai", tenant="acme") for seed in range(50))
    return next(s for s in specs if s.llm is not None)


def test_events_then_state_then_commit_on_the_emitters_partition() -> None:
    producer = FakeProducer()
    bridge, consumer = _bridge(producer)
    spec = _spec()
    asyncio.run(bridge.process({TopicPartition(TOPIC, 3): _records(spec, 3)}))
    assert consumer.commits == [{TopicPartition(TOPIC, 3): 3}]
    topics = [line.split()[1] for line in producer.log if line.startswith("produce")]
    assert topics.index("u.stage-events") < topics.index(bridge.changelog)
    assert producer.log[-1] == "commit"
    key = spec.rid.encode()
    want = DefaultPartitioner()(key, list(range(8)), list(range(8)))
    sent = [(p, k, v) for t, p, items in producer.sent if t == "u.stage-events" for k, v in items]
    assert {p for p, _, _ in sent} == {want} and {k for _, k, _ in sent} == {key}
    assert {orjson.loads(v)["stage"] for _, _, v in sent} >= {"request_start", "llm_ttft", "first_token"}


def test_a_held_trace_writes_state_and_commits_without_events() -> None:
    producer = FakeProducer()
    bridge, consumer = _bridge(producer)
    records = _records(_spec(), 3)
    asyncio.run(bridge.process({TopicPartition(TOPIC, 3): records[:1]}))
    assert not [t for t, _, _ in producer.sent if t == "u.stage-events"]
    assert [t for t, _, _ in producer.sent] == [bridge.changelog]
    assert consumer.commits == [{TopicPartition(TOPIC, 3): 1}]


def test_a_failed_event_produce_commits_nothing_and_writes_no_state() -> None:
    producer = FakeProducer(fail_topic="u.stage-events")
    bridge, consumer = _bridge(producer)
    with pytest.raises(ConnectionError):
        asyncio.run(bridge.process({TopicPartition(TOPIC, 3): _records(_spec(), 2)}))
    assert consumer.commits == []
    assert not [t for t, _, _ in producer.sent if t == bridge.changelog]


def test_a_malformed_message_is_dead_lettered_and_committed() -> None:
    producer = FakeProducer()
    bridge, consumer = _bridge(producer)
    bad = ConsumerRecord(TOPIC, 3, 7, 0, 0, b"k", b"\xff\xff garbage", None, 0, 0, [])  # type: ignore[call-arg]
    asyncio.run(bridge.process({TopicPartition(TOPIC, 3): [bad]}))
    (dead,) = [orjson.loads(v) for t, _, items in producer.sent if t == "u.dead-letter" for _, v in items]
    assert (dead["reason_code"], dead["source_offset"]) == ("otlp_decode", 7)
    assert consumer.commits == [{TopicPartition(TOPIC, 3): 8}]


def test_messages_of_a_partition_not_yet_restored_are_fetched_again() -> None:
    producer = FakeProducer()
    bridge, consumer = _bridge(producer)
    bridge.owned = set()
    asyncio.run(bridge.process({TopicPartition(TOPIC, 3): _records(_spec(), 2, first_offset=40)}))
    assert consumer.commits == [] and consumer.seeks == [(TopicPartition(TOPIC, 3), 40)]
