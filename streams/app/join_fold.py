"""The join as a fold of the partition-batch runner: stage events in, request records out.

:class:`JoinFold` decodes each record of a fetch and folds it through :class:`streams.core.join.RequestJoin`
(bad ones become dead letters), advances the partitions that moved or are idle, and emits the records,
the dead letters and the watermark heartbeats. The runner (:mod:`streams.kafka.batches`) owns the order
in which they become durable: records, then the state of every request touched (one changelog write per
request per checkpoint, at most every ``join.state_every_ms`` or ``join.batch_max`` events), then the
offsets. A crash before the commit replays the fetches: the restored state recognises the events already
folded (by source offset), and a record emitted twice is absorbed by the store.

The consumer group and the changelog topic keep the names the earlier Faust adapter used
(``{app_id}-join`` and ``{app_id}-join-join-state-changelog``), so an upgrade resumes from the committed
offsets with the open requests intact.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import orjson
from aiokafka import ConsumerRecord, TopicPartition
from prometheus_client import Counter

from schemas.dead_letter import DeadLetter, make_dead_letter
from schemas.decode import decode_stage_event
from schemas.events import StageEvent
from streams.app.join_guard import QuarantineReporter
from streams.app.keyed_state import KeyedStateFold
from streams.app.metrics import WorkerMetrics, sync_counter
from streams.core.guard import DeadLetterGuard
from streams.core.join import RequestJoin
from streams.core.join_state import exact_bytes
from streams.core.tenancy import TenantBudgets
from streams.core.watermarks import WATERMARK_KEY
from streams.kafka.batches import (
    Emit,
    Outputs,
    PartitionView,
    Records,
    Report,
    RunnerConfig,
    RunnerMetrics,
    by_key,
)
from streams.kafka.unreadable import unreadable_letter
from streams.settings import Settings
from streams.views.rule_status import read_topic_values

JOIN_STATE_TABLE = "join-state"
HEARTBEAT_INTERVAL_MS = 500.0
#: Records folded between two yields to the event loop (the in-flight completion progresses there).
FOLD_SLICE = 250


def join_group_id(settings: Settings) -> str:
    """The join's consumer group: the id Faust gave the join app, so offsets carry over."""
    return f"{settings.app_id}-join"


def changelog_topic(settings: Settings) -> str:
    """The compacted topic of the join state (Faust's name for the ``join-state`` table's changelog)."""
    return f"{join_group_id(settings)}-{JOIN_STATE_TABLE}-changelog"


def input_topics(settings: Settings) -> tuple[str, ...]:
    """The shared stage-events topic, then each bound tenant's topic: their order is their state slot (a
    bound topic's partition ``p`` is the core's partition ``slot * partitions + p``, so each input partition
    keeps its own watermark and changelog partition)."""
    return (settings.topic("stage-events"), *settings.bound_topics())


def join_runner_config(settings: Settings) -> RunnerConfig:
    """The join's consumer: whole fetches of ``join.batch_max`` events, completed behind the next fold."""
    join = settings.join
    return RunnerConfig(
        name="join",
        group_id=join_group_id(settings),
        topics=input_topics(settings),
        output_topics=(settings.topic("requests"), settings.topic("dead-letter"), settings.topic("alerts")),
        routes={settings.topic("alerts"): by_key},  # one alert's transitions on one partition, in order
        changelog=changelog_topic(settings),
        changelog_partitions=settings.partitions * len(input_topics(settings)),
        batch_max=join.batch_max,
        # A fetch is join.batch_max events (10k ~ 4 MB): 16 MiB of prefetch keeps the consumer ahead without
        # holding 64 MiB of fetch buffers in every worker (RSS per open request).
        fetch_max_bytes=16 * 1_048_576,
        max_partition_fetch_bytes=2 * 1_048_576,
        state_every_ms=float(join.state_every_ms),
        state_every_events=join.batch_max,
        pipelined=True,
    )


def join_runner_metrics(metrics: WorkerMetrics) -> RunnerMetrics:
    return RunnerMetrics(
        consumed=metrics.events_consumed,
        acked=metrics.events_acked,
        unacked=metrics.unacked_events,
        batches=metrics.batches,
        lag=metrics.consumer_lag,
        refused=metrics.produce_refused.labels("batch"),
        health=metrics.health,
    )


class JoinFold(KeyedStateFold):
    """Stage events → request records, dead letters and watermark heartbeats (module docstring)."""

    core: RequestJoin

    def __init__(
        self, settings: Settings, metrics: WorkerMetrics, *, wall_clock: Callable[[], float] = time.time
    ) -> None:
        super().__init__(settings, metrics, changelog_topic(settings), wall_clock)
        wait = settings.join.max_window_wait_ms
        self.core = RequestJoin(
            settings.join,
            settings.windows.window_s * 1000,
            TenantBudgets.from_settings(settings),
            window_lag_ms=settings.windows.grace_s * 1000 if wait is None else wait,
        )
        self.requests_topic = settings.topic("requests")
        caps = settings.caps
        self.guard = DeadLetterGuard(
            caps.halt_window_messages,
            caps.halt_dead_letter_share,
            caps.max_quarantined_tenants,
            caps.quarantine_release_messages,
        )
        self.quarantines = QuarantineReporter(settings, self.guard, metrics)
        self._slots = {topic: slot for slot, topic in enumerate(input_topics(settings))}
        self._stride = settings.partitions
        #: Bound producers: topic -> the only tenant it may carry, and the tenants bound to a topic.
        self._bound = settings.bound_topics()
        self._bound_tenants = frozenset(self._bound.values())
        self.alerts_topic = settings.topic("alerts")
        #: Reads ``ttft.alerts`` whole when partitions are assigned (the quarantines they held).
        self.read_alerts: Callable[[], Awaitable[list[bytes | None]]] = self._read_alerts
        self._producer_header = caps.producer_header
        self._last_heartbeat_ms = 0.0
        #: Records emitted by status and dead letters by reason since the fold began: added to their counters
        #: once per fold (a counter's inc takes a lock, ~1 µs: a flood of bad input pays it per message).
        self._emitted_by_status: dict[str, int] = {}
        self._dead_by_reason: dict[str, int] = {}
        #: Old (bare request id) changelog keys to delete once their re-keyed states are written.
        self._legacy_tombstones: list[tuple[str, int]] = []
        metrics.health["status"] = "starting"

    # --- BatchFold --------------------------------------------------------------------------------

    async def fold(self, records: Records, now_ms: float, view: PartitionView, emit: Emit) -> None:
        if len(self.quarantines.owned) != len(view.owned):  # the holders of a tenant quarantined now
            self.quarantines.owned = {tp.partition for tp in view.owned}
        if self.quarantines.legacy:  # pages from before claims, resolved once (an upgrade)
            self._report_quarantines(emit, 0, now_ms)
        folded: set[int] = set()
        for tp, items in records.items():
            core = self._core_partition(tp)
            for start in range(0, len(items), FOLD_SLICE):
                if start:
                    await asyncio.sleep(0)  # lets the previous completion and the fetcher progress
                self._fold(items[start : start + FOLD_SLICE], core, now_ms, emit)
            folded.add(core)
        for tp in sorted(view.owned):
            caught_up, core = view.idle(tp), self._core_partition(tp)
            if caught_up or core in folded:
                for record in self.core.advance(core, now_ms, caught_up):
                    self._add_record(emit, core, record)
            else:
                self.core.hold_idle(core)
        self._add_heartbeats(emit, view, now_ms)
        self._count_outputs()

    def _count_outputs(self) -> None:
        """The records and dead letters of this fold, added to their counters."""
        m = self.metrics
        for status, n in self._emitted_by_status.items():
            m.records_emitted.labels(status).inc(n)
        for reason, n in self._dead_by_reason.items():
            m.dead_letters.labels(reason).inc(n)
        self._emitted_by_status.clear()
        self._dead_by_reason.clear()

    def state_partitions(self, partitions: Iterable[TopicPartition]) -> list[int]:
        return sorted(self._core_partition(tp) for tp in partitions)

    def _core_partition(self, tp: TopicPartition) -> int:
        """The core's partition of an input partition: its number on the shared topic, offset by the topic's
        slot on a bound tenant's topic."""
        slot: int = self._slots.get(tp.topic, 0)
        return slot * self._stride + int(tp.partition)

    def take_dirty(self) -> Outputs:
        """One changelog write per request touched since the last call (None: forgotten, a tombstone); the
        deletions of re-keyed legacy keys follow the writes of their new keys."""
        state = super().take_dirty()
        for key, partition in self._legacy_tombstones:
            state.setdefault((self.changelog, partition), []).append((key.encode(), None))
        self._legacy_tombstones = []
        return state

    async def restore(self, partitions: list[TopicPartition]) -> None:
        await super().restore(partitions)
        # States restored under a bare request id move to their (tenant, id) key: the core marked the new
        # entries dirty; the old keys are deleted after them, in the next checkpoint.
        owned = set(self.state_partitions(partitions))
        self._legacy_tombstones += [(key, p) for key, p in self.core.legacy_keys if p in owned]
        self.core.legacy_keys = [(key, p) for key, p in self.core.legacy_keys if p not in owned]
        self.metrics.open_requests.set(self.core.open_requests)
        self.metrics.pool_open_requests.set(self.core.pool_open_requests)
        self.metrics.pool_remembered_requests.set(self.core.pool_remembered_requests)
        self.metrics.promoted_tenants.set(self.core.budgets.promoted)
        # The quarantines these partitions held before (a restart, a rebalance) hold again, without a page.
        if partitions:
            claims = await self.read_alerts()
            self.quarantines.owned |= {tp.partition for tp in partitions}
            self.quarantines.restore({tp.partition for tp in partitions}, claims)

    def revoke(self, partitions: set[TopicPartition]) -> None:
        super().revoke(partitions)
        self.quarantines.revoke({tp.partition for tp in partitions})

    async def _read_alerts(self) -> list[bytes | None]:
        """``ttft.alerts`` from its beginning to its end (compacted: the latest transition of each claim)."""
        return await read_topic_values(self.settings, self.alerts_topic)

    def report(self) -> Report:
        """The gauges as of this fold (the runner publishes them once its outputs are acknowledged)."""
        core = self.core
        open_requests, pool = core.open_requests, (core.pool_open_requests, core.pool_remembered_requests)
        promoted = core.budgets.promoted
        return lambda: self._publish(open_requests, pool, promoted)

    def _publish(self, open_requests: int, pool: tuple[int, int], promoted: int) -> None:
        c, m = self.core.counters, self.metrics
        m.open_requests.set(open_requests)
        m.pool_open_requests.set(pool[0])
        m.pool_remembered_requests.set(pool[1])
        m.promoted_tenants.set(promoted)
        sync_counter(m.duplicates, c.duplicates)
        sync_counter(m.late_events, c.late_events)
        sync_counter(m.evictions, c.evictions)
        sync_counter(m.replayed_events, c.replayed)
        for cap, total in c.caps.items():
            sync_counter(m.caps_tripped.labels(cap), total)

    # --- the per-event loop -----------------------------------------------------------------------

    def _fold(self, records: Sequence[ConsumerRecord[Any, Any]], core: int, now: float, emit: Emit) -> None:
        """Decode and fold one input partition's records in order into the core's partition ``core``."""
        caps = self.settings.caps
        guard, observe, add, decode = self.guard, self.guard.observe, self.core.add, decode_stage_event
        header = self._producer_header
        bound = self._bound.get(records[0].topic) if self._bound and records else None
        for record in records:
            p, offset, timestamp = record.partition, record.offset, record.timestamp
            append_time = timestamp if record.timestamp_type == 1 else None  # LogAppendTime: the broker's
            decoded = decode(
                record.value,
                record.key,
                record.topic,
                p,
                offset,
                timestamp,
                caps,
                now,
                append_time_ms=append_time,
            )
            tenant = decoded.tenant_id
            if self._bound_tenants and type(decoded) is not DeadLetter:
                decoded, tenant = self._check_binding(decoded, bound, record, now)
            # Exact-type checks: decode returns a StageEvent or a DeadLetter, and isinstance answers "no" for a
            # pydantic model class only through ABCMeta's subclass check.
            headers = record.headers
            observe(type(decoded) is DeadLetter, tenant, p, _producer(headers, header) if headers else None)
            if guard.newly_quarantined or guard.released:
                self._report_quarantines(emit, core, now)
            if not isinstance(decoded, StageEvent):
                if record.value is None:  # a tombstone, or the runner's stand-in for a record it cannot read
                    decoded = unreadable_letter(record, now, caps.dead_letter_bytes) or decoded
                self._add_dead_letter(emit, core, decoded)
                continue
            for out in add(decoded, core, now, offset):
                if isinstance(out, dict):
                    self._add_record(emit, core, out)
                else:
                    self._add_dead_letter(emit, core, out.to_dead_letter(_Source(record), now, caps))

    def _check_binding(
        self, event: StageEvent | DeadLetter, bound: str | None, record: ConsumerRecord[Any, Any], now: float
    ) -> tuple[StageEvent | DeadLetter, str | None]:
        """A bound topic carries its tenant's events only, and a bound tenant's events come from its topic only:
        anything else is dead-lettered ``tenant_not_allowed`` (with the guard's tenant: the bound topic's, or
        none for a claim on the shared topic, so a forger's flood never quarantines the tenant it names)."""
        claimed = event.tenant_id
        if bound is not None and claimed != bound:
            detail = f"topic {record.topic} is bound to tenant {bound!r}; the event claims tenant {claimed!r}"
        elif bound is None and claimed in self._bound_tenants:
            detail = f"tenant {claimed!r} is bound to its own topic; the event came on {record.topic}"
        else:
            return event, claimed
        letter = make_dead_letter(
            "tenant_not_allowed",
            detail,
            record.value or b"",
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            kafka_timestamp_ms=record.timestamp if record.timestamp is not None and record.timestamp >= 0 else None,
            max_original_bytes=self.settings.caps.dead_letter_bytes,
            received_at_ms=now,
            request_id=event.request_id,
            tenant_id=bound,
        )
        return letter, bound

    def _report_quarantines(self, emit: Emit, source: int, now: float) -> None:
        """The guard quarantined or released a source: its page goes out with this batch's outputs."""
        self.quarantines.report(now, lambda key, value: emit(self.alerts_topic, key, value, source))

    def _add_record(self, emit: Emit, source: int, record: dict[str, Any]) -> None:
        status = record["status"]
        self._emitted_by_status[status] = self._emitted_by_status.get(status, 0) + 1
        emit(self.requests_topic, record["request_id"].encode(), exact_bytes(record), source)

    def _add_dead_letter(self, emit: Emit, source: int, dl: DeadLetter) -> None:
        reason = dl.reason_code
        self._dead_by_reason[reason] = self._dead_by_reason.get(reason, 0) + 1
        key = f"{dl.source_topic}:{dl.source_partition}:{dl.source_offset}".encode()
        emit(self.dead_letter_topic, key, _dead_letter_json(dl), source)

    def _add_heartbeats(self, emit: Emit, view: PartitionView, now_ms: float) -> None:
        """Each owned partition's watermark, on every requests partition, after the records it vouches for
        (the writer closes windows on the minimum; a partition without events sends nothing, one whose
        backlog is not read yet sends 0, which holds the writer's windows until it is)."""
        if now_ms - self._last_heartbeat_ms < HEARTBEAT_INTERVAL_MS:
            return
        self._last_heartbeat_ms = now_ms
        stats = {
            "worker_id": self.metrics.worker_id,
            "open_requests": self.core.open_requests,
            "evictions": self.core.counters.evictions,
            # The OTLP bridge's, beside the join in this process (its fold syncs the counter; 0 without it).
            "otlp_cut_off_traces": _total(self.metrics.otlp_cut_off_traces),
        }
        for tp in sorted(view.owned):
            core = self._core_partition(tp)
            watermark = self.core.watermark(core, now_ms if view.idle(tp) else None)
            if not watermark and not view.unread_backlog(tp):
                continue  # never carried an event: holds nobody back
            value = orjson.dumps({"watermark_ms": watermark, "source_partition": core, "lag": view.lag(tp), **stats})
            emit.everywhere(self.requests_topic, WATERMARK_KEY, value)


def _total(counter: Counter) -> float:
    """An unlabelled counter's value (its one family's ``_total`` sample)."""
    return next((s.value for f in counter.collect() for s in f.samples if s.name.endswith("_total")), 0.0)


def _producer(headers: Sequence[tuple[str, bytes]], name: str) -> str | None:
    """The producer a message names in its ``name`` header (bounded, undecodable bytes replaced), if any."""
    for key, value in headers:
        if key == name and value:
            return value[:128].decode("utf-8", "replace")
    return None


#: ``model_dump_json().encode()`` in one step: the model's serializer writes the bytes.
_dead_letter_json: Callable[[DeadLetter], bytes] = DeadLetter.__pydantic_serializer__.to_json


class _Source:
    """A consumer record seen as :class:`streams.core.join.SourceMessage` (timestamp in seconds)."""

    def __init__(self, record: ConsumerRecord[Any, Any]) -> None:
        self.value: bytes | None = record.value
        self.topic: str = record.topic
        self.partition: int = record.partition
        self.offset: int = record.offset
        self.timestamp: float | None = None if record.timestamp is None else record.timestamp / 1000.0
