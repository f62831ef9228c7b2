"""Issue 27 item 6: one alert that Alertmanager refuses (a 400 for the alert itself) kept the outbox
uncommitted forever: every retry posted the same batch, so every later alert waited behind it. Now the
refused batch is posted alert by alert; the accepted ones page, the refused one is dropped, counted and
handed to ``on_refused``. A refusal that is not the alert's fault (403, unreachable) keeps it owed."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from streams.alerting.outbox import DeliveryState, deliver_due
from streams.rules import AlertTransition


def transition(tenant: str, state: Literal["pending", "firing", "resolved"] = "firing") -> AlertTransition:
    labels = {"alertname": "TTFTStageRegression", "tenant": tenant, "stage": "retrieval", "severity": "page"}
    return AlertTransition("TTFTStageRegression", labels, {"summary": "s"}, {}, state, 60_000.0, 0.0)


class PickySink:
    """Alertmanager that refuses any post holding tenant ``bad`` (400), or is misconfigured (403)."""

    def __init__(self, forbidden: bool = False) -> None:
        self.forbidden = forbidden
        self.refusal: str | None = None
        self.accepted: list[str] = []
        self.posts = 0

    async def post(self, alerts: Sequence[Mapping[str, Any]]) -> bool:
        self.posts += 1
        self.refusal = None
        if self.forbidden:
            return False  # a 403: not the alerts' fault, refusal stays None
        if any(a["labels"]["tenant"] == "bad" for a in alerts):
            self.refusal = "400: invalid label set"
            return False
        self.accepted += [a["labels"]["tenant"] for a in alerts]
        return True


def deliver(state: DeliveryState, sink: PickySink, now: float, **kwargs: Any) -> bool:
    return asyncio.run(deliver_due(state, sink, now, resend_interval_s=60.0, **kwargs))


def test_a_refused_alert_is_dropped_and_the_others_of_its_batch_page() -> None:
    state, sink = DeliveryState(), PickySink()
    for tenant in ("a", "bad", "c"):
        state.fold(transition(tenant))
    refused: list[tuple[str, str]] = []
    assert deliver(state, sink, 1000.0, on_refused=lambda t, why: refused.append((t.labels["tenant"], why)))
    assert sorted(sink.accepted) == ["a", "c"]
    assert refused == [("bad", "400: invalid label set")]
    assert state.owed == {} and state.stats.refused == 1 and state.stats.delivered == 2
    assert "bad" not in {f.transition.labels["tenant"] for f in state.firing.values()}
    # later alerts are no longer held behind it, and it is never re-sent
    state.fold(transition("d"))
    assert deliver(state, sink, 1100.0)
    assert sorted(sink.accepted) == ["a", "a", "c", "c", "d"]  # the resends of a and c, and d


def test_a_misconfigured_alertmanager_keeps_every_alert_owed() -> None:
    state, sink = DeliveryState(), PickySink(forbidden=True)
    for tenant in ("a", "bad"):
        state.fold(transition(tenant))
    assert not deliver(state, sink, 1000.0)
    assert len(state.owed) == 2 and state.stats.refused == 0 and sink.posts == 1
    sink.forbidden = False
    assert deliver(state, sink, 1001.0)
    assert sink.accepted == ["a"] and state.stats.refused == 1
