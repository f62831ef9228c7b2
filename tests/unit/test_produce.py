"""Producing a step's outputs through a broker outage (streams.kafka.produce)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from aiokafka.errors import (
    LeaderNotAvailableError,
    MessageSizeTooLargeError,
    NodeNotReadyError,
    UnknownTopicOrPartitionError,
)

from streams.app.writer_hooks import TopicPublisher
from streams.kafka import produce
from streams.kafka.produce import produce_batches
from streams.settings import Settings
from tests.support.fake_kafka import FakeBatch


class OutageProducer:
    """Fails every batch with ``error`` for the first ``failures`` sends, as aiokafka does when a partition
    has had no leader for longer than the request timeout; then takes them. ``capacity``: messages per batch."""

    def __init__(self, failures: int, error: Exception, capacity: int = 1_000) -> None:
        self.failures = failures
        self.error = error
        self.capacity = capacity
        self.sends = 0
        self.taken: list[tuple[str, int, list[tuple[bytes | None, bytes | None]]]] = []

    def create_batch(self) -> Any:
        producer = self

        class Bounded(FakeBatch):
            def append(self, *, key: bytes | None, value: bytes | None, timestamp: Any) -> object | None:
                return (
                    None
                    if len(self.items) >= producer.capacity
                    else super().append(key=key, value=value, timestamp=timestamp)
                )

        return Bounded()

    async def send_batch(self, batch: FakeBatch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.sends += 1
        if self.sends <= self.failures:
            fut.set_exception(self.error)
        else:
            self.taken.append((topic, partition, list(batch.items)))
            fut.set_result(None)
        return fut


def _outputs(n: int) -> dict[tuple[str, int], list[tuple[bytes | None, bytes | None]]]:
    return {("t.requests", 0): [(b"k%d" % i, b"v%d" % i) for i in range(n)], ("t.dead", 1): [(None, b"bad")]}


def test_a_batch_refused_for_want_of_a_leader_is_sent_again_until_taken(caplog: pytest.LogCaptureFixture) -> None:
    """An outage past the request timeout (aiokafka expires the batch with LeaderNotAvailableError even when
    idempotent) delays the step; it never fails it, and every message is taken exactly once."""
    producer = OutageProducer(failures=7, error=LeaderNotAvailableError())
    with caplog.at_level(logging.INFO, logger="ttft.produce"):
        asyncio.run(produce_batches(producer, _outputs(3), retry_s=0.0))  # type: ignore[arg-type]
    assert sorted(producer.taken) == [
        ("t.dead", 1, [(None, b"bad")]),
        ("t.requests", 0, [(b"k0", b"v0"), (b"k1", b"v1"), (b"k2", b"v2")]),
    ]
    assert "not taken by the broker" in caplog.text and "took the producer batch(es) it refused" in caplog.text


def test_only_the_refused_batches_are_sent_again() -> None:
    """Batches of one target partition that were taken are not sent twice when another was refused."""
    producer = OutageProducer(failures=1, error=LeaderNotAvailableError(), capacity=2)
    asyncio.run(produce_batches(producer, {("t", 0): [(None, b"%d" % i) for i in range(5)]}, retry_s=0.0))  # type: ignore[arg-type]
    messages = [value for _, _, items in producer.taken for _, value in items]
    assert sorted(messages) == [b"0", b"1", b"2", b"3", b"4"]  # the first batch (0, 1) once, after its retry


def test_an_error_a_retry_cannot_cure_fails_the_step() -> None:
    producer = OutageProducer(failures=1, error=MessageSizeTooLargeError())
    with pytest.raises(MessageSizeTooLargeError):
        asyncio.run(produce_batches(producer, _outputs(1), retry_s=0.0))  # type: ignore[arg-type]


def test_a_message_larger_than_a_batch_is_refused_before_anything_is_sent() -> None:
    producer = OutageProducer(failures=0, error=LeaderNotAvailableError(), capacity=0)
    with pytest.raises(ValueError, match="exceeds the producer's batch size"):
        asyncio.run(produce_batches(producer, _outputs(1), retry_s=0.0))  # type: ignore[arg-type]
    assert producer.sends == 0


class NoMetadataProducer(OutageProducer):
    """``send_batch`` itself raises for the first ``failures`` calls, as aiokafka does when it could not
    fetch the topic's metadata within the request timeout (the broker down when the topic was first used)."""

    async def send_batch(self, batch: FakeBatch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        if self.sends < self.failures:
            self.sends += 1
            raise UnknownTopicOrPartitionError()
        self.sends += 1
        self.taken.append((topic, partition, list(batch.items)))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


def test_a_send_refused_before_it_was_queued_is_sent_again() -> None:
    """The writer's CI fault run with the broker down 45 s: the first send to a topic waited 40 s for its
    metadata and raised UnknownTopicOrPartitionError, which ended the writer."""
    producer = NoMetadataProducer(failures=3, error=UnknownTopicOrPartitionError())
    asyncio.run(produce_batches(producer, _outputs(2), retry_s=0.0))  # type: ignore[arg-type]
    assert sorted(topic for topic, _, _ in producer.taken) == ["t.dead", "t.requests"]


class FlakyPublisherProducer:
    """aiokafka's per-message ``send``: raises for the first ``raise_first`` calls, then returns acknowledgements
    of which the first ``fail_first`` fail with a retriable error."""

    def __init__(self, raise_first: int, fail_first: int) -> None:
        self.raise_first, self.fail_first = raise_first, fail_first
        self.calls = 0
        self.taken: list[bytes] = []

    async def send(self, topic: str, *, value: bytes, key: bytes) -> asyncio.Future[Any]:
        self.calls += 1
        if self.calls <= self.raise_first:
            raise UnknownTopicOrPartitionError()
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.calls <= self.raise_first + self.fail_first:
            fut.set_exception(NodeNotReadyError())
        else:
            self.taken.append(value)
            fut.set_result(None)
        return fut


def test_the_writers_aggregate_rows_ride_out_an_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(produce, "RETRY_S", 0.0)
    producer = FlakyPublisherProducer(raise_first=2, fail_first=2)

    async def publish_and_flush() -> None:
        publisher = TopicPublisher(Settings())
        publisher.producer = producer  # type: ignore[assignment]
        for i in range(3):
            await publisher.publish("t.stage-windows", b"k", b"%d" % i)
        await publisher.flush()

    asyncio.run(publish_and_flush())
    assert sorted(producer.taken) == [b"0", b"1", b"2"]


class SlowSendProducer:
    """``send`` yields to the loop before it returns its (already acknowledged or pending) future."""

    def __init__(self) -> None:
        self.acks: list[asyncio.Future[Any]] = []

    async def send(self, topic: str, *, value: bytes, key: bytes) -> asyncio.Future[Any]:
        await asyncio.sleep(0.01)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.acks.append(fut)
        return fut


def test_a_row_published_while_a_flush_waits_is_awaited_by_a_flush() -> None:
    """A window close publishes while the writer's batch hook flushes: its row must land in a list some
    flush awaits (it used to go into the list the running flush had taken, unawaited; CI: the zip of that
    list with its acknowledgements came up short and the writer exited)."""
    producer = SlowSendProducer()

    async def concurrent() -> tuple[bool, int]:
        publisher = TopicPublisher(Settings())
        publisher.producer = producer  # type: ignore[assignment]
        await publisher.publish("t", b"k", b"0")
        late = asyncio.create_task(publisher.publish("t", b"k", b"1"))  # its send is waiting
        flushing = asyncio.create_task(publisher.flush())
        await asyncio.sleep(0)
        producer.acks[0].set_result(None)
        await late
        await flushing
        waiting = len(publisher._pending)
        second = asyncio.create_task(publisher.flush())
        await asyncio.sleep(0)
        done_before_ack = second.done()
        producer.acks[1].set_result(None)
        await second
        return done_before_ack, waiting

    done_before_ack, waiting = asyncio.run(concurrent())
    assert waiting == 1 and not done_before_ack  # the late row waits for the next flush, which awaits its ack


class Tally:
    """A counter's ``inc`` (``ttft_produce_refused_total``)."""

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount


def test_every_refusal_is_counted_for_on_call() -> None:
    """``ttft_produce_refused_total{what="batch"}``: 3 refusals of the 2 chunks, counted as each retry is due."""
    producer = OutageProducer(failures=3, error=NodeNotReadyError())
    tally = Tally()
    asyncio.run(produce_batches(producer, _outputs(2), retry_s=0.0, counter=tally))  # type: ignore[arg-type]
    assert tally.value == 3


def test_a_refused_row_is_counted_and_a_row_refused_before_it_was_queued_flushes_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The publisher does not queue rows behind a broker that is away: the first row refused before it was
    queued flushes, which sends it again until the broker is back."""
    monkeypatch.setattr(produce, "RETRY_S", 0.0)
    producer = FlakyPublisherProducer(raise_first=1, fail_first=0)
    tally = Tally()

    async def publish_one() -> int:
        publisher = TopicPublisher(Settings(), refused=tally)
        publisher.producer = producer  # type: ignore[assignment]
        await publisher.publish("t.stage-windows", b"k", b"0")
        return len(publisher._pending)

    assert asyncio.run(publish_one()) == 0  # flushed by the publish itself
    assert producer.taken == [b"0"] and tally.value == 1
