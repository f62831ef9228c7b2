"""``ttft rules status``: what each rule last concluded per tenant, read from ``ttft.rule-evaluations``.

The writer produces every rule evaluation to that compacted topic, keyed by series
(``tenant|rule|stage|version``), so the status is readable while the writer holds the embedded store
(one chDB process per data directory): no database access here. The fold keeps the newest evaluation
of each series (by event time), which carries the span it used, its samples, its outcome and the
latest window in which it could decide.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from datetime import UTC, datetime

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.alerting.outbox import topic_partitions
from streams.kafka.topics import kafka_client_kwargs
from streams.rules.gates import Gate, gates_from_message, is_gates_message
from streams.rules.model import DECIDED_OUTCOMES, RuleEvaluation
from streams.settings import Settings

log = logging.getLogger("ttft.rules_status")

#: Rules shown by default: the ones whose span grows and that can be undecidable (others with --all).
SPAN_RULES: frozenset[str] = frozenset({"TTFTStageRegression", "TTFTCanaryFailed"})


def fold_statuses(messages: Iterable[bytes | None]) -> dict[str, RuleEvaluation]:
    """The newest evaluation per series; malformed messages are skipped (and logged), the writer's gates
    (:func:`fold_gates`) quietly."""
    latest: dict[str, RuleEvaluation] = {}
    for value in messages:
        try:
            message = orjson.loads(value or b"")
            if is_gates_message(message):
                continue
            evaluation = RuleEvaluation.from_message(message)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            log.warning("skipping malformed rule evaluation: %s", exc)
            continue
        current = latest.get(evaluation.key)
        if current is None or evaluation.window_start >= current.window_start:
            latest[evaluation.key] = evaluation
    return latest


def fold_gates(messages: Iterable[bytes | None]) -> list[Gate] | None:
    """The gates the latest writer published on ``ttft.rule-evaluations`` (None: no writer published any)."""
    found: list[Gate] | None = None
    for value in messages:
        if not value or b'"kind"' not in value:
            continue
        try:
            message = orjson.loads(value)
        except orjson.JSONDecodeError:
            continue
        if is_gates_message(message):
            found = gates_from_message(message)
    return found


async def read_statuses(settings: Settings, *, timeout_s: float = 30.0) -> dict[str, RuleEvaluation]:
    """Read ``ttft.rule-evaluations`` from its beginning to the current end (no group, no commit)."""
    return fold_statuses(await read_topic_values(settings, settings.topic("rule-evaluations"), timeout_s=timeout_s))


async def read_topic_values(settings: Settings, topic: str, *, timeout_s: float = 30.0) -> list[bytes | None]:
    """Every value of ``topic`` from its beginning to its current end, in offset order per partition."""
    tps = [TopicPartition(topic, p) for p in await topic_partitions(settings, topic)]
    consumer = AIOKafkaConsumer(enable_auto_commit=False, **kafka_client_kwargs(settings))
    await consumer.start()
    values: list[bytes | None] = []
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} took longer than {timeout_s} s")
            batch = await consumer.getmany(*tps, timeout_ms=500, max_records=5_000)
            for records in batch.values():
                values += [r.value for r in records]
    finally:
        await consumer.stop()
    return values


def _when(ms: float | None) -> str:
    if ms is None:
        return "never"
    return datetime.fromtimestamp(ms / 1000.0, tz=UTC).strftime("%Y-%m-%d %H:%M")


HEADER = ("tenant", "rule", "stage", "version", "last outcome", "span", "samples", "evaluated", "last decided")


def status_rows(
    statuses: dict[str, RuleEvaluation], *, tenant: str | None = None, all_rules: bool = False
) -> list[tuple[str, ...]]:
    """Table rows, sorted by tenant, rule, stage, version."""
    rows: list[tuple[str, ...]] = []
    for e in sorted(statuses.values(), key=lambda e: (e.tenant, e.rule, e.stage, e.version)):
        if tenant is not None and e.tenant != tenant:
            continue
        if not all_rules and e.rule not in SPAN_RULES:
            continue
        decided = e.last_decided_at
        rows.append(
            (
                e.tenant,
                e.rule,
                e.stage or "-",
                e.version or "-",
                e.outcome if e.outcome in DECIDED_OUTCOMES else e.outcome.upper(),
                f"{e.span_windows} w",
                str(e.samples),
                _when(e.window_start),
                "now" if decided is not None and decided == e.window_start else _when(decided),
            )
        )
    return rows


def status_records(
    statuses: dict[str, RuleEvaluation], *, tenant: str | None = None, all_rules: bool = False
) -> list[dict[str, object]]:
    """The rows of :func:`status_rows` as JSON objects: the evaluation's fields, times in epoch ms, and
    ``decided`` (whether the last outcome decided something)."""
    records: list[dict[str, object]] = []
    for e in sorted(statuses.values(), key=lambda e: (e.tenant, e.rule, e.stage, e.version)):
        if (tenant is not None and e.tenant != tenant) or (not all_rules and e.rule not in SPAN_RULES):
            continue
        records.append(
            {
                "tenant": e.tenant,
                "rule": e.rule,
                "stage": e.stage or None,
                "version": e.version or None,
                "outcome": e.outcome,
                "decided": e.outcome in DECIDED_OUTCOMES,
                "span_windows": e.span_windows,
                "samples": e.samples,
                "window_start": e.window_start,
                "last_decided_at": e.last_decided_at,
            }
        )
    return records


def render_status(rows: list[tuple[str, ...]]) -> str:
    """A plain aligned table (undecided outcomes in capitals, so they stand out)."""
    table: list[tuple[str, ...]] = [HEADER, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip() for r in table]
    return "\n".join(lines) + "\n"
