from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from aiokafka import TopicPartition

from streams.alerting import outbox
from streams.alerting.outbox import DeliveryOptions, alert_message, run_delivery_loop
from streams.app.metrics import WorkerMetrics
from streams.rules import AlertTransition
from streams.settings import Settings

TOPIC = "ttft.alerts"


def transition(tenant: str, state: str, at: float) -> AlertTransition:
    labels = {"alertname": "TTFTStageRegression", "tenant": tenant, "stage": "retrieval", "severity": "page"}
    return AlertTransition(
        "TTFTStageRegression",
        labels,
        {"summary": "s", "description": "d", "runbook_url": "u"},
        {},
        state,  # type: ignore[arg-type]
        at,
        0.0,
        0.0,
        at if state == "resolved" else None,
    )


class Sink:
    """Alertmanager: down for the first ``down_posts`` posts."""

    refusal: str | None = None

    def __init__(self, down_posts: int) -> None:
        self.down_posts = down_posts
        self.posts: list[list[Mapping[str, Any]]] = []

    async def post(self, alerts: Sequence[Mapping[str, Any]]) -> bool:
        self.posts.append(list(alerts))
        return len(self.posts) > self.down_posts


class Consumer:
    """``ttft.alerts`` with one partition: serves ``polls`` in order, then sets ``done``."""

    polls: ClassVar[list[list[AlertTransition]]] = []
    done: ClassVar[asyncio.Event]

    def __init__(self, **_: Any) -> None:
        self.offset = 0

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def assign(self, tps: list[TopicPartition]) -> None:
        return None

    async def committed(self, tp: TopicPartition) -> int | None:
        return None

    async def seek_to_beginning(self, *tps: TopicPartition) -> None:
        return None

    async def commit(self) -> None:
        return None

    async def getmany(self, *tps: TopicPartition, timeout_ms: int, max_records: int) -> dict[TopicPartition, Any]:
        if not Consumer.polls:
            Consumer.done.set()
            return {}
        batch = []
        for t in Consumer.polls.pop(0):
            batch.append(SimpleNamespace(offset=self.offset, value=alert_message(t)[1]))
            self.offset += 1
        return {TopicPartition(TOPIC, 0): batch} if batch else {}


@pytest.fixture
def consumer(monkeypatch: pytest.MonkeyPatch) -> type[Consumer]:
    async def partitions(settings: Settings, topic: str) -> list[int]:
        return [0]

    monkeypatch.setattr(outbox, "AIOKafkaConsumer", Consumer)
    monkeypatch.setattr(outbox, "topic_partitions", partitions)
    return Consumer


def test_the_gauge_counts_what_alertmanager_has_not_accepted_yet(consumer: type[Consumer]) -> None:
    metrics = WorkerMetrics("writer", "w-1")
    seen: list[int] = []

    def on_pending(n: int) -> None:
        metrics.alerts_pending_delivery.set(n)
        seen.append(n)

    consumer.polls = [
        [transition("a", "firing", 60_000.0), transition("b", "firing", 60_000.0)],
        [],  # Alertmanager still down: both stay owed
        [transition("c", "pending", 120_000.0)],  # pending alerts are not paged: not owed
        [transition("a", "resolved", 180_000.0)],  # Alertmanager is back
        [],
    ]
    sink = Sink(down_posts=3)

    async def scenario() -> None:
        consumer.done = asyncio.Event()
        options = DeliveryOptions(poll_timeout_ms=1, retry_initial_s=0.001, retry_max_s=0.001)
        await run_delivery_loop(Settings(), sink, consumer.done, options=options, on_pending=on_pending)

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert seen[:4] == [2, 2, 2, 0]
    assert metrics.registry.get_sample_value("ttft_alerts_pending_delivery") == 0
    assert [len(p) for p in sink.posts][-1] == 2  # resolution of a and firing b, delivered together


def test_a_muted_loop_owes_nothing(consumer: type[Consumer]) -> None:
    seen: list[int] = []
    consumer.polls = [[transition("a", "firing", 60_000.0)]]

    async def scenario() -> None:
        consumer.done = asyncio.Event()
        options = DeliveryOptions(poll_timeout_ms=1, paging_muted=True)
        await run_delivery_loop(Settings(), Sink(down_posts=99), consumer.done, options=options, on_pending=seen.append)

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert seen and set(seen) == {0}
