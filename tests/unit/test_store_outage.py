import asyncio
from typing import Any

import orjson
import pytest

from streams.app import writer as writer_module
from streams.app.metrics import WorkerMetrics
from streams.app.store_outage import StoreOutage, halt_page
from streams.app.writer import StoreWriter
from streams.settings import load_settings
from streams.store.client import StoreUnavailable


def test_an_outage_pages_once_when_it_has_lasted_the_limit_and_resolves_at_the_next_success() -> None:
    now = [0.0]
    outage = StoreOutage(120.0, lambda: now[0])
    seen = []
    for t in (0.0, 60.0, 119.0, 120.0, 200.0, 400.0):
        now[0] = t
        seen.append(outage.failed())
    assert seen == [False, False, False, True, False, False]
    assert outage.succeeded() and not outage.succeeded()
    now[0] = 1_000.0
    assert not outage.failed()  # a new outage starts its own clock


def test_the_writer_pages_ttft_ingest_halted_while_the_store_refuses_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [0.0]
    settings = load_settings(topic_prefix="u", caps={"store_halt_page_s": 30.0})
    writer = StoreWriter(settings, WorkerMetrics("writer", "unit"), clock=lambda: now[0], stats_interval_s=None)
    published: list[tuple[str, bytes, bytes]] = []

    async def publish(topic: str, key: bytes, value: bytes) -> None:
        published.append((topic, key, value))

    writer.halt_page = halt_page(settings, publish)

    async def sleep(seconds: float) -> None:
        now[0] += seconds

    monkeypatch.setattr(writer_module.asyncio, "sleep", sleep)
    calls = [0]

    def insert() -> Any:
        calls[0] += 1
        if calls[0] <= 10:  # 0.2 + 0.4 + ... + 10 + 10 + 10: the store refuses for about 43 s
            raise StoreUnavailable("connection refused")
        return "stored"

    assert asyncio.run(writer._retry("insert into requests", insert)) == "stored"
    pages = [orjson.loads(value) for _, _, value in published]
    assert [(p["alertname"], p["state"]) for p in pages] == [
        ("TTFTIngestHalted", "firing"),
        ("TTFTIngestHalted", "resolved"),
    ]
    assert {topic for topic, _, _ in published} == {"u.alerts"} and pages[0]["fingerprint"] == pages[1]["fingerprint"]
    assert "refused every call" in pages[0]["annotations"]["description"]
    assert pages[1]["fired_at"] == pages[0]["fired_at"]
    writer.executor.shutdown()
