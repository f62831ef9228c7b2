"""The partition-batch runner's contract, once, against each fold that keeps state (the join, the OTLP
mapping), with fake Kafka clients: outputs, then state, then the commit; a failed produce commits nothing;
records of a partition not restored yet are fetched again; a revocation commits what was folded; a restore
that raises on assignment ends the process with nothing committed.

The same behaviour runs against the real broker in tests/integration/test_join_durability.py,
test_faults.py and test_otlp_pipeline.py.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from aiokafka import ConsumerRecord, TopicPartition

from streams.app.join_fold import JoinFold, join_runner_config, join_runner_metrics
from streams.app.metrics import WorkerMetrics
from streams.app.otlp_fold import OtlpFold, otlp_runner_config, otlp_runner_metrics
from streams.core.watermarks import WATERMARK_KEY
from streams.kafka import batches
from streams.kafka.batches import EXIT_BATCH_FAILED, PartitionBatchRunner
from streams.settings import load_settings
from tests.support.fake_kafka import FakeConsumer, FakeProducer
from tests.support.otlp_traffic import TraceSpec, build_trace, exports, request_message

T0 = 1_796_000_000_000.0
START_US = 1_796_000_000_000_000
OTLP = "otlp_spans"


@dataclass
class Rig:
    runner: PartitionBatchRunner
    fold: Any
    consumer: FakeConsumer
    producer: FakeProducer
    tp: TopicPartition
    #: The topic the fold's main output goes to, and a fetch that makes some.
    output: str
    fetch: Callable[[int], dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]]

    @property
    def changelog(self) -> str:
        return str(self.fold.changelog)


def _rig(runner: PartitionBatchRunner, fold: Any, producer: FakeProducer, topic: str, output: str, fetch: Any) -> Rig:
    consumer = FakeConsumer(producer.log, topic)
    runner.producer = producer  # type: ignore[assignment]
    runner.consumer = consumer  # type: ignore[assignment]
    runner.partitions = {t: list(range(8)) for t in runner.config.output_topics}
    tp = TopicPartition(topic, 3)
    runner.owned = {tp}
    return Rig(runner, fold, consumer, producer, tp, output, fetch)


# --- the join ------------------------------------------------------------------------------------


def stage_record(
    offset: int, stage: str, ts: float, duration: float | None = None, rid: str = "r1"
) -> ConsumerRecord[bytes, bytes]:
    event: dict[str, Any] = {"request_id": rid, "tenant_id": "acme", "stage": stage, "ts_ms": ts}
    if duration is not None:
        event["duration_ms"] = duration
    return ConsumerRecord("u.stage-events", 3, offset, int(ts), 0, rid.encode(), orjson.dumps(event), None, 0, 0, [])  # type: ignore[call-arg]


def complete_request(first_offset: int = 10) -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
    o = first_offset
    records = [
        stage_record(o, "request_start", T0),
        stage_record(o + 1, "retrieval", T0 + 10, 300.0),
        stage_record(o + 2, "prompt_assemble", T0 + 320, 50.0),
        stage_record(o + 3, "llm_ttft", T0 + 380, 600.0),
        stage_record(o + 4, "first_token", T0 + 980),
        # A later request on the partition moves its watermark past the first one's grace.
        stage_record(o + 5, "request_start", T0 + 10_000, rid="r2"),
    ]
    return {TopicPartition("u.stage-events", 3): records}


def join_rig(producer: FakeProducer, clock: list[float] | None = None, **settings: Any) -> Rig:
    now = clock or [T0 + 11_000]
    s = load_settings(topic_prefix="u", **settings)
    fold = JoinFold(s, WorkerMetrics("join", "unit"), wall_clock=lambda: now[0] / 1000.0)
    runner = PartitionBatchRunner(
        s, join_runner_config(s), fold, metrics=join_runner_metrics(fold.metrics), wall_clock=lambda: now[0] / 1000.0
    )
    return _rig(runner, fold, producer, "u.stage-events", "u.requests", complete_request)


# --- the OTLP mapping ----------------------------------------------------------------------------


def otlp_spec() -> TraceSpec:
    specs = (build_trace(random.Random(seed), 1, START_US, shape="gen_ai", tenant="acme") for seed in range(50))
    return next(s for s in specs if s.llm is not None)


def otlp_records(spec: TraceSpec, pieces: int, first_offset: int = 0) -> list[ConsumerRecord[bytes, bytes]]:
    parts = exports(spec, random.Random(1), pieces)
    return [
        ConsumerRecord(
            OTLP, 3, first_offset + i, 0, 0, spec.trace_id.hex().encode(),
            request_message(spec, part).SerializeToString(), None, 0, 0, [],
        )  # type: ignore[call-arg]
        for i, part in enumerate(parts)
    ]  # fmt: skip


def otlp_rig(producer: FakeProducer) -> Rig:
    s = load_settings(topic_prefix="u")
    fold = OtlpFold(s, WorkerMetrics("join", "unit"), wall_clock=lambda: START_US / 1e6 + 60)
    runner = PartitionBatchRunner(
        s,
        otlp_runner_config(s),
        fold,
        metrics=otlp_runner_metrics(fold.metrics),
        wall_clock=lambda: START_US / 1e6 + 60,
    )

    def fetch(first_offset: int = 10) -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
        return {TopicPartition(OTLP, 3): otlp_records(otlp_spec(), 3, first_offset)}

    return _rig(runner, fold, producer, OTLP, "u.stage-events", fetch)


RIGS = {"join": join_rig, "otlp": otlp_rig}


@pytest.fixture(params=sorted(RIGS))
def make_rig(request: pytest.FixtureRequest) -> Callable[[FakeProducer], Rig]:
    return RIGS[request.param]  # type: ignore[return-value]


# --- the contract, once for every fold -----------------------------------------------------------


def test_outputs_then_state_then_commit(make_rig: Callable[[FakeProducer], Rig]) -> None:
    rig = make_rig(FakeProducer())
    asyncio.run(rig.runner.process(rig.fetch(10)))
    assert rig.consumer.commits == [{rig.tp: 13 if rig.tp.topic == OTLP else 16}]
    topics = [line.split()[1] for line in rig.producer.log if line.startswith("produce")]
    assert topics.index(rig.output) < topics.index(rig.changelog)
    assert rig.producer.log[-1] == "commit"


def test_a_failed_produce_commits_nothing_and_writes_no_state(make_rig: Callable[[FakeProducer], Rig]) -> None:
    producer = FakeProducer()
    rig = make_rig(producer)
    producer.fail_topic = rig.output
    with pytest.raises(ConnectionError):
        asyncio.run(rig.runner.process(rig.fetch(10)))
    assert rig.consumer.commits == []
    assert not producer.values(rig.changelog)


def test_records_of_a_partition_not_yet_restored_are_fetched_again_not_skipped(
    make_rig: Callable[[FakeProducer], Rig],
) -> None:
    rig = make_rig(FakeProducer())
    rig.runner.owned = set()  # assigned, state still being restored
    asyncio.run(rig.runner.process(rig.fetch(40)))
    assert rig.consumer.commits == []
    assert rig.consumer.seeks == [(rig.tp, 40)]
    assert not rig.producer.values(rig.output)


def test_a_revocation_mid_batch_writes_the_state_and_commits_what_was_folded(
    make_rig: Callable[[FakeProducer], Rig],
) -> None:
    rig = make_rig(FakeProducer())
    runner = rig.runner
    runner._last_state_ms = runner._wall() * 1000.0  # just written: an interval holds state and commit back

    async def fold_then_revoke() -> None:
        fetch = rig.fetch(10)
        await runner.step(fetch)
        await runner.revoked({rig.tp})

    asyncio.run(fold_then_revoke())
    last = max(r.offset for r in next(iter(rig.fetch(10).values())))
    assert rig.consumer.commits[-1] == {rig.tp: last + 1}
    assert rig.producer.values(rig.changelog)
    assert runner.owned == set()


def test_a_restore_that_raises_on_assignment_ends_the_process_with_nothing_committed(
    make_rig: Callable[[FakeProducer], Rig], monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = make_rig(FakeProducer())
    rig.runner.owned = set()

    async def broken_restore(partitions: list[TopicPartition]) -> None:
        raise TimeoutError("restoring the changelog took too long")

    exits: list[int] = []

    def fake_exit(code: int) -> None:
        exits.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(rig.fold, "restore", broken_restore)
    monkeypatch.setattr(batches.os, "_exit", fake_exit)
    listener = batches._Rebalance(rig.runner)
    with pytest.raises(SystemExit):
        asyncio.run(listener.on_partitions_assigned({rig.tp}))
    assert exits == [EXIT_BATCH_FAILED]
    assert rig.consumer.commits == [] and rig.producer.sent == []
    assert rig.consumer.paused == {rig.tp}  # never resumed: nothing of it was fetched or folded
    assert rig.runner.owned == set()


def test_a_failed_completion_commits_neither_its_fetch_nor_the_next(make_rig: Callable[[FakeProducer], Rig]) -> None:
    producer = FakeProducer()
    rig = make_rig(producer)
    producer.fail_topic = rig.changelog  # the first fetch's state write fails
    runner = rig.runner

    async def two_steps() -> None:
        await runner.step(rig.fetch(10), state_due=True)
        await runner.step(rig.fetch(100), state_due=True)  # raises (or the first did): nothing later starts

    with pytest.raises(ConnectionError):
        asyncio.run(two_steps())
    assert rig.consumer.commits == []
    assert runner._inflight is None


def test_a_fold_that_raises_reaches_the_runner_and_commits_nothing(make_rig: Callable[[FakeProducer], Rig]) -> None:
    rig = make_rig(FakeProducer())

    async def broken_fold(*args: Any) -> None:
        raise RuntimeError("a bug in the fold")

    rig.fold.fold = broken_fold
    with pytest.raises(RuntimeError):
        asyncio.run(rig.runner.process(rig.fetch(10)))
    assert rig.consumer.commits == [] and rig.producer.sent == []


def test_a_gauge_never_reads_drained_before_the_releases_it_counts_are_acknowledged() -> None:
    """Pipelined: the completion of fetch N reports the join's open requests after fetch N+1 was folded. A
    request that fold N+1 released (an idle tick's timeout) is not open, and its record is not produced yet:
    ``ttft_open_requests`` must not read 0 until it is, or a drain check (tests, ``ttft replay``) stops the
    writer before the last requests reach it (the likely cause of one request missing from a CI run's store in
    test_bridge_survives_a_broker_restart_mid_stream)."""
    clock = [T0 + 11_000]
    rig = join_rig(FakeProducer(), clock=clock)
    runner, gauge = rig.runner, rig.fold.metrics.open_requests

    def released() -> int:
        return sum(key != WATERMARK_KEY for _, key, _ in rig.producer.values(rig.output))

    async def fetch_then_idle_tick() -> tuple[float, int, float, int]:
        await runner.step(rig.fetch(10), state_due=True)  # r1 released; r2 open; its completion in flight
        clock[0] += 60_000.0  # past r2's timeout: the idle tick of the next fold releases it
        await runner.step({})
        between = (gauge._value.get(), released())
        await runner.settle()
        return (*between, gauge._value.get(), released())

    open_between, produced_between, open_after, produced_after = asyncio.run(fetch_then_idle_tick())
    assert (open_after, produced_after) == (0, 2)
    assert (open_between, produced_between) == (1, 1), "r2 counted neither open nor produced"


def test_no_partition_is_idle_in_the_first_step_after_the_runner_stalled() -> None:
    """A step that waited out a broker outage (its produce retried for a minute) saw nothing of what the
    producers buffered meanwhile: the next fold must not take that minute for silence (CI, with the broker
    down 45 s: held OTLP traces resolved without their roots). The idle clock restarts there instead."""
    clock, mono = [T0 + 11_000], [100.0]
    rig = join_rig(FakeProducer(), clock=clock)
    runner = rig.runner
    runner._clock = lambda: mono[0]

    def released() -> int:
        return sum(key != WATERMARK_KEY for _, key, _ in rig.producer.values(rig.output))

    async def stall_then_ticks() -> tuple[tuple[bool, int], float]:
        await runner.process(rig.fetch(10))  # r1 released; r2 open
        clock[0] += 60_000.0  # a step that began a minute after the one before
        mono[0] += 60.0
        await runner.process({})
        stalled = (runner.idle(rig.tp), released())
        waited = 0.0
        while released() < 2 and waited < 120.0:  # then a step every 0.5 s, as the run loop polls
            clock[0] += 500.0
            mono[0] += 0.5
            waited += 0.5
            await runner.process({})
        return stalled, waited

    stalled, waited = asyncio.run(stall_then_ticks())
    assert stalled == (False, 1), "the stalled step took its minute for silence and released r2"
    j = rig.fold.settings.join
    assert waited >= j.request_timeout_ms / 1000.0  # r2's idle time runs from after the stall


def test_a_partition_the_broker_has_not_answered_for_is_not_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Caught up by the last fetch, then no fetch answered (the broker down): not idle after FETCH_FRESH_MS,
    so no wall-clock tick moves a watermark while what waits there may be on its way."""
    rig = join_rig(FakeProducer())
    runner, tp = rig.runner, rig.tp
    runner._next[tp] = 16
    answered = [time.time() * 1000.0]
    monkeypatch.setattr(rig.consumer, "highwater", lambda tp: 16, raising=False)
    monkeypatch.setattr(rig.consumer, "last_poll_timestamp", lambda tp: answered[0], raising=False)
    assert runner.idle(tp)
    answered[0] -= batches.FETCH_FRESH_MS + 1_000.0
    assert not runner.idle(tp)
    assert not runner.unread_backlog(tp)  # nothing known to wait: only not known to be caught up
