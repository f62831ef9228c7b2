"""What the writer does after each committed batch: close windows, publish aggregates, evaluate alerts."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaProducer

from streams.app.metrics import WorkerMetrics
from streams.app.window_closer import WindowCloser
from streams.kafka.topics import kafka_client_kwargs
from streams.settings import Settings


class TopicPublisher:
    """Produces aggregate rows; ``flush`` waits until the broker acknowledged them."""

    def __init__(self, settings: Settings) -> None:
        self.producer = AIOKafkaProducer(
            linger_ms=10, max_batch_size=1_048_576, acks="all", **kafka_client_kwargs(settings)
        )
        self._pending: list[asyncio.Future[Any]] = []

    async def start(self) -> None:
        await self.producer.start()

    async def stop(self) -> None:
        await self.flush()
        await self.producer.stop()

    async def publish(self, topic: str, key: bytes, value: bytes) -> None:
        self._pending.append(await self.producer.send(topic, value=value, key=key))
        if len(self._pending) >= 5_000:
            await self.flush()

    async def flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending:
            await asyncio.gather(*pending)


async def install_hooks(writer: Any, settings: Settings, metrics: WorkerMetrics) -> WindowCloser:
    """Attach the window closer (and through it the rule engine) to a started writer."""
    publisher = TopicPublisher(settings)
    await publisher.start()
    closer = WindowCloser(settings, metrics, writer.store_call, publisher.publish)
    await closer.recover()

    async def on_batch(records: list[dict[str, Any]]) -> None:
        await closer.on_records(records)
        await publisher.flush()

    writer.hooks.append(on_batch)
    writer.on_stop.append(publisher.stop)
    return closer
