"""The durable alert outbox: the ``ttft.alerts`` topic, and the loop that delivers it to Alertmanager.

Why a topic: an Alertmanager outage, or a worker restart during one, must lose no transition. The worker
produces every transition to ``ttft.alerts`` (key = fingerprint, so one alert's transitions stay in order
on one partition; :func:`alert_message` builds the record). The delivery loop consumes the topic with a
consumer group and commits offsets only after Alertmanager accepted everything folded so far.

On start the loop reads every assigned partition from the beginning (a compacted topic keeps the latest
transition per fingerprint): messages below the committed offset only rebuild the set of firing alerts,
which are re-sent; messages at or past it are deliveries still owed. Firing alerts are re-sent every
``resend_interval_s`` with ``endsAt`` a few intervals ahead; a resolution is sent once.

Muting (replay/backfill): transitions marked ``muted`` are counted and never delivered, and a loop
started with ``paging_muted`` counts its deliveries as muted instead of sending them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streams.alerting.alertmanager import AlertSink, alertmanager_alert
from streams.kafka.topics import kafka_client_kwargs
from streams.rules.links import AlertLinks
from streams.rules.model import AlertTransition
from streams.settings import Settings

log = logging.getLogger(__name__)


def alert_message(transition: AlertTransition) -> tuple[bytes, bytes]:
    """The ``ttft.alerts`` record of a transition: (key = fingerprint, with a claim's holder; JSON value)."""
    return transition.topic_key.encode("utf-8"), orjson.dumps(transition.to_message())


@dataclass(slots=True)
class _Firing:
    transition: AlertTransition
    first_sent: datetime | None = None
    last_sent_s: float | None = None


@dataclass(frozen=True, slots=True)
class Delivery:
    """One alert to post now: a new transition, or the re-send of a firing alert."""

    transition: AlertTransition
    starts_at: datetime | None
    resend: bool


@dataclass(slots=True)
class DeliveryStats:
    """Counters of the delivery loop (exported as metrics by the caller)."""

    folded: int = 0
    #: folded messages below the committed offset (delivered before a restart)
    replayed: int = 0
    malformed: int = 0
    delivered: int = 0
    resent: int = 0
    muted: int = 0
    failed_posts: int = 0
    #: alerts Alertmanager refused (a 400 for the alert itself): dropped, never re-sent
    refused: int = 0


@dataclass(slots=True)
class DeliveryState:
    """A fold of ``ttft.alerts`` into what Alertmanager must be told.

    ``owed``: transitions not yet delivered (the latest per fingerprint). ``firing``: alerts to keep
    re-sending. ``pending``: alerts in their ``for`` phase (not paged; kept so a restarted engine can
    resume them with :meth:`active_transitions`).
    """

    owed: dict[str, AlertTransition] = field(default_factory=dict)
    firing: dict[str, _Firing] = field(default_factory=dict)
    pending: dict[str, AlertTransition] = field(default_factory=dict)
    stats: DeliveryStats = field(default_factory=DeliveryStats)
    #: Shared alerts (:attr:`AlertTransition.claim`): fingerprint -> holder -> its firing claim. The alert
    #: pages with its first claim and resolves with its last: one page per source, whoever holds it.
    claims: dict[str, dict[str, AlertTransition]] = field(default_factory=dict)

    def fold(self, transition: AlertTransition, *, replayed: bool = False) -> None:
        """Fold one transition; ``replayed`` ones (below the committed offset) were delivered already."""
        self.stats.folded += 1
        self.stats.replayed += int(replayed)
        fp = transition.fingerprint
        if transition.muted:
            self.stats.muted += 1
            return
        if transition.state == "pending":
            self.pending[fp] = transition
            return
        self.pending.pop(fp, None)
        if transition.claim is not None and not self._fold_claim(fp, transition):
            return
        if transition.claim is None and transition.state == "resolved" and self.claims.get(fp):
            return  # a page from before claims, resolved while holders claim it again: theirs to resolve
        if transition.state == "firing":
            previous = self.firing.get(fp)
            self.firing[fp] = _Firing(transition, previous.first_sent if previous else None)
            if not replayed:
                self.owed[fp] = transition
            return
        was_firing = self.firing.pop(fp, None) is not None
        if not replayed and (was_firing or transition.fired_at is not None):
            self.owed[fp] = transition
        else:
            self.owed.pop(fp, None)  # a pending alert that cleared was never paged

    def _fold_claim(self, fp: str, transition: AlertTransition) -> bool:
        """Record one holder's claim; True when the alert itself changes (its first firing claim, or its last
        claim resolved), False when another holder already pages it or still holds it."""
        holders = self.claims.setdefault(fp, {})
        holder = (transition.claim or {}).get("holder", "")
        if transition.state == "firing":
            first = not holders and fp not in self.firing
            holders[holder] = transition
            return first
        holders.pop(holder, None)
        if holders:
            return False
        del self.claims[fp]
        return True

    def fold_message(self, value: bytes | None, *, replayed: bool = False) -> None:
        """Fold a raw topic value; a malformed one is counted and skipped (it can never be delivered)."""
        try:
            transition = AlertTransition.from_message(orjson.loads(value or b""))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            self.stats.malformed += 1
            log.warning("skipping malformed ttft.alerts message: %s", exc)
            return
        self.fold(transition, replayed=replayed)

    def due(self, now_s: float, resend_interval_s: float) -> list[Delivery]:
        """Owed transitions, then firing alerts whose last send is older than the re-send interval."""
        out = [
            Delivery(t, self.firing[fp].first_sent if fp in self.firing else None, False)
            for fp, t in sorted(self.owed.items())
        ]
        for fp, f in sorted(self.firing.items()):
            if fp not in self.owed and (f.last_sent_s is None or now_s - f.last_sent_s >= resend_interval_s):
                out.append(Delivery(f.transition, f.first_sent, True))
        return out

    def mark_delivered(self, deliveries: Iterable[Delivery], now_s: float, *, muted: bool = False) -> None:
        """Record that ``deliveries`` were accepted (or muted) at wall time ``now_s``."""
        now_dt = datetime.fromtimestamp(now_s, tz=UTC)
        for d in deliveries:
            fp = d.transition.fingerprint
            if self.owed.get(fp) is d.transition:
                del self.owed[fp]
            f = self.firing.get(fp)
            if f is not None:
                f.last_sent_s = now_s
                if f.first_sent is None and not muted:
                    f.first_sent = now_dt
            if muted:
                self.stats.muted += 1
            elif d.resend:
                self.stats.resent += 1
            else:
                self.stats.delivered += 1

    def refuse(self, delivery: Delivery) -> None:
        """Alertmanager refused this alert itself: it is owed no more and not re-sent (every re-send would
        be refused too, and would hold the outbox's offsets, so every later alert, forever)."""
        fp = delivery.transition.fingerprint
        if self.owed.get(fp) is delivery.transition:
            del self.owed[fp]
        self.firing.pop(fp, None)
        self.stats.refused += 1

    def active_transitions(self) -> list[AlertTransition]:
        """Firing and pending alerts, for :meth:`streams.rules.RuleEngine.restore` after a restart."""
        firing = [f.transition for _, f in sorted(self.firing.items())]
        return firing + [t for _, t in sorted(self.pending.items())]


async def deliver_due(
    state: DeliveryState,
    client: AlertSink,
    now_s: float,
    *,
    resend_interval_s: float,
    ends_after_intervals: float = 4.0,
    paging_muted: bool = False,
    on_refused: Callable[[AlertTransition, str], None] | None = None,
    links: AlertLinks | None = None,
) -> bool:
    """Post everything due in one batch; ``True`` when nothing is owed any more (delivered, or refused by
    Alertmanager for what the alert holds: see :func:`_deliver_one_by_one`). ``links``: the deployment's
    link targets, set on every alert (:func:`streams.alerting.alertmanager.alertmanager_alert`)."""
    deliveries = state.due(now_s, resend_interval_s)
    if not deliveries:
        return True
    if paging_muted:
        state.mark_delivered(deliveries, now_s, muted=True)
        return True
    now = datetime.fromtimestamp(now_s, tz=UTC)
    ends_in = timedelta(seconds=resend_interval_s * ends_after_intervals)
    body = [
        alertmanager_alert(d.transition, now=now, ends_in=ends_in, starts_at=d.starts_at, links=links)
        for d in deliveries
    ]
    if await client.post(body):
        state.mark_delivered(deliveries, now_s)
        return True
    if client.refusal is not None:
        return await _deliver_one_by_one(state, client, deliveries, body, now_s, on_refused)
    state.stats.failed_posts += 1
    return False


async def _deliver_one_by_one(
    state: DeliveryState,
    client: AlertSink,
    deliveries: list[Delivery],
    body: list[dict[str, object]],
    now_s: float,
    on_refused: Callable[[AlertTransition, str], None] | None,
) -> bool:
    """Alertmanager refused a batch for what is in it: post each alert alone, so that the ones it accepts
    page and only the ones it refuses are dropped (logged, counted, and handed to ``on_refused``)."""
    for delivery, alert in zip(deliveries, body, strict=True):
        if await client.post([alert]):
            state.mark_delivered([delivery], now_s)
            continue
        if client.refusal is None:  # not the alert's fault after all: retry what is left later
            state.stats.failed_posts += 1
            return False
        state.refuse(delivery)
        labels = dict(delivery.transition.labels)
        log.error(
            "alertmanager refused alert %s (%s); dropped, never re-sent: %s",
            labels,
            delivery.transition.state,
            client.refusal,
        )
        if on_refused is not None:
            on_refused(delivery.transition, client.refusal)
    return True


@dataclass(frozen=True, slots=True)
class DeliveryOptions:
    """Timing of the delivery loop (wall clock; Alertmanager's world)."""

    resend_interval_s: float = 60.0
    ends_after_intervals: float = 4.0
    poll_timeout_ms: int = 1_000
    retry_initial_s: float = 1.0
    retry_max_s: float = 30.0
    paging_muted: bool = False
    #: The deployment's board and runbook links, set on every alert delivered (None: as the alert has them).
    links: AlertLinks | None = None


async def topic_partitions(settings: Settings, topic: str) -> list[int]:
    """Partition numbers of ``topic`` (the delivery loop assigns itself all of them)."""
    admin = AIOKafkaAdminClient(**kafka_client_kwargs(settings))
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    for entry in described:
        if entry.get("topic") == topic and not entry.get("error_code") and entry.get("partitions"):
            return sorted(int(p["partition"]) for p in entry["partitions"])
    raise RuntimeError(f"topic {topic} does not exist (create it with the worker's topic setup)")


async def read_outbox_state(settings: Settings, *, timeout_s: float = 30.0) -> DeliveryState:
    """Fold the whole ``ttft.alerts`` topic without delivering anything (no group, no commit).

    For a restarting worker: ``RuleEngine.restore(state.active_transitions())`` resumes its alerts.
    """
    state = DeliveryState()
    topic = settings.topic("alerts")
    tps = [TopicPartition(topic, p) for p in await topic_partitions(settings, topic)]
    consumer = AIOKafkaConsumer(enable_auto_commit=False, **kafka_client_kwargs(settings))
    await consumer.start()
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} took longer than {timeout_s} s")
            batch = await consumer.getmany(*tps, timeout_ms=500, max_records=1_000)
            for records in batch.values():
                for record in records:
                    state.fold_message(record.value, replayed=True)
    finally:
        await consumer.stop()
    return state


def delivery_group_id(settings: Settings) -> str:
    """Consumer group of the delivery loop (offsets = what Alertmanager has accepted)."""
    return f"{settings.app_id}-alert-delivery"


async def run_delivery_loop(
    settings: Settings,
    client: AlertSink,
    stop: asyncio.Event,
    *,
    options: DeliveryOptions | None = None,
    state: DeliveryState | None = None,
    clock: Callable[[], float] = time.time,
    on_pending: Callable[[int], None] | None = None,
    on_refused: Callable[[AlertTransition, str], None] | None = None,
) -> DeliveryState:
    """Consume ``ttft.alerts`` and deliver it until ``stop`` is set; returns the final state.

    Offsets are committed only after a successful delivery of everything folded so far; on failure the
    loop keeps folding and retries with capped exponential back-off. All partitions are assigned to this
    consumer (no rebalancing): run one loop per deployment; a second one only duplicates posts, which
    Alertmanager deduplicates by labels. After every delivery attempt ``on_pending`` (e.g. a gauge's
    ``set``) gets the number of transitions still owed to Alertmanager; ``on_refused`` gets each alert
    Alertmanager refused for what it holds (dropped: it would hold the offsets of every later alert).
    """
    opts = options or DeliveryOptions()
    state = state if state is not None else DeliveryState()
    topic = settings.topic("alerts")
    consumer = AIOKafkaConsumer(
        group_id=delivery_group_id(settings),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **kafka_client_kwargs(settings),
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in await topic_partitions(settings, topic)]
        consumer.assign(tps)
        committed = {tp: await consumer.committed(tp) for tp in tps}
        await consumer.seek_to_beginning(*tps)
        backoff = opts.retry_initial_s
        uncommitted = False
        while not stop.is_set():
            batch = await consumer.getmany(*tps, timeout_ms=opts.poll_timeout_ms, max_records=500)
            uncommitted = uncommitted or bool(batch)
            for tp, records in batch.items():
                done = committed.get(tp)
                for record in records:
                    state.fold_message(record.value, replayed=done is not None and record.offset < done)
            ok = await deliver_due(
                state,
                client,
                clock(),
                resend_interval_s=opts.resend_interval_s,
                ends_after_intervals=opts.ends_after_intervals,
                paging_muted=opts.paging_muted,
                on_refused=on_refused,
                links=opts.links,
            )
            if on_pending is not None:
                on_pending(len(state.owed))
            if ok:
                if uncommitted:
                    await consumer.commit()
                    uncommitted = False
                backoff = opts.retry_initial_s
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=backoff)
            backoff = min(backoff * 2.0, opts.retry_max_s)
    finally:
        await consumer.stop()
    return state
