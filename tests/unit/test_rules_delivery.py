from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from streams.alerting.alertmanager import AlertmanagerClient, alertmanager_alert
from streams.alerting.outbox import DeliveryState, alert_message, deliver_due
from streams.rules import AlertTransition

LABELS = {"alertname": "TTFTStageRegression", "tenant": "t1", "stage": "retrieval", "severity": "page"}


def transition(state: str, at: float, *, muted: bool = False, fired: float | None = 0.0) -> AlertTransition:
    return AlertTransition(
        "TTFTStageRegression",
        dict(LABELS),
        {"summary": "s", "description": "d", "runbook_url": "u"},
        {"ratio_short": 1.52},
        state,
        at,
        0.0,
        fired,
        at if state == "resolved" else None,
        muted,  # type: ignore[arg-type]
    )


class FakeSink:
    refusal: str | None = None

    def __init__(self, up: bool = True) -> None:
        self.up = up
        self.posts: list[list[Mapping[str, Any]]] = []

    async def post(self, alerts: Sequence[Mapping[str, Any]]) -> bool:
        if not self.up:
            return False
        self.posts.append(list(alerts))
        return True


def deliver(state: DeliveryState, sink: FakeSink, now: float, **kwargs: Any) -> bool:
    return asyncio.run(deliver_due(state, sink, now, resend_interval_s=60.0, **kwargs))


def test_payload_numbers_are_string_annotations_and_ends_at_is_ahead_when_firing() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    firing = alertmanager_alert(transition("firing", 0.0), now=now, ends_in=timedelta(minutes=4))
    assert firing["labels"] == LABELS
    assert firing["annotations"]["ratio_short"] == "1.52"
    assert (firing["startsAt"], firing["endsAt"]) == ("2026-01-01T00:00:00.000Z", "2026-01-01T00:04:00.000Z")
    resolved = alertmanager_alert(transition("resolved", 60.0), now=now, ends_in=timedelta(minutes=4))
    assert resolved["endsAt"] == "2026-01-01T00:00:00.000Z"


def test_firing_is_delivered_once_then_resent_per_interval_and_resolution_once() -> None:
    state, sink = DeliveryState(), FakeSink()
    state.fold(transition("pending", 0.0, fired=None))
    assert deliver(state, sink, 1000.0) and sink.posts == []  # pending alerts are not paged
    state.fold(transition("firing", 60_000.0))
    deliver(state, sink, 1000.0)
    deliver(state, sink, 1030.0)  # within the re-send interval: nothing
    deliver(state, sink, 1061.0)  # re-send keeps endsAt ahead
    state.fold(transition("resolved", 120_000.0))
    deliver(state, sink, 1062.0)
    deliver(state, sink, 1200.0)
    assert [[a["endsAt"] > a["startsAt"] for a in post] for post in sink.posts] == [[True], [True], [False]]
    assert sink.posts[0][0]["startsAt"] == sink.posts[1][0]["startsAt"]  # first delivery time is kept
    assert (state.stats.delivered, state.stats.resent) == (2, 1)
    assert state.firing == {} and state.owed == {}


def test_failed_delivery_stays_owed_until_accepted() -> None:
    state, sink = DeliveryState(), FakeSink(up=False)
    state.fold(transition("firing", 60_000.0))
    assert not deliver(state, sink, 1000.0)
    assert not deliver(state, sink, 1001.0)
    sink.up = True
    assert deliver(state, sink, 1002.0)
    assert len(sink.posts) == 1 and state.owed == {} and state.stats.failed_posts == 2


def test_replayed_messages_rebuild_firing_set_without_redelivering_resolutions() -> None:
    state, sink = DeliveryState(), FakeSink()
    key, value = alert_message(transition("firing", 60_000.0))
    assert key.decode() == transition("firing", 0.0).fingerprint
    state.fold_message(value, replayed=True)
    state.fold_message(b"{not json", replayed=True)
    deliver(state, sink, 1000.0)
    assert len(sink.posts) == 1  # the firing alert is re-sent after a restart
    assert state.stats.malformed == 1
    _, resolved = alert_message(transition("resolved", 120_000.0))
    state.fold_message(resolved, replayed=True)
    deliver(state, sink, 2000.0)
    assert len(sink.posts) == 1 and state.active_transitions() == []


def test_muted_transitions_and_muted_loop_never_page() -> None:
    state, sink = DeliveryState(), FakeSink()
    state.fold(transition("firing", 60_000.0, muted=True))
    assert deliver(state, sink, 1000.0) and sink.posts == [] and state.stats.muted == 1
    state.fold(transition("firing", 60_000.0))
    assert deliver(state, sink, 1000.0, paging_muted=True)
    assert sink.posts == [] and state.stats.muted == 2 and state.owed == {}


@pytest.mark.net
def test_client_reports_failure_instead_of_raising_when_nothing_listens() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async def go() -> bool:
        async with AlertmanagerClient("http://127.0.0.1:9", attempts=3, backoff_s=0.1, sleep=sleep) as client:
            return await client.post([{"labels": {"alertname": "x"}}])

    assert asyncio.run(go()) is False
    assert slept == [0.1, 0.2]
