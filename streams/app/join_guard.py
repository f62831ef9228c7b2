"""What the join does when its dead-letter guard quarantines or releases a source, written once.

The guard itself is pure (:class:`streams.core.guard.DeadLetterGuard`); this turns its decisions into the
``TTFTSourceQuarantined`` page, the log line, the ``ttft_quarantined_sources`` gauge, the ``caps_tripped``
counters and ``/healthz``.

One page per source, whoever holds it. The alert's identity is the source (``tenant 'acme'``, ``producer
'svc'`` on any partition, ``partition 3 (no producer header)``), never the worker. Each input partition
behind a quarantine (the source's partition; for a tenant, every partition its worker owned) is a
*holder*: its transitions are a claim (:attr:`streams.rules.model.AlertTransition.claim`) produced to
``ttft.alerts`` with the batch, keyed ``fingerprint|holder``. The delivery loop pages the alert with its
first firing claim and resolves it with its last resolved one, so two workers quarantining the same producer
page once, and one releasing it while the other still holds it resolves nothing.

Quarantines survive restarts and rebalances: when partitions are assigned, the join reads the firing
claims of those partitions from ``ttft.alerts`` (:meth:`QuarantineReporter.restore`) and holds their
sources again (:meth:`DeadLetterGuard.hold`) without paging; a revoked partition's claims are left firing for
its next owner. A held source is released like any other (``caps.quarantine_release_messages`` clean
messages), which resolves its claims.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from streams.alerting.outbox import alert_message
from streams.app.metrics import WorkerMetrics
from streams.core.guard import PARTITION, PRODUCER, TENANT, DeadLetterGuard, Source
from streams.rules.model import SOURCE_QUARANTINED, AlertTransition, runbook_url
from streams.settings import Settings
from streams.views.quarantines import latest_claims

log = logging.getLogger("ttft.join")

QUARANTINE_ALERT = SOURCE_QUARANTINED
#: The cap counted when a source of each kind is quarantined (``ttft_caps_tripped{cap}``).
QUARANTINE_CAPS = {TENANT: "tenant_quarantine", PRODUCER: "producer_quarantine", PARTITION: "partition_quarantine"}


def page_source(source: Source) -> str:
    """What the page names, its identity: a producer that names itself is one producer on every partition."""
    if source.kind == PRODUCER and source.name:
        return f"producer {source.name!r}"
    return source.describe()


def source_labels(source: Source) -> dict[str, str]:
    """The alert's identity: one alert per source (``tenant`` set for a tenant, ``source`` always)."""
    return {
        "alertname": QUARANTINE_ALERT,
        "severity": "page",
        "tenant": source.name if source.kind == TENANT else "",
        "source": page_source(source),
    }


def source_claim(source: Source, holder: int) -> dict[str, str]:
    """A holder's claim on ``source``'s page, with what :func:`claimed_source` needs to hold it again."""
    return {"holder": str(holder), "kind": source.kind, "name": source.name, "partition": str(source.partition)}


def claimed_source(claim: dict[str, str]) -> tuple[Source, int] | None:
    """The source and holder of a claim (None when it is not one of ours)."""
    try:
        kind, holder = claim["kind"], int(claim["holder"])
        partition = int(claim.get("partition", "-1"))
    except (KeyError, ValueError):
        return None
    if kind not in QUARANTINE_CAPS:
        return None
    return Source(kind, claim.get("name", ""), partition), holder


def quarantine_transition(
    settings: Settings,
    source: Source,
    state: str,
    at_ms: float,
    fired_at_ms: float | None = None,
    holder: int | None = None,
) -> AlertTransition:
    """The firing (quarantined) or resolved (released) transition of ``source``'s page, as ``holder``'s claim
    when given."""
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
        claim=None if holder is None else source_claim(source, holder),
    )


def _release_messages(settings: Settings) -> int:
    caps = settings.caps
    return caps.quarantine_release_messages or 5 * caps.halt_window_messages


def _legacy_holder(message: dict[str, Any]) -> int:
    """Who resolves a page fired before claims: the owner of its partition, or of partition 0 (a tenant's)."""
    numbers = message.get("numbers")
    partition = numbers.get("partition") if isinstance(numbers, dict) else None
    return int(partition) if isinstance(partition, int | float) and partition >= 0 else 0


class QuarantineReporter:
    """Turns the guard's new quarantines and releases into claims on their pages, logs, metrics and
    ``/healthz``; holds the quarantines of newly assigned partitions again (module docstring)."""

    def __init__(self, settings: Settings, guard: DeadLetterGuard, metrics: WorkerMetrics) -> None:
        self.settings, self.guard, self.metrics = settings, guard, metrics
        #: When each source currently quarantined was (its firing transition's time, to resolve it).
        self.since_ms: dict[Source, float] = {}
        #: The input partitions whose claim on each quarantined source this worker holds.
        self.holders: dict[Source, set[int]] = {}
        #: The input partitions this worker owns (the holders of a tenant it quarantines).
        self.owned: set[int] = set()
        #: Pages fired before claims (an upgrade) that this worker resolves at its next report: nothing
        #: holds them any more; the guard judges their source anew.
        self.legacy: list[dict[str, object]] = []
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
            held = self.holders.setdefault(source, set())
            new = ({source.partition} if source.kind != TENANT else set(self.owned) or {source.partition}) - held
            held |= new
            for holder in sorted(new):
                page(*alert_message(quarantine_transition(settings, source, "firing", now_ms, holder=holder)))
        for source in guard.released:
            log.warning("%s released from quarantine: no invalid event for a while", source.describe())
            fired = self.since_ms.pop(source, None)
            for holder in sorted(self.holders.pop(source, ())):
                page(*alert_message(quarantine_transition(settings, source, "resolved", now_ms, fired, holder)))
        for message in self.legacy:
            try:
                old = AlertTransition.from_message(message)
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
            log.warning("%s: a page from before claims, resolved; the guard judges it anew", old.labels)
            summary = {**old.annotations, "summary": "Quarantine page from before claims resolved at upgrade"}
            ended = replace(old, state="resolved", annotations=summary, window_start=now_ms, resolved_at=now_ms)
            page(*alert_message(ended))
        self.legacy = []
        guard.newly_quarantined.clear()
        guard.released.clear()
        self._publish()

    def restore(self, partitions: set[int], messages: Iterable[bytes | None]) -> list[Source]:
        """Hold again the sources whose latest claim by one of ``partitions`` fires (``messages``: the
        ``ttft.alerts`` topic), without paging: their page is out already. Returns the sources held."""
        held: list[Source] = []
        for message in latest_claims(messages).values():
            claim = message.get("claim")
            if message.get("state") != "firing":
                continue
            if not isinstance(claim, dict):
                if _legacy_holder(message) in partitions:
                    self.legacy.append(message)
                continue
            found = claimed_source({str(k): str(v) for k, v in claim.items()})
            if found is None or found[1] not in partitions:
                continue
            source, holder = found
            self.guard.hold(source)
            self.holders.setdefault(source, set()).add(holder)
            fired = message.get("fired_at")
            self.since_ms.setdefault(source, float(fired) if isinstance(fired, int | float) else 0.0)
            held.append(source)
        for source in dict.fromkeys(held):
            log.warning(
                "%s is still quarantined (restored from %s); its page stays as it is",
                source.describe(),
                self.settings.topic("alerts"),
            )
        self._publish()
        return held

    def revoke(self, partitions: set[int]) -> None:
        """Partitions moved to another worker: their claims stay firing for it; a source this worker holds on
        no partition any more is dropped, not released (its page is the new holder's)."""
        self.owned -= partitions
        for source in list(self.holders):
            held = self.holders[source]
            held -= partitions
            if not held:
                del self.holders[source]
                self.since_ms.pop(source, None)
                self.guard.drop(source)
        self._publish()

    def _publish(self) -> None:
        sources = list(self.guard.quarantined)
        for kind in QUARANTINE_CAPS:
            self.metrics.quarantined_sources.labels(kind).set(sum(1 for s in sources if s.kind == kind))
        health = self.metrics.health
        health["quarantined_tenants"] = [s.name for s in sources if s.kind == TENANT]
        health["quarantined_sources"] = [
            {
                "source": s.describe(),
                "kind": s.kind,
                "since_ms": self.since_ms.get(s),
                "partitions": sorted(self.holders.get(s, ())),
            }
            for s in sources
        ]
