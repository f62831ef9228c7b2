"""The emitter of asyncio services: the sender is a task on the service's own event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from ttft_emit.event import DEFAULT_TOPIC, Rollout
from ttft_emit.sender import KafkaSender
from ttft_emit.timing import EmitterCore


class StageEmitter(EmitterCore):
    """Publishes stage events of one asyncio service to Kafka without ever blocking the request path.

    ``tenant_id``, ``version_id``, ``route`` and ``rollout`` are the service's defaults; each request may
    override them. ``max_buffer`` bounds memory: beyond it the oldest events are dropped (counted).
    Remaining keyword arguments go to ``aiokafka.AIOKafkaProducer`` (security settings, ``acks``...);
    ``producer_factory`` replaces that class (tests inject a fake with its start/send/stop).
    The request-path methods are meant for the event loop's thread; a synchronous (WSGI, threaded)
    service uses :class:`~ttft_emit.ThreadedStageEmitter` instead.
    """

    def __init__(
        self,
        bootstrap_servers: str | list[str],
        topic: str = DEFAULT_TOPIC,
        *,
        tenant_id: str,
        version_id: str | None = None,
        route: str | None = None,
        rollout: Rollout | None = None,
        max_buffer: int = 10_000,
        batch_size: int = 500,
        flush_interval_s: float = 0.05,
        retry_backoff_s: tuple[float, float] = (0.1, 5.0),
        stop_timeout_s: float = 5.0,
        wall_clock: Callable[[], float] = time.time,
        monotonic_clock: Callable[[], float] = time.monotonic,
        producer_factory: Callable[..., Any] | None = None,
        **aiokafka_kwargs: Any,
    ) -> None:
        if max_buffer <= 0 or batch_size <= 0:
            raise ValueError("max_buffer and batch_size must be positive")
        super().__init__(
            tenant_id=tenant_id,
            version_id=version_id,
            route=route,
            rollout=rollout,
            max_buffer=max_buffer,
            wall_clock=wall_clock,
            monotonic_clock=monotonic_clock,
        )
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self._sender = KafkaSender(
            self._buffer,
            bootstrap_servers,
            topic,
            batch_size=batch_size,
            flush_interval_s=flush_interval_s,
            retry_backoff_s=retry_backoff_s,
            stop_timeout_s=stop_timeout_s,
            producer_factory=producer_factory,
            producer_kwargs=aiokafka_kwargs,
        )
        self._task: asyncio.Task[None] | None = None

    @property
    def connected(self) -> bool:
        return self._sender.connected

    async def start(self) -> None:
        """Start accepting events and connect to Kafka in the background; returns immediately."""
        if self._task is not None:
            return
        self._buffer.open()
        self._task = asyncio.get_running_loop().create_task(self._sender.run(), name="ttft-emitter")

    async def stop(self) -> None:
        """Stop accepting events, send what is buffered within ``stop_timeout_s``, then disconnect.

        Events still buffered afterwards are counted as dropped. Never raises; a second call does nothing.
        """
        self._buffer.close()
        task, self._task = self._task, None
        if task is None:
            await self._sender.close_producer()
            self._buffer.discard()
            return
        await self._sender.finish(task)
