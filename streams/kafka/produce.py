"""Producing what a step emitted, through broker outages of any length.

aiokafka fails a batch once it is older than ``request_timeout_ms`` (40 s by default) and the broker has
still not taken it, and a send to a topic whose metadata it could not fetch in that time: the error is
retriable (``NodeNotReadyError``, ``LeaderNotAvailableError``, ``UnknownTopicOrPartitionError``), it is what
a broker restart slower than that looks like, and failing the step there would end the worker for an
outage its consumer rides out. So a chunk that fails with a *retriable*
error is sent again, every :data:`RETRY_S`, until the broker takes it; anything else still fails the step
(the process then exits uncommitted, :func:`streams.kafka.batches.exit_uncommitted`).

Not idempotence: aiokafka's idempotent producer expires such a batch too, and a later batch of its
partition can then be refused with ``OutOfOrderSequenceNumber``, which no retry cures (aiokafka does not
reset the sequence as the Java client does; seen here with the broker down 45 s).

A chunk sent again can reach its topic twice (its first send written, the answer lost); every output is
idempotent where it lands (stage events and requests are keyed by request, changelogs are compacted, dead
letters are keyed by source offset), as after a restart's replay.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

log = logging.getLogger("ttft.produce")

#: Seconds between two sends of a chunk that failed with a retriable error.
RETRY_S = 1.0

#: A retry is logged at the first failure, then at most this often while the broker stays away.
RETRY_LOG_EVERY_S = 30.0

Key = bytes | None
Message = tuple[Key, bytes | None]
T = TypeVar("T")


def retriable(result: object) -> bool:
    """A send failed in a way that a later send of the same records can cure (the broker away, no leader)."""
    return isinstance(result, KafkaError) and bool(getattr(result, "retriable", False))


@dataclass
class Chunk:
    """One producer batch's worth of one target partition's messages."""

    topic: str
    partition: int
    messages: list[Message] = field(default_factory=list)
    #: Built while splitting, for the first send; a send again builds a new one (a sent batch is spent).
    batch: Any = None


def chunks(producer: AIOKafkaProducer, outputs: dict[tuple[str, int], list[Message]]) -> list[Chunk]:
    """Split each target partition's messages into runs that each fit one producer batch (each message is
    appended once: the batches built here are the ones the first send uses)."""
    out: list[Chunk] = []
    for (topic, partition), items in outputs.items():
        chunk = Chunk(topic, partition, batch=producer.create_batch())
        for key, value in items:
            if chunk.batch.append(key=key, value=value, timestamp=None) is None:
                if not chunk.messages:
                    raise ValueError(f"a message for {topic}[{partition}] exceeds the producer's batch size")
                out.append(chunk)
                chunk = Chunk(topic, partition, batch=producer.create_batch())
                if chunk.batch.append(key=key, value=value, timestamp=None) is None:
                    raise ValueError(f"a message for {topic}[{partition}] exceeds the producer's batch size")
            chunk.messages.append((key, value))
        if chunk.messages:
            out.append(chunk)
    return out


async def send_chunk(producer: AIOKafkaProducer, chunk: Chunk) -> asyncio.Future[Any]:
    """Send one chunk as one batch to its explicit partition (no per-message partitioner)."""
    batch, chunk.batch = chunk.batch, None
    if batch is None:
        batch = producer.create_batch()
        for key, value in chunk.messages:
            batch.append(key=key, value=value, timestamp=None)
    future: asyncio.Future[Any] = await producer.send_batch(batch, chunk.topic, partition=chunk.partition)
    return future


class Retry:
    """Paces and logs what the broker refused: the first refusal, then every :data:`RETRY_LOG_EVERY_S`."""

    def __init__(self, what: str, retry_s: float | None = None, counter: Any = None) -> None:
        self.what, self.retry_s = what, RETRY_S if retry_s is None else retry_s
        #: A Prometheus counter (or None) that counts every refusal, ``ttft_produce_refused_total``.
        self.counter = counter
        self.since: float | None = None
        self._logged = 0.0

    async def after(self, refused: int, error: BaseException) -> None:
        """Wait before sending ``refused`` items again; raise ``error`` when no retry can cure it."""
        if not retriable(error):
            raise error
        if self.counter is not None:
            self.counter.inc(refused)
        now = time.monotonic()
        if self.since is None or now - self._logged >= RETRY_LOG_EVERY_S:
            self.since = now if self.since is None else self.since
            self._logged = now
            log.warning(
                "%d %s not taken by the broker (%s); sending them again every %.1f s (for %.0f s so far); "
                "nothing is committed until they are",
                refused,
                self.what,
                error,
                self.retry_s,
                now - self.since,
            )
        await asyncio.sleep(self.retry_s)

    def done(self) -> None:
        if self.since is not None:
            log.warning("the broker took the %s it refused, after %.1f s", self.what, time.monotonic() - self.since)
            self.since = None


def refused(error: BaseException) -> asyncio.Future[Any]:
    """A send that failed before it was queued (aiokafka waits ``request_timeout_ms`` for the topic's
    metadata, then raises), as a failed acknowledgement."""
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_exception(error)
    return future


async def queued(send: Callable[[T], Awaitable[asyncio.Future[Any]]], item: T) -> asyncio.Future[Any]:
    """``send(item)``'s acknowledgement; a send refused before it was queued gives a failed one."""
    try:
        return await send(item)
    except KafkaError as exc:
        return refused(exc)


async def settle(
    sent: list[tuple[T, asyncio.Future[Any]]], send: Callable[[T], Awaitable[asyncio.Future[Any]]], retry: Retry
) -> None:
    """Await every acknowledgement of ``sent`` (item, acknowledgement) pairs; the items refused with a
    retriable error are sent again, paced by ``retry``, until the broker takes them; anything else raises."""
    while sent:
        results = await asyncio.gather(*(future for _, future in sent), return_exceptions=True)
        failed = [(item, r) for (item, _), r in zip(sent, results, strict=True) if isinstance(r, BaseException)]
        for _, error in failed:
            if not retriable(error):
                raise error
        sent = []
        if failed:
            await retry.after(len(failed), failed[0][1])
            for item, _ in failed:
                sent.append((item, await queued(send, item)))
    retry.done()


async def produce_batches(
    producer: AIOKafkaProducer,
    outputs: dict[tuple[str, int], list[Message]],
    *,
    retry_s: float | None = None,
    counter: Any = None,
) -> None:
    """One producer batch per (topic, partition) run, sent in order, then every acknowledgement awaited; the
    chunks refused with a retriable error are sent again until the broker takes them (``counter``, a Prometheus
    counter, counts each refusal)."""

    async def send(chunk: Chunk) -> asyncio.Future[Any]:
        return await send_chunk(producer, chunk)

    sent = []
    for chunk in chunks(producer, outputs):
        sent.append((chunk, await queued(send, chunk)))
    await settle(sent, send, Retry("producer batch(es)", retry_s, counter=counter))
