"""Sources the join's dead-letter guard holds in quarantine, read from the alert outbox (``ttft.alerts``).

Each quarantine is a ``TTFTSourceQuarantined`` alert, produced by the join with the batch that tripped it
and resolved when the source is released. Several join workers (their input partitions) may hold the same
source: each holder's transitions are a *claim* keyed ``fingerprint|holder``, and the topic is compacted by
key, so folding it whole gives every holder's latest claim; a source is in quarantine while any holder's
claim fires (and this works while the workers run: no store access).
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
    #: The join's input partitions holding it (its claims' holders), sorted.
    holders: tuple[str, ...] = ()


def latest_claims(messages: Iterable[bytes | None]) -> dict[tuple[str, str], dict[str, Any]]:
    """The latest ``TTFTSourceQuarantined`` transition per (fingerprint, holder), malformed ones skipped
    (a transition without a claim, from before claims, is its fingerprint's only holder ``""``)."""
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for value in messages:
        if not value:
            continue
        try:
            message = orjson.loads(value)
        except orjson.JSONDecodeError:
            log.warning("skipping a malformed alert message")
            continue
        if not isinstance(message, dict) or message.get("alertname") != SOURCE_QUARANTINED:
            continue
        claim = message.get("claim")
        holder = str(claim.get("holder", "")) if isinstance(claim, dict) else ""
        latest[(str(message.get("fingerprint")), holder)] = message
    return latest


def fold_quarantines(messages: Iterable[bytes | None]) -> list[Quarantine]:
    """The sources with at least one firing claim, oldest first (malformed messages skipped)."""
    by_source: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for (fp, holder), message in latest_claims(messages).items():
        if message.get("state") == "firing" and isinstance(message.get("labels"), dict):
            by_source.setdefault(fp, []).append((holder, message))
    found = []
    for claims in by_source.values():
        labels = claims[0][1]["labels"]
        since = min(float(m.get("fired_at") or m.get("window_start") or 0.0) for _, m in claims)
        holders = tuple(sorted((h for h, _ in claims if h), key=lambda h: (len(h), h)))
        found.append(Quarantine(str(labels.get("source", "")), str(labels.get("tenant", "")), since, holders))
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
            f"QUARANTINED {q.source} since {since}{_held_on(q)}: its invalid events are dead-lettered, not "
            "counted (docs/runbook.md#ttftsourcequarantined)"
        )
    return lines


def _held_on(q: Quarantine) -> str:
    if not q.holders:
        return ""
    return f" (held on partition{'s' if len(q.holders) > 1 else ''} {', '.join(q.holders)})"


def quarantine_records(quarantines: list[Quarantine]) -> list[dict[str, object]]:
    """The quarantines as JSON objects (``ttft rules status --json``): times in epoch ms."""
    return [
        {"source": q.source, "tenant": q.tenant or None, "since_ms": q.since_ms, "partitions": list(q.holders)}
        for q in quarantines
    ]
