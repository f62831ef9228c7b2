"""The background sender: drains an :class:`~ttft_emit.buffer.EventBuffer` to Kafka with aiokafka.

It runs as a task on the service's event loop (:class:`~ttft_emit.StageEmitter`) or on its own loop in a
daemon thread (:class:`~ttft_emit.ThreadedStageEmitter`); either way the request path only ever touches
the buffer. Connects in the background, retries connection and retriable send failures with doubling
back-off, counts unsendable messages as ``invalid``. Resends are harmless: every event carries an
``event_id`` the pipeline counts once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaTimeoutError

from ttft_emit.buffer import EventBuffer, Message

log = logging.getLogger("ttft_emit")

PRODUCER_DEFAULTS: Final[Mapping[str, Any]] = {
    "acks": 1,
    "linger_ms": 5,
    "request_timeout_ms": 10_000,
    "retry_backoff_ms": 200,
    "client_id": "ttft-emitter",
}


class KafkaSender:
    """Sends the buffer's messages to ``topic`` in batches of up to ``batch_size``.

    ``producer_factory`` replaces ``aiokafka.AIOKafkaProducer`` (tests inject a fake with its
    start/send/stop); ``producer_kwargs`` go to it, over :data:`PRODUCER_DEFAULTS`.
    """

    def __init__(
        self,
        buffer: EventBuffer,
        bootstrap_servers: str | list[str],
        topic: str,
        *,
        batch_size: int,
        flush_interval_s: float,
        retry_backoff_s: tuple[float, float],
        stop_timeout_s: float,
        producer_factory: Callable[..., Any] | None,
        producer_kwargs: Mapping[str, Any],
    ) -> None:
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        self.buffer = buffer
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.backoff_min, self.backoff_max = retry_backoff_s
        self.stop_timeout_s = stop_timeout_s
        self._producer_factory = producer_factory
        self._producer_kwargs = {**PRODUCER_DEFAULTS, **producer_kwargs}
        self._producer: Any = None

    @property
    def connected(self) -> bool:
        return self._producer is not None

    async def run(self) -> None:
        """Send until the buffer is closed and empty, or closed while Kafka is away."""
        buffer = self.buffer
        backoff = self.backoff_min
        while buffer.accepting or len(buffer):
            if self._producer is None:
                if not await self._connect():
                    if not buffer.accepting:
                        return  # stopping and Kafka is away: the caller counts the rest as dropped
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, self.backoff_max)
                    continue
                backoff = self.backoff_min
            if not len(buffer):
                await asyncio.sleep(self.flush_interval_s)
                continue
            if await self._send_batch():
                backoff = self.backoff_min
            else:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.backoff_max)

    async def finish(self, task: asyncio.Task[None]) -> None:
        """Stop ``task`` (this sender's :meth:`run`) within ``stop_timeout_s``, then disconnect.

        The buffer must already be closed. What is left afterwards is counted as dropped. Never raises.
        """
        with contextlib.suppress(Exception, asyncio.CancelledError):  # incl. a timeout, or a failed sender
            await asyncio.wait_for(asyncio.shield(task), self.stop_timeout_s)
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        await self.close_producer()
        self.buffer.discard()

    async def close_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                await asyncio.wait_for(producer.stop(), self.stop_timeout_s)

    async def _connect(self) -> bool:
        factory = self._producer_factory or AIOKafkaProducer
        try:
            producer = factory(bootstrap_servers=self.bootstrap_servers, **self._producer_kwargs)
        except Exception as exc:  # a bad producer option: retried like a refused connection, but said loudly
            log.warning("ttft emitter: cannot create the Kafka producer: %r", exc)
            return False
        try:
            await producer.start()
        except BaseException as exc:  # also cancellation at stop: never leak an open client
            log.debug("ttft emitter: Kafka unreachable (%r)", exc)
            with contextlib.suppress(Exception):
                await producer.stop()
            if not isinstance(exc, Exception):
                raise
            return False
        self._producer = producer
        return True

    async def _send_batch(self) -> bool:
        """Send one batch; puts back in front what failed for a retriable reason. True if nothing did."""
        batch = self.buffer.take(self.batch_size)
        pending: list[tuple[Message, asyncio.Future[Any]]] = []
        retry: list[Message] = []
        invalid = 0
        for i, item in enumerate(batch):
            key, value, ts = item
            try:
                pending.append((item, await self._producer.send(self.topic, value=value, key=key, timestamp_ms=ts)))
            except Exception as exc:
                if retriable(exc):
                    retry = batch[i:]  # no metadata or a full send buffer: the rest waits too
                    break
                invalid += 1
        results = await asyncio.gather(*(future for _, future in pending), return_exceptions=True)
        sent = 0
        for (item, _), result in zip(pending, results):
            if not isinstance(result, BaseException):
                sent += 1
            elif retriable(result):
                retry.append(item)
            else:
                invalid += 1
        self.buffer.settle(len(batch), sent, invalid, retry)
        return not retry


def retriable(exc: BaseException) -> bool:
    """aiokafka marks transient broker errors retriable; for us timeouts and lost connections are too."""
    retriable_types = (KafkaTimeoutError, asyncio.TimeoutError, ConnectionError)
    return bool(getattr(exc, "retriable", False)) or isinstance(exc, retriable_types)
