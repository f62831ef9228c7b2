"""The OTLP mapping's fold on the runner, with fake Kafka clients: stage events on the partition the
emitter's producer would pick, held traces, bad messages. The runner's contract for every fold is in
tests/unit/test_batches.py."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import orjson
import pytest
from aiokafka import ConsumerRecord, TopicPartition
from aiokafka.partitioner import DefaultPartitioner

from tests.support.fake_kafka import FakeProducer
from tests.unit.test_batches import OTLP, otlp_records, otlp_rig, otlp_spec

TP = TopicPartition(OTLP, 3)


def test_events_go_to_the_emitters_partition_of_their_request_id() -> None:
    producer = FakeProducer()
    rig = otlp_rig(producer)
    spec = otlp_spec()
    asyncio.run(rig.runner.process({TP: otlp_records(spec, 3)}))
    assert rig.consumer.commits == [{TP: 3}]
    key = spec.rid.encode()
    want = DefaultPartitioner()(key, list(range(8)), list(range(8)))
    sent = producer.values("u.stage-events")
    assert {p for p, _, _ in sent} == {want} and {k for _, k, _ in sent} == {key}
    assert {orjson.loads(v or b"")["stage"] for _, _, v in sent} >= {"request_start", "llm_ttft", "first_token"}


def test_a_held_trace_writes_state_and_commits_without_events() -> None:
    producer = FakeProducer()
    rig = otlp_rig(producer)
    asyncio.run(rig.runner.process({TP: otlp_records(otlp_spec(), 3)[:1]}))
    assert not producer.values("u.stage-events")
    assert [t for t, _, _ in producer.sent] == [rig.changelog]
    assert rig.consumer.commits == [{TP: 1}]


def test_a_malformed_message_is_dead_lettered_and_committed() -> None:
    producer = FakeProducer()
    rig = otlp_rig(producer)
    bad = ConsumerRecord(OTLP, 3, 7, 0, 0, b"k", b"\xff\xff garbage", None, 0, 0, [])  # type: ignore[call-arg]
    asyncio.run(rig.runner.process({TP: [bad]}))
    (dead,) = [orjson.loads(v or b"") for _, _, v in producer.values("u.dead-letter")]
    assert (dead["reason_code"], dead["source_offset"]) == ("otlp_decode", 7)
    assert rig.consumer.commits == [{TP: 8}]


def test_llm_spans_without_a_first_chunk_are_counted_by_scope() -> None:
    producer = FakeProducer()
    rig = otlp_rig(producer)
    spec = otlp_spec()
    llm = next(s for s in spec.spans if s.name == "llm")
    llm.events.clear()
    llm.attributes.pop("gen_ai.response.time_to_first_chunk", None)
    asyncio.run(rig.runner.process({TP: otlp_records(spec, 1)}))
    rig.fold.report()()
    assert not producer.values("u.dead-letter")
    sent = [orjson.loads(v or b"") for _, _, v in producer.values("u.stage-events")]
    assert [e["stage"] for e in sent].count("llm_unmeasured") == 1
    # the test traffic's spans have an unnamed scope
    assert rig.fold.metrics.otlp_no_first_chunk.labels("", "")._value.get() == 1.0
    assert b'ttft_otlp_no_first_chunk_total{scope="",scope_version=""} 1.0' in rig.fold.metrics.render()


def test_a_hostile_span_is_dead_lettered_and_the_fetch_committed_with_the_other_spans() -> None:
    producer = FakeProducer()
    rig = otlp_rig(producer)
    spec = otlp_spec()
    bad = next(s for s in spec.spans if s.name == "rerank")
    bad.start_us, bad.end_us = (2**64 - 1) // 1000 - 10, (2**64 - 1) // 1000  # times near 2**64
    asyncio.run(rig.runner.process({TP: otlp_records(spec, 3)}))
    assert rig.consumer.commits == [{TP: 3}]
    (dead,) = [orjson.loads(v or b"") for _, _, v in producer.values("u.dead-letter")]
    assert (dead["reason_code"], dead["span_id"]) == ("schema", bad.span_id.hex())
    stages = [orjson.loads(v or b"")["stage"] for _, _, v in producer.values("u.stage-events")]
    assert "rerank" not in stages and {"request_start", "retrieval", "llm_ttft", "first_token"} <= set(stages)


def test_a_message_the_assembler_fails_on_is_dead_lettered_not_a_failed_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    producer = FakeProducer()
    rig = otlp_rig(producer)

    def broken(*args: object) -> list[object]:
        raise RuntimeError("boom")

    monkeypatch.setattr(rig.fold.core, "add_message", broken)
    asyncio.run(rig.runner.process({TP: otlp_records(otlp_spec(), 2)}))
    assert rig.consumer.commits == [{TP: 2}]
    dead = [orjson.loads(v or b"") for _, _, v in producer.values("u.dead-letter")]
    assert [(d["reason_code"], d["source_offset"]) for d in dead] == [("schema", 0), ("schema", 1)]
    assert all("RuntimeError: boom" in d["detail"] for d in dead)


def test_messages_not_keyed_by_their_trace_are_counted_and_still_mapped() -> None:
    """What a Collector without partition_traces_by_id sends (no key, or several traces in one message) is
    mapped as usual, counted in ttft_otlp_unkeyed_messages and said once in the log."""
    producer = FakeProducer()
    rig = otlp_rig(producer)
    spec = otlp_spec()
    keyed = otlp_records(spec, 3)
    unkeyed = [replace(r, key=None) for r in keyed[:2]] + [replace(r, key=b"0" * 32) for r in keyed[2:]]
    asyncio.run(rig.runner.process({TP: unkeyed}))
    assert rig.fold.metrics.otlp_unkeyed_messages._value.get() == 3
    assert {orjson.loads(v or b"")["stage"] for _, _, v in producer.values("u.stage-events")} >= {"first_token"}
    other = otlp_rig(FakeProducer())
    asyncio.run(other.runner.process({TP: otlp_records(otlp_spec(), 3)}))
    assert other.fold.metrics.otlp_unkeyed_messages._value.get() == 0
