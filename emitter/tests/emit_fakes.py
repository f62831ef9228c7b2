"""A scripted stand-in for ``aiokafka.AIOKafkaProducer`` and a decoder of what the emitters buffer."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import orjson
from aiokafka.errors import KafkaConnectionError


class FakeProducer:
    """Scripted start failures and per-send outcomes; records what it sent. Thread-safe to read."""

    def __init__(self, script: ProducerScript, **kwargs: Any) -> None:
        self.script = script
        self.kwargs = kwargs
        self.stopped = False

    async def start(self) -> None:
        await asyncio.sleep(self.script.start_delay_s)
        if self.script.take_start_failure():
            raise KafkaConnectionError("refused")

    async def send(self, topic: str, value: bytes, key: bytes, timestamp_ms: int) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        outcome = self.script.next_outcome()
        if outcome is None:
            self.script.record(topic, key, value, timestamp_ms)
            future.set_result(None)
        else:
            future.set_exception(outcome)
        return future

    async def stop(self) -> None:
        self.stopped = True


class ProducerScript:
    """What every producer of one emitter does: the script spans all connect attempts, as with aiokafka."""

    def __init__(
        self, start_failures: int = 0, outcomes: list[BaseException | None] | None = None, start_delay_s: float = 0.0
    ) -> None:
        self.start_failures = start_failures
        self.start_delay_s = start_delay_s
        self.outcomes = list(outcomes or [])
        self.producers: list[FakeProducer] = []
        self.sent: list[tuple[str, bytes, bytes, int]] = []
        self._lock = threading.Lock()

    def factory(self, **kwargs: Any) -> FakeProducer:
        producer = FakeProducer(self, **kwargs)
        self.producers.append(producer)
        return producer

    def take_start_failure(self) -> bool:
        if self.start_failures > 0:
            self.start_failures -= 1
            return True
        return False

    def next_outcome(self) -> BaseException | None:
        return self.outcomes.pop(0) if self.outcomes else None

    def record(self, topic: str, key: bytes, value: bytes, timestamp_ms: int) -> None:
        with self._lock:
            self.sent.append((topic, key, value, timestamp_ms))

    def sent_events(self) -> list[dict[str, Any]]:
        with self._lock:
            return [orjson.loads(value) for _, _, value, _ in self.sent]


def decoded(messages: list[tuple[bytes, bytes]]) -> list[dict[str, Any]]:
    """Buffered (key, value) messages as event dicts; the key must be the request id."""
    events = []
    for key, value in messages:
        event = orjson.loads(value)
        assert key == event["request_id"].encode("utf-8")
        events.append(event)
    return events
