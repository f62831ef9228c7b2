"""The join's fold on the runner, with fake Kafka clients: where its records go, the pipelined completion,
and the checkpoint cadence (``join.state_every_ms`` or ``join.batch_max`` events). The runner's contract
for every fold is in tests/unit/test_batches.py."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiokafka import TopicPartition

from tests.support.fake_kafka import FakeProducer
from tests.unit.test_batches import T0, join_rig, stage_record

TP = TopicPartition("u.stage-events", 3)


def _records(producer: FakeProducer, key: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(v) for _, k, v in producer.values("u.requests") if k == key and v is not None]


def test_records_go_to_the_source_partition_and_heartbeats_to_every_partition_after_them() -> None:
    producer = FakeProducer()
    rig = join_rig(producer)
    asyncio.run(rig.runner.process(rig.fetch(10)))
    assert [r["status"] for r in _records(producer, b"r1")] == ["complete"]
    assert {p for p, k, _ in producer.values("u.requests") if k == b"r1"} == {3}
    beats = [p for p, k, _ in producer.values("u.requests") if k not in (b"r1", b"r2")]
    assert sorted(beats) == list(range(8))


def test_heartbeats_carry_the_otlp_bridges_cut_off_traces_to_the_writers_stats() -> None:
    """The OTLP bridge beside the join counts the traces that start at a stage span; the join's heartbeats carry
    the count (0 without the bridge) to the writer, which writes it to ``pipeline_stats``."""
    producer = FakeProducer()
    rig = join_rig(producer)
    rig.fold.metrics.otlp_cut_off_traces.inc(7)
    asyncio.run(rig.runner.process(rig.fetch(10)))
    beats = [orjson.loads(v) for _, k, v in producer.values("u.requests") if k not in (b"r1", b"r2")]
    assert beats and {b["otlp_cut_off_traces"] for b in beats} == {7.0}


def test_a_failing_flush_in_the_idle_tick_loses_no_record() -> None:
    clock = [T0 + 1_000]
    producer = FakeProducer()
    rig = join_rig(producer, clock)
    asyncio.run(rig.runner.process({TP: [stage_record(20, "request_start", T0)]}))  # open, written, committed
    state = [(k, v) for _, k, v in producer.values(rig.changelog)]
    assert state and rig.consumer.commits == [{TP: 21}]
    # Much later, no events: the idle tick times the request out, and producing its record fails.
    producer.fail_topic = "u.requests"
    for now in (T0 + 2_000, T0 + 40_000):
        clock[0] = now
        try:
            asyncio.run(rig.runner.process({}))
        except ConnectionError:
            break
    else:
        raise AssertionError("the idle tick never tried to emit the timed-out request")
    assert len(rig.consumer.commits) == 1
    # The worker exits on that error. Its replacement restores the changelog, where the request is open.
    again = join_rig(FakeProducer(), clock)
    for key, packed in state:
        assert key is not None and packed is not None
        again.fold.core.restore(key.decode(), packed, 3)
    assert again.fold.core.open_requests == 1


def _two_fetches() -> tuple[dict[TopicPartition, list[Any]], dict[TopicPartition, list[Any]]]:
    first = {TP: [stage_record(10, "request_start", T0), stage_record(11, "retrieval", T0 + 10, 300.0)]}
    second = {TP: [stage_record(12, "request_start", T0 + 20, rid="r2")]}
    return first, second


def test_a_completion_runs_behind_the_next_fold_and_keeps_the_order() -> None:
    producer = FakeProducer()
    rig = join_rig(producer, [T0 + 1_000])
    runner = rig.runner
    first, second = _two_fetches()

    async def two_steps() -> None:
        await runner.step(first, state_due=True)
        assert runner._inflight is not None  # the first fetch's completion runs while the next is folded
        await runner.step(second, state_due=True)
        await runner.settle()

    asyncio.run(two_steps())
    assert rig.consumer.commits == [{TP: 12}, {TP: 13}]
    # Per fetch: records (with heartbeats), then state, then the commit; the second only after the first.
    kinds = [line.split()[-1] for line in producer.log]
    first_commit = kinds.index("commit")
    assert rig.changelog in kinds[:first_commit]
    assert kinds[first_commit + 1 :].count("commit") == 1 and kinds[-1] == "commit"


def test_records_leave_with_every_fetch_and_the_state_and_commit_wait_for_the_interval() -> None:
    clock = [T0 + 11_000]
    producer = FakeProducer()
    rig = join_rig(producer, clock)
    runner, metrics = rig.runner, rig.fold.metrics
    assert rig.fold.settings.join.state_every_ms == 500
    fetches = [
        {TP: [stage_record(10, "request_start", T0), stage_record(11, "retrieval", T0 + 10, 300.0)]},
        {TP: [stage_record(12, "prompt_assemble", T0 + 320, 50.0), stage_record(13, "llm_ttft", T0 + 380, 600.0)]},
        {TP: [stage_record(14, "first_token", T0 + 980), stage_record(15, "request_start", T0 + 10_000, rid="r2")]},
    ]

    async def steps() -> None:
        for at, fetch in zip((T0 + 11_000, T0 + 11_100, T0 + 11_200), fetches, strict=True):
            clock[0] = at
            await runner.step(fetch)
        await runner.settle()

    asyncio.run(steps())
    # The first step writes (nothing written yet); the next two fall within 500 ms: r1's record left with
    # the third fetch, while its state and the offsets of fetches two and three wait.
    assert rig.consumer.commits == [{TP: 12}]
    assert [r["status"] for r in _records(producer, b"r1")] == ["complete"]
    assert metrics.unacked_events._value.get() == 4
    assert [k for _, k, _ in producer.values(rig.changelog)] == [b"acme\x00r1"]

    async def later() -> None:
        clock[0] = T0 + 11_600
        await runner.step({})
        await runner.settle()

    asyncio.run(later())
    assert rig.consumer.commits[-1] == {TP: 16}
    kinds = [line.split()[-1] for line in producer.log]
    assert kinds[-2:] == [rig.changelog, "commit"]  # one write for all that was touched, then the commit
    states = [k for _, k, _ in producer.values(rig.changelog)]
    assert sorted(s for s in states[1:] if s is not None) == [b"acme\x00r1", b"acme\x00r2"]
    assert metrics.unacked_events._value.get() == 0


def test_a_backlog_writes_the_state_once_a_full_fetch_was_folded_whatever_the_interval() -> None:
    producer = FakeProducer()
    rig = join_rig(producer, [T0 + 11_000], join={"batch_max": 3})
    runner = rig.runner
    runner._last_state_ms = T0 + 11_000  # just written

    async def steps() -> None:
        await runner.step(
            {TP: [stage_record(10, "request_start", T0, rid="a"), stage_record(11, "request_start", T0, rid="b")]}
        )
        await runner.step({TP: [stage_record(12, "request_start", T0, rid="c")]})
        await runner.settle()

    asyncio.run(steps())
    assert rig.consumer.commits == [{TP: 13}]  # the second fetch made three events: written and committed


def test_the_group_and_changelog_keep_the_names_every_earlier_join_used() -> None:
    rig = join_rig(FakeProducer())
    assert rig.runner.config.group_id == "ttft-join"
    assert rig.changelog == "ttft-join-join-state-changelog"
