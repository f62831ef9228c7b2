"""The service helper: time the stages of a request and publish them to ``ttft.stage-events``.

Instrumentation must not slow what it measures. Every call on the request path is synchronous, takes
microseconds and never raises into the service: events go into a bounded in-memory buffer, and a
background task ships them with aiokafka. When the buffer is full (Kafka away or slow) the oldest
event is dropped and counted in :attr:`StageEmitter.stats`. Duplicates from resends are harmless:
every event carries an ``event_id``, and the pipeline counts an event id once.

Usage (and the raw contract for other languages): ``docs/emitting.md``.

Times: all ``ts_ms`` of one request are ``wall clock at request() + monotonic elapsed``, so the
differences inside a request (TTFT, durations) are immune to wall-clock steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Literal

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaTimeoutError

log = logging.getLogger(__name__)

DEFAULT_TOPIC: Final = "ttft.stage-events"
_PRODUCER_DEFAULTS: Final[Mapping[str, Any]] = {
    "acks": 1,
    "linger_ms": 5,
    "request_timeout_ms": 10_000,
    "retry_backoff_ms": 200,
    "client_id": "ttft-emitter",
}

Rollout = Literal["stable", "canary"]


def event_json(
    request_id: str,
    tenant_id: str,
    stage: str,
    ts_ms: float,
    duration_ms: float | None = None,
    *,
    version_id: str | None = None,
    route: str | None = None,
    rollout: Rollout | None = None,
    fallback_level: int | None = None,
    event_id: str | None = None,
    attrs: Mapping[str, Any] | None = None,
) -> bytes:
    """The Kafka value of one stage event: compact UTF-8 JSON, absent fields omitted.

    The Kafka key is ``request_id.encode("utf-8")``. Raises ``TypeError`` when ``attrs`` holds a value
    JSON cannot represent (the emitter catches it and counts the event as ``invalid``).
    """
    event: dict[str, Any] = {"request_id": request_id, "tenant_id": tenant_id, "stage": stage, "ts_ms": ts_ms}
    if duration_ms is not None:
        event["duration_ms"] = duration_ms
    if version_id is not None:
        event["version_id"] = version_id
    if route is not None:
        event["route"] = route
    if rollout is not None:
        event["rollout"] = rollout
    if fallback_level is not None:
        event["fallback_level"] = fallback_level
    if event_id is not None:
        event["event_id"] = event_id
    if attrs:
        event["attrs"] = dict(attrs)
    return orjson.dumps(event)


@dataclass(frozen=True)
class EmitterStats:
    """Counters of a :class:`StageEmitter` (events)."""

    queued: int
    """In the buffer now, waiting to be sent."""
    sent: int
    """Acknowledged by Kafka."""
    dropped: int
    """Lost: evicted from a full buffer, refused before start/after stop, or unconfirmed at stop."""
    invalid: int
    """Not JSON-serialisable (bad attrs) or rejected by Kafka as unsendable (e.g. too large)."""
    connected: bool
    """Whether the background producer is connected right now."""


class StageEmitter:
    """Publishes stage events of one service to Kafka without ever blocking the request path.

    ``tenant_id``, ``version_id``, ``route`` and ``rollout`` are the service's defaults; each request may
    override them. ``max_buffer`` bounds memory: beyond it the oldest events are dropped (counted).
    Remaining keyword arguments go to ``aiokafka.AIOKafkaProducer`` (security settings, ``acks``...);
    ``producer_factory`` replaces that class (tests inject a fake with its start/send/stop).
    The request-path methods must be called from the event loop's thread.
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
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.tenant_id = tenant_id
        self.version_id = version_id
        self.route = route
        self.rollout = rollout
        self.max_buffer = max_buffer
        self._batch_size = batch_size
        self._flush_interval_s = flush_interval_s
        self._backoff_min, self._backoff_max = retry_backoff_s
        self._stop_timeout_s = stop_timeout_s
        self._wall = wall_clock
        self._mono = monotonic_clock
        self._producer_factory = producer_factory
        self._producer_kwargs = {**_PRODUCER_DEFAULTS, **aiokafka_kwargs}
        # (key, value, kafka timestamp ms); a full deque evicts the oldest entry on append.
        self._buffer: deque[tuple[bytes, bytes, int]] = deque(maxlen=max_buffer)
        self._in_flight = 0  # popped from the buffer, not yet confirmed or put back
        self._accepting = False
        self._task: asyncio.Task[None] | None = None
        self._producer: Any = None
        self._id_prefix = os.urandom(6).hex()
        self._id_counter = itertools.count(1)
        self._sent = self._dropped = self._invalid = 0

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start accepting events and connect to Kafka in the background; returns immediately."""
        if self._task is not None:
            return
        self._accepting = True
        self._task = asyncio.get_running_loop().create_task(self._run(), name="ttft-emitter")

    async def stop(self) -> None:
        """Stop accepting events, send what is buffered within ``stop_timeout_s``, then disconnect.

        Events still buffered afterwards are counted as dropped. Never raises.
        """
        self._accepting = False
        task, self._task = self._task, None
        if task is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), self._stop_timeout_s)
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        await self._close_producer()
        self._dropped += len(self._buffer) + self._in_flight
        self._buffer.clear()
        self._in_flight = 0

    @property
    def stats(self) -> EmitterStats:
        """A snapshot of the counters."""
        return EmitterStats(
            queued=len(self._buffer),
            sent=self._sent,
            dropped=self._dropped,
            invalid=self._invalid,
            connected=self._producer is not None,
        )

    def buffered(self) -> list[tuple[bytes, bytes]]:
        """The (key, value) messages waiting in the buffer, oldest first (for tests and debugging)."""
        return [(key, value) for key, value, _ in self._buffer]

    # --- the request path -----------------------------------------------------------------------

    def request(
        self,
        request_id: str,
        *,
        tenant_id: str | None = None,
        version_id: str | None = None,
        route: str | None = None,
        rollout: Rollout | None = None,
        fallback_level: int | None = None,
    ) -> RequestTiming:
        """A timer for one request; its clock anchor is taken now. Overrides the service defaults."""
        return RequestTiming(
            self,
            request_id,
            tenant_id=self.tenant_id if tenant_id is None else tenant_id,
            version_id=self.version_id if version_id is None else version_id,
            route=self.route if route is None else route,
            rollout=self.rollout if rollout is None else rollout,
            fallback_level=fallback_level,
        )

    def enqueue(self, key: bytes, value: bytes) -> None:
        """Buffer one ready-made message (Kafka key and value); never blocks, never raises."""
        if not self._accepting:
            self._dropped += 1
            return
        if len(self._buffer) >= self.max_buffer:
            self._dropped += 1  # the append below evicts the oldest event
        self._buffer.append((key, value, int(self._wall() * 1000.0)))

    def _next_event_id(self) -> str:
        return f"{self._id_prefix}-{next(self._id_counter)}"

    # --- the background sender ------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = self._backoff_min
        while self._accepting or self._buffer:
            if self._producer is None:
                if not await self._connect():
                    if not self._accepting:
                        return  # stopping and Kafka is away: stop() counts the rest as dropped
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, self._backoff_max)
                    continue
                backoff = self._backoff_min
            if not self._buffer:
                await asyncio.sleep(self._flush_interval_s)
                continue
            if await self._send_batch():
                backoff = self._backoff_min
            else:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._backoff_max)

    async def _connect(self) -> bool:
        factory = self._producer_factory or AIOKafkaProducer
        producer = factory(bootstrap_servers=self.bootstrap_servers, **self._producer_kwargs)
        try:
            await producer.start()
        except BaseException as exc:  # also cancellation by stop(): never leak an open client
            log.debug("ttft emitter: Kafka unreachable (%r)", exc)
            with contextlib.suppress(Exception):
                await producer.stop()
            if not isinstance(exc, Exception):
                raise
            return False
        self._producer = producer
        return True

    async def _send_batch(self) -> bool:
        """Send up to ``batch_size`` events; puts back what failed for a retriable reason."""
        batch = [self._buffer.popleft() for _ in range(min(self._batch_size, len(self._buffer)))]
        self._in_flight = len(batch)
        pending: list[tuple[tuple[bytes, bytes, int], asyncio.Future[Any]]] = []
        retry: list[tuple[bytes, bytes, int]] = []
        for i, item in enumerate(batch):
            key, value, ts = item
            try:
                pending.append((item, await self._producer.send(self.topic, value=value, key=key, timestamp_ms=ts)))
            except Exception as exc:
                if _retriable(exc):
                    retry = batch[i:]  # no metadata or a full send buffer: the rest waits too
                    break
                self._invalid += 1
        results = await asyncio.gather(*(future for _, future in pending), return_exceptions=True)
        for (item, _), result in zip(pending, results, strict=True):
            if not isinstance(result, BaseException):
                self._sent += 1
            elif _retriable(result):
                retry.append(item)
            else:
                self._invalid += 1
        self._in_flight = 0
        if retry:
            self._requeue(retry)
        return not retry

    def _requeue(self, items: list[tuple[bytes, bytes, int]]) -> None:
        # Failed events go back in front; if that overflows the buffer, the newest fall off the end.
        overflow = len(self._buffer) + len(items) - self.max_buffer
        if overflow > 0:
            self._dropped += overflow
        self._buffer.extendleft(reversed(items))

    async def _close_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                await asyncio.wait_for(producer.stop(), self._stop_timeout_s)


def _retriable(exc: BaseException) -> bool:
    # aiokafka marks transient broker errors retriable; for us timeouts and lost connections are too.
    retriable_types = (KafkaTimeoutError, asyncio.TimeoutError, ConnectionError)
    return bool(getattr(exc, "retriable", False)) or isinstance(exc, retriable_types)


class RequestTiming:
    """Stage timing of one request. Obtained from :meth:`StageEmitter.request`; nothing here raises."""

    def __init__(
        self,
        emitter: StageEmitter,
        request_id: str,
        *,
        tenant_id: str,
        version_id: str | None,
        route: str | None,
        rollout: Rollout | None,
        fallback_level: int | None,
    ) -> None:
        self._emitter = emitter
        self.request_id = request_id if isinstance(request_id, str) else str(request_id)
        self.tenant_id = tenant_id
        self.version_id = version_id
        self.route = route
        self.rollout = rollout
        self.fallback_level = fallback_level
        self._key = self.request_id.encode("utf-8", "replace")
        self._wall0_ms = emitter._wall() * 1000.0
        self._mono0 = emitter._mono()

    def now_ms(self) -> float:
        """Epoch ms on this request's clock: the wall-clock anchor plus monotonic elapsed time."""
        return self._wall0_ms + (self._emitter._mono() - self._mono0) * 1000.0

    def request_start(self, attrs: Mapping[str, Any] | None = None) -> None:
        """Record the ``request_start`` instant (now)."""
        self.record("request_start", self.now_ms(), None, attrs)

    def first_token(self, attrs: Mapping[str, Any] | None = None) -> None:
        """Record the ``first_token`` instant (now): the moment the first token reached the caller."""
        self.record("first_token", self.now_ms(), None, attrs)

    def stage(self, name: str, attrs: Mapping[str, Any] | None = None) -> StageSpan:
        """A span timer: ``async with req.stage("retrieval"):`` (or plain ``with``).

        The event is emitted when the block exits, also when it raises (the time was spent; a retry
        of the stage is summed by the pipeline). Attributes may be added inside: ``span.attrs[k] = v``.
        """
        return StageSpan(self, name, attrs)

    def record(
        self, stage: str, ts_ms: float, duration_ms: float | None, attrs: Mapping[str, Any] | None = None
    ) -> None:
        """Record a stage measured elsewhere (e.g. prefill time reported by the model server)."""
        emitter = self._emitter
        try:
            value = event_json(
                self.request_id,
                self.tenant_id,
                stage,
                ts_ms,
                duration_ms,
                version_id=self.version_id,
                route=self.route,
                rollout=self.rollout,
                fallback_level=self.fallback_level,
                event_id=emitter._next_event_id(),
                attrs=attrs,
            )
        except Exception:
            emitter._invalid += 1
            return
        emitter.enqueue(self._key, value)


class StageSpan:
    """Times one span stage with the monotonic clock; emits its event on exit."""

    def __init__(self, request: RequestTiming, name: str, attrs: Mapping[str, Any] | None) -> None:
        self._request = request
        self.name = name
        self.attrs: dict[str, Any] = dict(attrs) if attrs else {}
        self._start_ms = 0.0

    def __enter__(self) -> StageSpan:
        self._start_ms = self._request.now_ms()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        duration = max(self._request.now_ms() - self._start_ms, 0.0)
        self._request.record(self.name, self._start_ms, duration, self.attrs or None)

    async def __aenter__(self) -> StageSpan:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(exc_type, exc, tb)
