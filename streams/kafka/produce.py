"""Producing what a step emitted, through broker outages of any length.

aiokafka fails a batch once it is older than ``request_timeout_ms`` (40 s by default) and the broker has
still not taken it: the error is retriable (``NodeNotReadyError``, ``LeaderNotAvailableError``,
``RequestTimedOutError``), it is what a broker restart slower than that looks like, and failing the step
there would end the worker for an outage its consumer rides out. So a chunk that fails with a *retriable*
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
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

log = logging.getLogger("ttft.produce")

#: Seconds between two sends of a chunk that failed with a retriable error.
RETRY_S = 1.0

#: A retry is logged at the first failure, then at most this often while the broker stays away.
RETRY_LOG_EVERY_S = 30.0

Key = bytes | None
Message = tuple[Key, bytes | None]
Chunk = tuple[str, int, list[Message]]


def retriable(result: object) -> bool:
    """A send failed in a way that a later send of the same records can cure (the broker away, no leader)."""
    return isinstance(result, KafkaError) and bool(getattr(result, "retriable", False))


def chunks(producer: AIOKafkaProducer, outputs: dict[tuple[str, int], list[Message]]) -> list[Chunk]:
    """Split each target partition's messages into runs that each fit one producer batch."""
    out: list[Chunk] = []
    for (topic, partition), items in outputs.items():
        batch, run = producer.create_batch(), list[Message]()
        for key, value in items:
            if batch.append(key=key, value=value, timestamp=None) is None:
                if not run:
                    raise ValueError(f"a message for {topic}[{partition}] exceeds the producer's batch size")
                out.append((topic, partition, run))
                batch, run = producer.create_batch(), list[Message]()
                if batch.append(key=key, value=value, timestamp=None) is None:
                    raise ValueError(f"a message for {topic}[{partition}] exceeds the producer's batch size")
            run.append((key, value))
        if run:
            out.append((topic, partition, run))
    return out


async def send_chunk(producer: AIOKafkaProducer, chunk: Chunk) -> asyncio.Future[Any]:
    """Send one chunk as one batch to its explicit partition (no per-message partitioner)."""
    topic, partition, messages = chunk
    batch = producer.create_batch()
    for key, value in messages:
        batch.append(key=key, value=value, timestamp=None)
    future: asyncio.Future[Any] = await producer.send_batch(batch, topic, partition=partition)
    return future


async def produce_batches(
    producer: AIOKafkaProducer, outputs: dict[tuple[str, int], list[Message]], *, retry_s: float = RETRY_S
) -> None:
    """One producer batch per (topic, partition) run, all sent, then every acknowledgement awaited; the
    chunks that failed with a retriable error are sent again until the broker takes them."""
    pending = chunks(producer, outputs)
    first_failure: float | None = None
    logged = 0.0
    while pending:
        futures = [await send_chunk(producer, chunk) for chunk in pending]
        results = await asyncio.gather(*futures, return_exceptions=True)
        failed = [(chunk, r) for chunk, r in zip(pending, results, strict=True) if isinstance(r, BaseException)]
        for _, error in failed:
            if not retriable(error):
                raise error
        pending = [chunk for chunk, _ in failed]
        if not pending:
            break
        now = time.monotonic()
        if first_failure is None or now - logged >= RETRY_LOG_EVERY_S:
            first_failure = first_failure if first_failure is not None else now
            logged = now
            log.warning(
                "%d producer batch(es) not taken by the broker (%s, first %s[%d]); sending them again every %.1f s "
                "(for %.0f s so far); nothing is committed until they are",
                len(pending),
                failed[0][1],
                pending[0][0],
                pending[0][1],
                retry_s,
                now - first_failure,
            )
        await asyncio.sleep(retry_s)
    if first_failure is not None:
        log.info("the broker took the batches it refused, after %.1f s", time.monotonic() - first_failure)
