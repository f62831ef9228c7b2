"""The batch join's durability order with fake Kafka clients: records, then state, then the commit.

The same behaviour runs against the real broker in tests/integration/test_pipeline_e2e.py and
tests/integration/test_faults.py (kill -9, broker restart) with the batch consumer as the default.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from aiokafka import ConsumerRecord, TopicPartition

from streams.app.batch_join import BatchJoin
from streams.app.metrics import WorkerMetrics
from streams.settings import load_settings

T0 = 1_796_000_000_000.0


class FakeBatch:
    def __init__(self) -> None:
        self.items: list[tuple[bytes | None, bytes | None]] = []

    def append(self, *, key: bytes | None, value: bytes | None, timestamp: Any) -> object:
        self.items.append((key, value))
        return object()

    def record_count(self) -> int:
        return len(self.items)


class FakeProducer:
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


class FakeConsumer:
    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.commits: list[dict[TopicPartition, int]] = []

        self.seeks: list[tuple[TopicPartition, int]] = []

    def highwater(self, tp: TopicPartition) -> int | None:
        return None

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition("u.stage-events", p) for p in range(8)}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.commits.append(dict(offsets))
        self.log.append("commit")


def _join(producer: FakeProducer, clock: list[float]) -> tuple[BatchJoin, FakeConsumer]:
    settings = load_settings(topic_prefix="u")
    join = BatchJoin(settings, WorkerMetrics("join", "unit"), wall_clock=lambda: clock[0] / 1000.0)
    consumer = FakeConsumer(producer.log)
    join.producer = producer  # type: ignore[assignment]
    join.consumer = consumer  # type: ignore[assignment]
    join._partitions = {join.requests_topic: 8, join.dead_letter_topic: 8}
    join.owned = {3}
    return join, consumer


def _record(
    offset: int, stage: str, ts: float, duration: float | None = None, rid: str = "r1"
) -> ConsumerRecord[bytes, bytes]:
    event: dict[str, Any] = {"request_id": rid, "tenant_id": "acme", "stage": stage, "ts_ms": ts}
    if duration is not None:
        event["duration_ms"] = duration
    return ConsumerRecord("u.stage-events", 3, offset, int(ts), 0, rid.encode(), orjson.dumps(event), None, 0, 0, [])  # type: ignore[call-arg]


def _complete_request() -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
    records = [
        _record(10, "request_start", T0),
        _record(11, "retrieval", T0 + 10, 300.0),
        _record(12, "prompt_assemble", T0 + 320, 50.0),
        _record(13, "llm_ttft", T0 + 380, 600.0),
        _record(14, "first_token", T0 + 980),
        # A later request on the partition moves its watermark past the first one's grace.
        _record(15, "request_start", T0 + 10_000, rid="r2"),
    ]
    return {TopicPartition("u.stage-events", 3): records}


def test_records_then_state_then_commit() -> None:
    producer = FakeProducer()
    join, consumer = _join(producer, [T0 + 11_000])
    asyncio.run(join.process(_complete_request()))
    assert consumer.commits == [{TopicPartition("u.stage-events", 3): 16}]
    topics = [line.split()[1] for line in producer.log if line.startswith("produce")]
    assert topics.index("u.requests") < topics.index(join.changelog)
    assert producer.log[-1] == "commit"
    records = [orjson.loads(v) for t, _, items in producer.sent if t == "u.requests" for k, v in items if k == b"r1"]
    assert [r["status"] for r in records] == ["complete"]
    # Records go to the source partition; watermark heartbeats to every requests partition, after them.
    record_partitions = {p for t, p, items in producer.sent if t == "u.requests" for k, _ in items if k == b"r1"}
    assert record_partitions == {3}


def test_a_failed_record_produce_commits_nothing_and_writes_no_state() -> None:
    producer = FakeProducer(fail_topic="u.requests")
    join, consumer = _join(producer, [T0 + 11_000])
    with pytest.raises(ConnectionError):
        asyncio.run(join.process(_complete_request()))
    assert consumer.commits == []
    assert not [t for t, _, _ in producer.sent if t == join.changelog]


def test_a_failing_flush_in_the_idle_tick_loses_no_record() -> None:
    clock = [T0 + 1_000]
    producer = FakeProducer()
    join, consumer = _join(producer, clock)
    start = {TopicPartition("u.stage-events", 3): [_record(20, "request_start", T0)]}
    asyncio.run(join.process(start))  # open, state written, offset committed
    state = [(k, v) for t, _, items in producer.sent if t == join.changelog for k, v in items]
    assert state and consumer.commits == [{TopicPartition("u.stage-events", 3): 21}]
    # Much later, no events: the idle tick times the request out, and producing its record fails.
    producer.fail_topic = "u.requests"
    for now in (T0 + 2_000, T0 + 40_000):
        clock[0] = now
        try:
            asyncio.run(join.process({}))
        except ConnectionError:
            break
    else:
        raise AssertionError("the idle tick never tried to emit the timed-out request")
    assert len(consumer.commits) == 1
    # The worker exits on that error. Its replacement restores the changelog, where the request is open.
    again, _ = _join(FakeProducer(), clock)
    for key, packed in state:
        assert packed is not None
        again.core.restore(key.decode(), packed, 3)
    assert again.core.open_requests == 1


def test_records_of_a_partition_not_yet_restored_are_fetched_again_not_skipped() -> None:
    producer = FakeProducer()
    join, consumer = _join(producer, [T0 + 11_000])
    join.owned = set()  # assigned, state still being restored
    asyncio.run(join.process(_complete_request()))
    assert consumer.commits == []
    assert consumer.seeks == [(TopicPartition("u.stage-events", 3), 10)]
    assert join.core.open_requests == 0


def _two_fetches() -> tuple[dict[TopicPartition, list[Any]], dict[TopicPartition, list[Any]]]:
    tp = TopicPartition("u.stage-events", 3)
    first = {tp: [_record(10, "request_start", T0), _record(11, "retrieval", T0 + 10, 300.0)]}
    second = {tp: [_record(12, "request_start", T0 + 20, rid="r2")]}
    return first, second


def test_a_completion_runs_behind_the_next_fold_and_keeps_the_order() -> None:
    producer = FakeProducer()
    join, consumer = _join(producer, [T0 + 1_000])
    first, second = _two_fetches()

    async def two_steps() -> None:
        await join.step(first, state_due=True)
        assert join._inflight is not None  # the first fetch's completion runs while the next is folded
        await join.step(second, state_due=True)
        await join.settle()

    asyncio.run(two_steps())
    assert consumer.commits == [{TopicPartition("u.stage-events", 3): 12}, {TopicPartition("u.stage-events", 3): 13}]
    # Per fetch: records (with heartbeats), then state, then the commit; the second only after the first.
    kinds = [line.split()[-1] for line in producer.log]
    first_commit = kinds.index("commit")
    assert join.changelog in kinds[:first_commit]
    assert kinds[first_commit + 1 :].count("commit") == 1 and kinds[-1] == "commit"


def test_a_failed_completion_commits_neither_its_fetch_nor_the_next() -> None:
    producer = FakeProducer(fail_topic="u.changelog-never")
    join, consumer = _join(producer, [T0 + 1_000])
    producer.fail_topic = join.changelog  # the first fetch's state write fails
    first, second = _two_fetches()

    async def two_steps() -> None:
        await join.step(first, state_due=True)
        await join.step(second, state_due=True)  # raises here: the worker exits before anything later starts

    with pytest.raises(ConnectionError):
        asyncio.run(two_steps())
    assert consumer.commits == []
    assert join._inflight is None


def test_records_leave_with_every_fetch_and_the_state_and_commit_wait_for_the_interval() -> None:
    clock = [T0 + 11_000]
    producer = FakeProducer()
    join, consumer = _join(producer, clock)
    assert join.settings.join.state_every_ms == 500
    tp = TopicPartition("u.stage-events", 3)
    fetches = [
        {tp: [_record(10, "request_start", T0), _record(11, "retrieval", T0 + 10, 300.0)]},
        {tp: [_record(12, "prompt_assemble", T0 + 320, 50.0), _record(13, "llm_ttft", T0 + 380, 600.0)]},
        {tp: [_record(14, "first_token", T0 + 980), _record(15, "request_start", T0 + 10_000, rid="r2")]},
    ]

    async def steps() -> None:
        for at, fetch in zip((T0 + 11_000, T0 + 11_100, T0 + 11_200), fetches, strict=True):
            clock[0] = at
            await join.step(fetch)
        await join.settle()

    asyncio.run(steps())
    # The first step writes (nothing written yet); the next two fall within 500 ms: r1's record left with
    # the third fetch, while its state and the offsets of fetches two and three wait.
    assert consumer.commits == [{tp: 12}]
    assert [r["status"] for r in _records(producer, b"r1")] == ["complete"]
    assert join.metrics.unacked_events._value.get() == 4
    states = [k for t, _, items in producer.sent if t == join.changelog for k, _ in items]
    assert states == [b"acme\x00r1"]

    async def later() -> None:
        clock[0] = T0 + 11_600
        await join.step({})
        await join.settle()

    asyncio.run(later())
    assert consumer.commits[-1] == {tp: 16}
    kinds = [line.split()[-1] for line in producer.log]
    assert kinds[-2:] == [join.changelog, "commit"]  # one write for all that was touched, then the commit
    states = [k for t, _, items in producer.sent if t == join.changelog for k, _ in items]
    assert sorted(states[1:]) == [b"acme\x00r1", b"acme\x00r2"]
    assert join.metrics.unacked_events._value.get() == 0


def test_a_revocation_writes_the_state_and_commits_what_was_folded() -> None:
    producer = FakeProducer()
    join, consumer = _join(producer, [T0 + 1_000])
    tp = TopicPartition("u.stage-events", 3)
    join._last_state_ms = T0 + 1_000  # just written: the interval holds the state and the commit back

    async def fold_then_revoke() -> None:
        await join.step({tp: [_record(10, "request_start", T0)]})
        assert consumer.commits == []
        await join.revoked({3})

    asyncio.run(fold_then_revoke())
    assert consumer.commits == [{tp: 11}]
    assert [k for t, _, items in producer.sent if t == join.changelog for k, _ in items] == [b"acme\x00r1"]
    assert join.owned == set()


def _records(producer: FakeProducer, key: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(v) for t, _, items in producer.sent if t == "u.requests" for k, v in items if k == key]


def test_a_backlog_writes_the_state_once_a_full_fetch_was_folded_whatever_the_interval() -> None:
    producer = FakeProducer()
    join, consumer = _join(producer, [T0 + 11_000])
    join.settings = join.settings.model_copy(update={"join": join.settings.join.model_copy(update={"batch_max": 3})})
    join._last_state_ms = T0 + 11_000  # just written
    tp = TopicPartition("u.stage-events", 3)

    async def steps() -> None:
        await join.step({tp: [_record(10, "request_start", T0, rid="a"), _record(11, "request_start", T0, rid="b")]})
        await join.step({tp: [_record(12, "request_start", T0, rid="c")]})
        await join.settle()

    asyncio.run(steps())
    assert consumer.commits == [{tp: 13}]  # the second fetch made three events: written and committed
