"""What both join adapters (batch and Faust) do when the dead-letter guard acts, written once.

The guard itself is pure (:class:`streams.core.guard.DeadLetterGuard`); this turns its decisions into the
TTFTIngestHalted page, the quarantine log line and gauges, and keeps Prometheus counters level with the
core's running totals.
"""

from __future__ import annotations

import logging
from typing import Any

from streams.alerting.outbox import alert_message
from streams.app.metrics import WorkerMetrics
from streams.core.guard import DeadLetterGuard
from streams.rules import ingest_halted_transition
from streams.settings import Settings

log = logging.getLogger("ttft.join")


def halt_alert(
    settings: Settings,
    guard: DeadLetterGuard,
    decoded: Any,
    where: tuple[str, int, int],
    now_ms: float,
) -> tuple[bytes, bytes]:
    """Log the halt and return the TTFTIngestHalted (key, value) for the alerts topic.

    ``where`` is the (topic, partition, offset) of the message that tripped the guard.
    """
    topic, partition, offset = where
    caps = settings.caps
    detail = (
        f"{guard.dead_letters} of the last {caps.halt_window_messages} messages on {topic} were "
        f"invalid (limit {caps.halt_dead_letter_share:.0%}); halted at partition {partition} offset "
        f"{offset}. Fix the producer, then resume (docs/operations.md)."
    )
    log.critical("TTFTIngestHalted: %s", detail)
    at_ms = float(getattr(decoded, "ts_ms", None) or now_ms)
    transition = ingest_halted_transition(
        "firing",
        at_ms,
        detail=detail,
        numbers={"dead_share": guard.dead_share, "partition": partition, "offset": offset},
        runbook_base_url=settings.rules.runbook_base_url,
    )
    return alert_message(transition)


def report_quarantines(settings: Settings, guard: DeadLetterGuard, metrics: WorkerMetrics) -> None:
    """The guard quarantined a tenant instead of halting: say so loudly, keep going for everyone."""
    for tenant in guard.newly_quarantined:
        log.error(
            "tenant %r quarantined: its invalid events passed %.0f%% of the last %d messages; its dead letters "
            "no longer count towards the ingest halt (docs/operations.md)",
            tenant,
            settings.caps.halt_dead_letter_share * 100,
            settings.caps.halt_window_messages,
        )
        metrics.caps_tripped.labels("tenant_quarantine").inc()
    metrics.health["quarantined_tenants"] = list(guard.quarantined)
    guard.newly_quarantined.clear()
