"""What the join does when its dead-letter guard quarantines or releases a source, written once.

The guard itself is pure (:class:`streams.core.guard.DeadLetterGuard`); this turns its decisions into the
``TTFTSourceQuarantined`` page (one alert per source, produced to ``ttft.alerts`` with the batch, so it is
delivered once the offsets of the messages that tripped it are committed; its release resolves it), the
log line, the ``ttft_quarantined_sources`` gauge, the ``caps_tripped`` counters and ``/healthz``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from streams.alerting.outbox import alert_message
from streams.app.metrics import WorkerMetrics
from streams.core.guard import PARTITION, PRODUCER, TENANT, DeadLetterGuard, Source
from streams.rules.model import SOURCE_QUARANTINED, AlertTransition, runbook_url
from streams.settings import Settings

log = logging.getLogger("ttft.join")

QUARANTINE_ALERT = SOURCE_QUARANTINED
#: The cap counted when a source of each kind is quarantined (``ttft_caps_tripped{cap}``).
QUARANTINE_CAPS = {TENANT: "tenant_quarantine", PRODUCER: "producer_quarantine", PARTITION: "partition_quarantine"}


def source_labels(source: Source) -> dict[str, str]:
    """The alert's identity: one alert per source (``tenant`` set for a tenant, ``source`` always)."""
    return {
        "alertname": QUARANTINE_ALERT,
        "severity": "page",
        "tenant": source.name if source.kind == TENANT else "",
        "source": source.describe(),
    }


def quarantine_transition(
    settings: Settings, source: Source, state: str, at_ms: float, fired_at_ms: float | None = None
) -> AlertTransition:
    """The firing (quarantined) or resolved (released) transition of ``source``'s page."""
    caps = settings.caps
    what = source.describe()
    if state == "firing":
        summary = f"Dead-letter guard quarantined {what}"
        detail = (
            f"The invalid events of {what} passed {caps.halt_dead_letter_share:.0%} of the last "
            f"{caps.halt_window_messages} messages. They keep being dead-lettered with their bytes (nothing is "
            "lost), its valid events keep being joined, every other source is unaffected. Fix the producer; "
            "the quarantine lifts by itself once it sends no invalid event for a while."
        )
    else:
        summary = f"Quarantine of {what} lifted"
        detail = f"{what} sent no invalid event for {_release_messages(settings)} messages."
    fired = at_ms if state == "firing" else fired_at_ms
    return AlertTransition(
        alertname=QUARANTINE_ALERT,
        labels=source_labels(source),
        annotations={
            "summary": summary,
            "description": detail,
            "runbook_url": runbook_url(settings.rules.runbook_base_url, QUARANTINE_ALERT),
        },
        numbers={"partition": float(source.partition)} if source.kind != TENANT else {},
        state="firing" if state == "firing" else "resolved",
        window_start=at_ms,
        active_at=fired if fired is not None else at_ms,
        fired_at=fired,
        resolved_at=at_ms if state == "resolved" else None,
    )


def _release_messages(settings: Settings) -> int:
    caps = settings.caps
    return caps.quarantine_release_messages or 5 * caps.halt_window_messages


class QuarantineReporter:
    """Turns the guard's new quarantines and releases into pages, logs, metrics and ``/healthz``."""

    def __init__(self, settings: Settings, guard: DeadLetterGuard, metrics: WorkerMetrics) -> None:
        self.settings, self.guard, self.metrics = settings, guard, metrics
        #: When each source currently quarantined was (its firing transition's time, to resolve it).
        self.since_ms: dict[Source, float] = {}
        self._publish()

    def report(self, now_ms: float, page: Callable[[bytes, bytes], None]) -> None:
        """Page, log and count what the guard decided since the last call; clears its lists."""
        guard, settings = self.guard, self.settings
        for source in guard.newly_quarantined:
            log.error(
                "%s quarantined: its invalid events passed %.0f%% of the last %d messages; they keep being "
                "dead-lettered and no longer count towards the guard (docs/runbook.md, TTFTSourceQuarantined)",
                source.describe(),
                settings.caps.halt_dead_letter_share * 100,
                settings.caps.halt_window_messages,
            )
            self.metrics.caps_tripped.labels(QUARANTINE_CAPS[source.kind]).inc()
            self.since_ms[source] = now_ms
            page(*alert_message(quarantine_transition(settings, source, "firing", now_ms)))
        for source in guard.released:
            log.warning("%s released from quarantine: no invalid event for a while", source.describe())
            fired = self.since_ms.pop(source, None)
            page(*alert_message(quarantine_transition(settings, source, "resolved", now_ms, fired)))
        guard.newly_quarantined.clear()
        guard.released.clear()
        self._publish()

    def _publish(self) -> None:
        sources = list(self.guard.quarantined)
        for kind in QUARANTINE_CAPS:
            self.metrics.quarantined_sources.labels(kind).set(sum(1 for s in sources if s.kind == kind))
        health = self.metrics.health
        health["quarantined_tenants"] = [s.name for s in sources if s.kind == TENANT]
        health["quarantined_sources"] = [
            {"source": s.describe(), "kind": s.kind, "since_ms": self.since_ms.get(s)} for s in sources
        ]
