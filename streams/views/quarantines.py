"""Sources the join's dead-letter guard holds in quarantine, read from the alert outbox (``ttft.alerts``).

Each quarantine is a ``TTFTSourceQuarantined`` alert, produced by the join with the batch that tripped it
and resolved when the source is released; the topic is compacted by fingerprint, so folding it whole gives
the state of every quarantine (and works while the workers run: no store access).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from streams.rules.model import SOURCE_QUARANTINED
from streams.settings import Settings
from streams.views.rule_status import read_topic_values

log = logging.getLogger("ttft.quarantines")


@dataclass(frozen=True, slots=True)
class Quarantine:
    """One source in quarantine: what it is, its tenant (if a tenant), since when (epoch ms)."""

    source: str
    tenant: str
    since_ms: float


def fold_quarantines(messages: Iterable[bytes | None]) -> list[Quarantine]:
    """The quarantines whose latest transition is firing, oldest first (malformed messages skipped)."""
    latest: dict[str, dict[str, Any]] = {}
    for value in messages:
        if not value:
            continue
        try:
            message = orjson.loads(value)
        except orjson.JSONDecodeError:
            log.warning("skipping a malformed alert message")
            continue
        if isinstance(message, dict) and message.get("alertname") == SOURCE_QUARANTINED:
            latest[str(message.get("fingerprint"))] = message
    found = []
    for message in latest.values():
        labels = message.get("labels")
        if message.get("state") != "firing" or not isinstance(labels, dict):
            continue
        since = message.get("fired_at") or message.get("window_start") or 0.0
        found.append(Quarantine(str(labels.get("source", "")), str(labels.get("tenant", "")), float(since)))
    return sorted(found, key=lambda q: (q.since_ms, q.source))


async def read_quarantines(settings: Settings, *, timeout_s: float = 30.0) -> list[Quarantine]:
    """The sources in quarantine now, from ``ttft.alerts`` (its beginning to its current end)."""
    return fold_quarantines(await read_topic_values(settings, settings.topic("alerts"), timeout_s=timeout_s))


def quarantine_lines(quarantines: list[Quarantine]) -> list[str]:
    """One line per quarantined source, for ``ttft rules status``; none when nothing is quarantined."""
    lines = []
    for q in quarantines:
        since = datetime.fromtimestamp(q.since_ms / 1000.0, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
        lines.append(
            f"QUARANTINED {q.source} since {since}: its invalid events are dead-lettered, not counted "
            "(docs/runbook.md#ttftsourcequarantined)"
        )
    return lines
