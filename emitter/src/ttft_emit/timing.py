"""Stage timing of one request, shared by both emitters; nothing here blocks or raises into the service.

Times: all ``ts_ms`` of one request are ``wall clock at request() + monotonic elapsed``, so the
differences inside a request (TTFT, durations) are immune to wall-clock steps.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from ttft_emit.buffer import EmitterStats, EventBuffer
from ttft_emit.event import Rollout, event_json


class EmitterCore:
    """What both emitters share: the service defaults, the clocks, event ids and the bounded buffer.

    ``tenant_id``, ``version_id``, ``route`` and ``rollout`` are the service's defaults; each request may
    override them. ``max_buffer`` bounds memory: beyond it the oldest events are dropped (counted).
    """

    def __init__(
        self,
        *,
        tenant_id: str,
        version_id: str | None,
        route: str | None,
        rollout: Rollout | None,
        max_buffer: int,
        wall_clock: Callable[[], float],
        monotonic_clock: Callable[[], float],
    ) -> None:
        self.tenant_id = tenant_id
        self.version_id = version_id
        self.route = route
        self.rollout = rollout
        self.max_buffer = max_buffer
        self._buffer = EventBuffer(max_buffer)
        self._wall = wall_clock
        self._mono = monotonic_clock
        self._new_id_prefix()

    def _new_id_prefix(self) -> None:
        # Unique per process (and per forked child): event ids never repeat across emitters.
        self._id_prefix = os.urandom(6).hex()
        self._id_counter = itertools.count(1)

    @property
    def connected(self) -> bool:
        """Whether the background producer is connected right now."""
        raise NotImplementedError

    @property
    def stats(self) -> EmitterStats:
        """A snapshot of the counters."""
        return self._buffer.stats(self.connected)

    def buffered(self) -> list[tuple[bytes, bytes]]:
        """The (key, value) messages waiting in the buffer, oldest first (for tests and debugging)."""
        return self._buffer.messages()

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
        self._buffer.put(key, value, int(self._wall() * 1000.0))

    def _next_event_id(self) -> str:
        # next() on itertools.count is one C call: atomic under the GIL, so ids are unique across threads.
        return f"{self._id_prefix}-{next(self._id_counter)}"


class RequestTiming:
    """Stage timing of one request. Obtained from ``emitter.request(...)``; nothing here raises."""

    def __init__(
        self,
        emitter: EmitterCore,
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
        """A span timer: ``with req.stage("retrieval"):`` (or ``async with``).

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
            emitter._buffer.count_invalid()
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
