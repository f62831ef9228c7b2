from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from streams.alerting.alertmanager import AlertmanagerClient, alertmanager_alert
from streams.alerting.outbox import (
    DeliveryOptions,
    DeliveryState,
    alert_message,
    deliver_due,
    read_outbox_state,
    run_delivery_loop,
)
from streams.alerting.supervise import supervise
from streams.kafka.topics import kafka_client_kwargs
from streams.rules import AlertTransition, ingest_halted_transition
from streams.rules.links import AlertLinks
from streams.settings import Settings
from tests.fixtures.alertmanager import AlertmanagerServer, require_binary, wait_for
from tests.unit.test_alert_links import slo_burn_page

pytestmark = [pytest.mark.alertmanager, pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[2]


def transition(state: str, at_ms: float, tenant: str = "t2") -> AlertTransition:
    labels = {"alertname": "TTFTStageRegression", "tenant": tenant, "stage": "retrieval", "severity": "page"}
    return AlertTransition(
        "TTFTStageRegression",
        labels,
        {"summary": "retrieval P95 regressed", "description": "x1.5 over baseline", "runbook_url": "u"},
        {"ratio_short": 1.5},
        state,  # type: ignore[arg-type]
        at_ms,
        60_000.0,
        60_000.0,
        at_ms if state == "resolved" else None,
    )


def post(url: str, t: AlertTransition) -> bool:
    async def go() -> bool:
        from datetime import UTC, datetime, timedelta

        body = [alertmanager_alert(t, now=datetime.now(UTC), ends_in=timedelta(minutes=4))]
        async with AlertmanagerClient(url, attempts=1) as client:
            return await client.post(body)

    return asyncio.run(go())


def test_firing_twice_notifies_once_and_the_resolution_arrives(alertmanager: AlertmanagerServer) -> None:
    assert post(alertmanager.url, transition("firing", 120_000.0))
    time.sleep(0.3)
    assert post(alertmanager.url, transition("firing", 120_000.0))  # the periodic re-send
    assert wait_for(lambda: alertmanager.webhook.alerts("firing"), timeout_s=10)
    time.sleep(3.0)  # three more group intervals: a duplicate would have been notified by now
    firing = alertmanager.webhook.alerts("firing")
    assert len(firing) == 1
    assert firing[0]["labels"]["tenant"] == "t2" and firing[0]["annotations"]["ratio_short"] == "1.5"
    assert post(alertmanager.url, transition("resolved", 300_000.0))
    assert wait_for(lambda: alertmanager.webhook.alerts("resolved"), timeout_s=10)
    assert len(alertmanager.webhook.alerts("firing")) == 1


def test_an_alert_alertmanager_refuses_is_dropped_and_its_batch_pages(alertmanager: AlertmanagerServer) -> None:
    """Issue 27 item 6: Alertmanager answers 400 for a batch holding one invalid alert; the outbox used to
    retry that batch forever. Now the others page and the refused one is dropped, counted and reported."""
    good = transition("firing", 120_000.0, tenant="good")
    bad = transition("firing", 120_000.0, tenant="also-good")
    bad.labels["bad-label-name"] = "x"  # not a valid label name for Alertmanager 0.25: "invalid label set"
    state = DeliveryState()
    state.fold(good)
    state.fold(bad)
    refused: list[str] = []

    async def go() -> bool:
        async with AlertmanagerClient(alertmanager.url, attempts=1) as client:
            return await deliver_due(
                state, client, time.time(), resend_interval_s=60.0, on_refused=lambda t, why: refused.append(why)
            )

    assert asyncio.run(go())
    assert state.owed == {} and state.stats.refused == 1 and state.stats.delivered == 1
    assert len(refused) == 1 and refused[0].startswith("400"), refused
    assert wait_for(lambda: alertmanager.webhook.alerts("firing"), timeout_s=10)
    assert {a["labels"]["tenant"] for a in alertmanager.webhook.alerts("firing")} == {"good"}


def test_links_exemplars_and_generator_url_arrive_through_alertmanager(alertmanager: AlertmanagerServer) -> None:
    """Issue 28: an engine-made SLO page (moved stage, exemplars) and a guard-made halt, delivered with the
    deployment's links, reach the receiver with their board link as Alertmanager's generatorURL."""
    page = slo_burn_page(grafana_url="")  # an engine built without the deployment's Grafana URL
    halted = ingest_halted_transition("firing", page.window_start, detail="d")
    links = AlertLinks("https://grafana.internal/g", "https://docs.internal/runbook.md", 60_000.0)
    state = DeliveryState()
    state.fold(page)
    state.fold(halted)

    async def go() -> bool:
        async with AlertmanagerClient(alertmanager.url, attempts=1) as client:
            return await deliver_due(state, client, time.time(), resend_interval_s=60.0, links=links)

    assert asyncio.run(go()) and state.stats.delivered == 2
    assert wait_for(lambda: len(alertmanager.webhook.alerts("firing")) == 2, timeout_s=10)
    received = {a["labels"]["alertname"]: a for a in alertmanager.webhook.alerts("firing")}
    slo, halt = received["TTFTSLOBurn"], received["TTFTIngestHalted"]
    for alert in (slo, halt):
        assert alert["generatorURL"] == alert["annotations"]["dashboard_url"]
        assert alert["generatorURL"].startswith("https://grafana.internal/g/d/")
        name = alert["labels"]["alertname"].lower()
        assert alert["annotations"]["runbook_url"] == f"https://docs.internal/runbook.md#{name}"
    assert slo["annotations"]["moved_stage"] == "llm_ttft"
    assert "stage_dashboard_url" in slo["annotations"] and "moved most" in slo["annotations"]["summary"]
    assert len(json.loads(slo["annotations"]["exemplar_request_ids"])) == 2
    assert slo["annotations"]["exemplar_url"].startswith("https://grafana.internal/g/d/ttft-request?")
    with urllib.request.urlopen(f"{alertmanager.url}/api/v2/alerts", timeout=5) as response:
        api = {a["labels"]["alertname"]: a for a in json.load(response)}
    assert api["TTFTSLOBurn"]["generatorURL"] == slo["generatorURL"]


def test_sample_config_passes_amtool_check_config() -> None:
    require_binary("amtool")  # ships with Debian's prometheus-alertmanager
    amtool = str(shutil.which("amtool"))
    result = subprocess.run(
        [amtool, "check-config", str(REPO / "deploy" / "alertmanager" / "alertmanager.yml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


async def _produce(settings: Settings, transitions: list[AlertTransition]) -> None:
    producer = AIOKafkaProducer(acks="all", **kafka_client_kwargs(settings))
    await producer.start()
    try:
        for t in transitions:
            key, value = alert_message(t)
            await producer.send_and_wait(settings.topic("alerts"), value, key=key)
    finally:
        await producer.stop()


async def _run_until(settings: Settings, url: str, done: object, timeout_s: float) -> tuple[DeliveryState, int]:
    """Run a delivery loop until ``done(state, client)`` or the timeout; returns its state and failures."""
    options = DeliveryOptions(resend_interval_s=60.0, poll_timeout_ms=200, retry_initial_s=0.2, retry_max_s=0.5)
    stop = asyncio.Event()
    state = DeliveryState()
    async with AlertmanagerClient(url, attempts=1, timeout_s=2.0) as client:
        task = asyncio.create_task(run_delivery_loop(settings, client, stop, options=options, state=state))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not done(state, client) and not task.done():  # type: ignore[operator]
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.wait_for(task, timeout=10)
        return state, client.failed_attempts


@pytest.mark.kafka
def test_delivery_loop_survives_alertmanager_down_and_a_restart(
    kafka_settings: Settings, alertmanager_server: AlertmanagerServer
) -> None:
    server = alertmanager_server
    asyncio.run(_produce(kafka_settings, [transition("firing", 120_000.0)]))

    # Alertmanager is down: the loop retries and commits nothing; then the "worker" stops.
    state, failures = asyncio.run(_run_until(kafka_settings, server.url, lambda s, c: c.failed_attempts >= 3, 20))
    assert failures >= 3 and state.owed and state.stats.delivered == 0 and state.stats.replayed == 0
    # What a restarting worker's engine resumes (RuleEngine.restore): the firing alert.
    restored = asyncio.run(read_outbox_state(kafka_settings)).active_transitions()
    assert [(t.state, t.labels["tenant"]) for t in restored] == [("firing", "t2")]

    # Alertmanager comes back; a fresh loop (a restarted worker) still owes the transition and delivers it.
    server.start()
    state, _ = asyncio.run(_run_until(kafka_settings, server.url, lambda s, c: s.stats.delivered >= 1, 20))
    assert state.stats.delivered == 1 and not state.owed
    assert state.stats.replayed == 0  # phase one committed nothing
    assert wait_for(lambda: server.webhook.alerts("firing"), timeout_s=10)

    # Its offset is committed now: a restart only re-sends the firing alert, then delivers the resolution.
    asyncio.run(_produce(kafka_settings, [transition("resolved", 300_000.0)]))
    state, _ = asyncio.run(_run_until(kafka_settings, server.url, lambda s, c: s.stats.delivered >= 1, 20))
    assert state.stats.delivered == 1 and state.firing == {}
    assert state.stats.replayed == 1  # the firing message sits below the committed offset
    assert wait_for(lambda: server.webhook.alerts("resolved"), timeout_s=10)
    assert len(server.webhook.alerts("firing")) == 1


class _DiesOnce:
    """An AlertSink whose first post raises (a bug in delivery), then delegates to the real client."""

    def __init__(self, client: AlertmanagerClient) -> None:
        self.client = client
        self.posts = 0
        self.refusal: str | None = None

    async def post(self, alerts: Any) -> bool:
        self.posts += 1
        if self.posts == 1:
            raise RuntimeError("delivery bug")
        return await self.client.post(alerts)


@pytest.mark.kafka
def test_supervised_delivery_restarts_after_the_loop_dies(
    kafka_settings: Settings, alertmanager: AlertmanagerServer
) -> None:
    """The loop dies on its first post; the supervisor counts it, restarts it, and the page still arrives."""
    asyncio.run(_produce(kafka_settings, [transition("firing", 120_000.0, tenant="t-supervised")]))
    reasons: list[str] = []

    async def go() -> int:
        options = DeliveryOptions(resend_interval_s=60.0, poll_timeout_ms=200, retry_initial_s=0.2)
        stop = asyncio.Event()
        async with AlertmanagerClient(alertmanager.url, attempts=1, timeout_s=2.0) as client:
            sink = _DiesOnce(client)
            task = asyncio.create_task(
                supervise(
                    "alert delivery",
                    lambda: run_delivery_loop(kafka_settings, sink, stop, options=options),
                    stop,
                    on_restart=reasons.append,
                    backoff_initial_s=0.2,
                )
            )
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not alertmanager.webhook.alerts("firing"):
                await asyncio.sleep(0.1)
            stop.set()
            return await asyncio.wait_for(task, timeout=15)

    restarts = asyncio.run(go())
    assert restarts == 1 and reasons == ["RuntimeError"]
    firing = alertmanager.webhook.alerts("firing")
    assert [a["labels"]["tenant"] for a in firing] == ["t-supervised"]
