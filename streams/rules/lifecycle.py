"""The alert lifecycle: inactive -> pending -> firing -> resolved, one state machine per alert identity.

Each rule reports one :data:`Signal` per series and window:

- ``breach``: the firing condition holds. ``for_windows`` breaches in a row fire the alert (``immediate``
  fires at once, e.g. a critical canary ratio).
- ``hold``: no change. Used for inconclusive data and for the hysteresis band between the recovery and
  the trigger thresholds, so a firing alert stays firing and a pending one keeps its count.
- ``clear``: the recovery condition holds. ``resolve_windows`` clears in a row resolve a firing alert; one
  clear drops a pending alert (recorded as ``resolved`` with no ``fired_at``).

The severity is fixed when an alert goes pending: it is an identity label, and changing it mid-flight
would make Alertmanager see a new alert. Only non-inactive alerts are held, so the state stays bounded by
what is actually wrong.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from streams.rules.links import runbook_url
from streams.rules.model import AlertTransition

Signal = Literal["breach", "hold", "clear"]
AlertKey = tuple[str, str, str, str]  # alertname, tenant, stage, version


@dataclass(slots=True)
class TrackedAlert:
    """A pending or firing alert."""

    alertname: str
    labels: dict[str, str]
    state: Literal["pending", "firing"]
    active_at: float
    fired_at: float | None
    breaches: int
    clears: int
    annotations: dict[str, str]
    numbers: dict[str, float]


def alert_labels(alertname: str, tenant: str, stage: str, version: str, severity: str) -> dict[str, str]:
    """Identity labels, leaving out empty ones (Alertmanager treats an empty label as absent anyway)."""
    raw = {"alertname": alertname, "tenant": tenant, "stage": stage, "version": version, "severity": severity}
    return {k: v for k, v in raw.items() if v}


class AlertBook:
    """All pending and firing alerts of one engine, and the transitions between their states."""

    def __init__(self, runbook_base_url: str | None) -> None:
        self._runbook_base_url = runbook_base_url
        self._alerts: dict[AlertKey, TrackedAlert] = {}

    def runbook_url(self, alertname: str) -> str:
        """Link to the alert's section of docs/runbook.md (:func:`streams.rules.links.runbook_url`)."""
        return runbook_url(self._runbook_base_url, alertname)

    def get(self, key: AlertKey) -> TrackedAlert | None:
        return self._alerts.get(key)

    def active(self) -> Iterator[tuple[AlertKey, TrackedAlert]]:
        """Pending and firing alerts, in a deterministic order."""
        for key in sorted(self._alerts):
            yield key, self._alerts[key]

    def step(
        self,
        key: AlertKey,
        signal: Signal,
        window_start: float,
        *,
        severity: str,
        summary: str,
        description: str,
        numbers: Mapping[str, float],
        for_windows: int = 1,
        resolve_windows: int = 1,
        immediate: bool = False,
        annotations: Mapping[str, str] | None = None,
    ) -> list[AlertTransition]:
        """Advance one alert by one window; returns the transitions (zero or one) it made. ``annotations``:
        more than the summary, description and runbook link (e.g. the stage that moved)."""
        alertname, tenant, stage, version = key
        texts = {
            **(annotations or {}),
            "summary": summary,
            "description": description,
            "runbook_url": self.runbook_url(alertname),
        }
        tracked = self._alerts.get(key)
        if tracked is None:
            if signal != "breach":
                return []
            labels = alert_labels(alertname, tenant, stage, version, severity)
            tracked = TrackedAlert(alertname, labels, "pending", window_start, None, 0, 0, texts, {})
            self._alerts[key] = tracked
        tracked.numbers = {k: float(v) for k, v in numbers.items()}
        tracked.annotations = texts
        if signal == "breach":
            tracked.breaches += 1
            tracked.clears = 0
            if tracked.state == "pending":
                if immediate or tracked.breaches >= for_windows:
                    tracked.state = "firing"
                    tracked.fired_at = window_start
                    return [self._transition(tracked, "firing", window_start)]
                if tracked.breaches == 1:
                    return [self._transition(tracked, "pending", window_start)]
            return []
        if signal == "clear":
            tracked.clears += 1
            if tracked.state == "pending" or tracked.clears >= resolve_windows:
                return [self.resolve(key, window_start)] if key in self._alerts else []
        return []

    def restore(self, transition: AlertTransition) -> AlertKey | None:
        """Re-adopt a pending or firing alert from the outbox after a restart; returns its key."""
        if transition.state == "resolved":
            return None
        labels = transition.labels
        key: AlertKey = (
            transition.alertname,
            labels.get("tenant", ""),
            labels.get("stage", ""),
            labels.get("version", ""),
        )
        self._alerts[key] = TrackedAlert(
            transition.alertname,
            dict(labels),
            transition.state,
            transition.active_at,
            transition.fired_at,
            1,
            0,
            dict(transition.annotations),
            dict(transition.numbers),
        )
        return key

    def resolve(self, key: AlertKey, window_start: float, description: str | None = None) -> AlertTransition:
        """Resolve (or drop, when still pending) an alert now; ``KeyError`` when it is not active."""
        tracked = self._alerts.pop(key)
        if description is not None:
            tracked.annotations = {**tracked.annotations, "description": description}
        return self._transition(tracked, "resolved", window_start)

    def fire_now(
        self, key: AlertKey, window_start: float, *, severity: str, summary: str, description: str
    ) -> list[AlertTransition]:
        """Fire an alert that has no pending phase (Watchdog, ingest halted); no-op when already firing."""
        return self.step(
            key,
            "breach",
            window_start,
            severity=severity,
            summary=summary,
            description=description,
            numbers={},
            immediate=True,
        )

    def forget(self, keys: list[AlertKey], window_start: float) -> list[AlertTransition]:
        """Resolve a group of alerts (e.g. a forgotten tenant's)."""
        return [self.resolve(k, window_start) for k in keys if k in self._alerts]

    @staticmethod
    def _transition(
        tracked: TrackedAlert, state: Literal["pending", "firing", "resolved"], now: float
    ) -> AlertTransition:
        return AlertTransition(
            alertname=tracked.alertname,
            labels=dict(tracked.labels),
            annotations=dict(tracked.annotations),
            numbers=dict(tracked.numbers),
            state=state,
            window_start=now,
            active_at=tracked.active_at,
            fired_at=tracked.fired_at,
            resolved_at=now if state == "resolved" else None,
        )
