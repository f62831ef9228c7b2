from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from aiokafka import AIOKafkaConsumer

from schemas.decode import decode_stage_event
from schemas.events import StageEvent
from streams.emit import StageEmitter
from streams.settings import Settings

pytestmark = pytest.mark.kafka

REQUESTS = 50


async def _consume(settings: Settings, expected: int, timeout_s: float) -> list[StageEvent]:
    topic = settings.topic("stage-events")
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    events: list[StageEvent] = []
    partitions: dict[str, set[int]] = {}
    try:
        deadline = time.monotonic() + timeout_s
        while len(events) < expected and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for messages in batch.values():
                for msg in messages:
                    decoded = decode_stage_event(
                        msg.value,
                        msg.key,
                        msg.topic,
                        msg.partition,
                        msg.offset,
                        msg.timestamp,
                        settings.caps,
                        time.time() * 1000,
                    )
                    assert isinstance(decoded, StageEvent), decoded
                    events.append(decoded)
                    partitions.setdefault(decoded.request_id, set()).add(msg.partition)
    finally:
        await consumer.stop()
    # keyed by request_id: every event of a request lands on one partition
    assert all(len(p) == 1 for p in partitions.values())
    return events


def test_emitted_events_arrive_and_decode(kafka_settings: Settings) -> None:
    async def scenario() -> list[StageEvent]:
        emitter = StageEmitter(
            kafka_settings.kafka_bootstrap,
            topic=kafka_settings.topic("stage-events"),
            tenant_id="租户-δ",
            version_id="v1",
            route="main",
            rollout="stable",
        )
        await emitter.start()
        run = uuid.uuid4().hex[:8]
        for i in range(REQUESTS):
            req = emitter.request(f'{run}-req-"{i}"')
            req.request_start()
            async with req.stage("retrieval", attrs={"retrieval_cache_hit": i % 2 == 0}):
                await asyncio.sleep(0)
            async with req.stage("prompt_assemble", attrs={"prompt_tokens": 100 + i}):
                pass
            with req.stage("llm_ttft"):
                pass
            req.first_token()
        deadline = time.monotonic() + 30
        while emitter.stats.sent < REQUESTS * 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await emitter.stop()
        stats = emitter.stats
        assert (stats.sent, stats.dropped, stats.invalid, stats.queued) == (REQUESTS * 5, 0, 0, 0)
        return await _consume(kafka_settings, REQUESTS * 5, timeout_s=30)

    events = asyncio.run(asyncio.wait_for(scenario(), 90))
    assert len(events) == REQUESTS * 5
    by_request: dict[str, list[StageEvent]] = {}
    for event in events:
        by_request.setdefault(event.request_id, []).append(event)
    assert len(by_request) == REQUESTS
    for request_events in by_request.values():
        stages = [e.stage for e in request_events]
        assert sorted(stages) == sorted(["request_start", "retrieval", "prompt_assemble", "llm_ttft", "first_token"])
        assert {e.tenant_id for e in request_events} == {"租户-δ"}
        ts = {e.stage: e.ts_ms for e in request_events}
        assert ts["request_start"] <= ts["retrieval"] <= ts["prompt_assemble"] <= ts["first_token"]


def test_events_buffered_while_connecting_are_sent_and_overflow_is_counted(kafka_settings: Settings) -> None:
    async def scenario() -> None:
        emitter = StageEmitter(
            kafka_settings.kafka_bootstrap,
            topic=kafka_settings.topic("stage-events"),
            tenant_id="acme",
            max_buffer=10,
        )
        t0 = time.perf_counter()
        await emitter.start()
        assert time.perf_counter() - t0 < 0.05
        for i in range(15):  # no await in between: the background connect has not even begun
            emitter.request(f"early-{i}").request_start()
        assert (emitter.stats.queued, emitter.stats.dropped) == (10, 5)
        deadline = time.monotonic() + 30
        while emitter.stats.sent < 10 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert emitter.stats.connected
        await emitter.stop()
        stats = emitter.stats
        assert (stats.sent, stats.dropped, stats.queued) == (10, 5, 0)

    asyncio.run(asyncio.wait_for(scenario(), 60))
