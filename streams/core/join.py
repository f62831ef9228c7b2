"""The request join: stage events of ``(tenant_id, request_id)`` in, request records out (pure; time injected).

:class:`RequestJoin` holds the state of the partitions one worker owns. Per partition it keeps an
event-time watermark **per tenant**, ``max(ts_ms + duration_ms)`` over the tenant's accepted events on that
partition, moved on by an idle tick when the partition is caught up and the tenant sent nothing for
``idle_tick_ms`` of wall time (live traffic finalises; a replay at full speed never idles, so it is
deterministic). One tenant's clock therefore never times out another tenant's requests: a tenant's watermark
follows the partition's leading tenant only when it trails it by more than ``max_tenant_lag_ms`` (a quiet
tenant during a backlog). The partition's watermark the writer sees (:meth:`RequestJoin.watermark`) is the
lowest of its tenants' (once caught up, a tenant whose events are older than ``window_lag_ms`` when they
arrive no longer holds it: its records become late amendments of closed windows). With registration (on in
the worker by default: :mod:`streams.core.tenancy`), "tenant" above means a registered tenant or the pool of
all others. A request
is emitted once its tenant's watermark passes its deadline:

* with ``first_token``: ``max(first_token_at, latest event end) + grace_ms``;
* without: ``started_at + request_timeout_ms`` (timed_out, or orphan without request_start);
* never earlier than ``grace_ms`` after the watermark its first event found, so the events of a request
  from a lagging clock still get a grace period to join.

After emission a request is remembered (``emitted``) until the watermark passes its emission deadline
+ ``forget_after_ms``: a duplicate is counted, a new event is folded in and the whole record re-emitted
(a late amendment; the store keeps the most complete version). An event of a forgotten request yields
an ``amend=True`` record of that event alone, merged by the writer with :func:`merge_records`.

Durability contract with the adapter: :meth:`RequestJoin.dirty` returns, once per batch, the packed
state of every request that changed (None: delete); the adapter writes exactly these to the changelog
before acknowledging the batch's events, and :meth:`RequestJoin.restore` rebuilds from them.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import orjson

from schemas.dead_letter import DeadLetter, DeadLetterReason, make_dead_letter
from schemas.events import MIN_TS_MS, StageEvent
from schemas.records import STATUS_ORDER, RequestStatus
from schemas.vocabulary import LLM_UNMEASURED
from streams.core.join_record import build_record, merge_records
from streams.core.join_state import (
    EVENT_RECORD,
    STATE_FIXED_BYTES,
    Conflict,
    PendingRequest,
    event_id_key,
    fields_digest,
    state_key,
)
from streams.core.tenancy import POOL, SteadyTenants, TenantBudgets
from streams.settings import CapsConfig, JoinConfig

__all__ = [
    "FORGOT_PREFIX",
    "PROMOTIONS_PREFIX",
    "JoinCounters",
    "JoinOutput",
    "PendingRequest",
    "Refusal",
    "RequestJoin",
    "SourceMessage",
    "TenantMismatch",
    "build_record",
    "merge_records",
]


#: The changelog key of the join's promoted tenants on a partition is this prefix and the partition's number:
#: a state key of the reserved pool tenant, which no request has. Written to every partition with state when
#: the promoted set changes, so a restarted join (or a partition's next owner) keeps the promotions.
PROMOTIONS_PREFIX: Final = f"{POOL}\x00promoted\x00"
#: The changelog key of a clock's early-forget mark (:attr:`_TenantClock.forgot_until`): this prefix, the
#: partition's number, NUL and the clock's budget (a registered tenant, or the pool). Written when the mark
#: moves, with the clock's watermark, and deleted once the watermark has passed it, so that after a restart (or
#: on the partition's next owner) a late event of a request forgotten early is still sent as an amendment.
FORGOT_PREFIX: Final = f"{POOL}\x00forgot\x00"


class SourceMessage(Protocol):
    """The parts of a Kafka message a dead letter keeps (a Faust ``Message`` fits)."""

    @property
    def value(self) -> bytes | None: ...
    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class TenantMismatch:
    """An event rejected because its tenant differs from the one its request established."""

    event: StageEvent
    detail: str

    def to_dead_letter(self, message: SourceMessage, received_at_ms: float, caps: CapsConfig) -> DeadLetter:
        """The ``tenant_mismatch`` dead letter of the message that carried the event."""
        ts = message.timestamp
        return make_dead_letter(
            "tenant_mismatch",
            self.detail,
            message.value or b"",
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            kafka_timestamp_ms=None if ts is None else int(ts * 1000),
            max_original_bytes=caps.dead_letter_bytes,
            received_at_ms=received_at_ms,
            request_id=self.event.request_id,
            tenant_id=self.event.tenant_id,
        )


@dataclass(frozen=True, slots=True)
class Refusal:
    """An event the join refuses, dead-lettered by the adapter with ``reason``.

    ``earlier_offset`` >= 0: the refused copy is an earlier message of the same partition (a conflicting
    duplicate that lost after it was folded), not the message being folded; its dead letter names that
    offset and keeps no original bytes (they are in the topic at that offset).
    """

    reason: DeadLetterReason
    event: StageEvent
    detail: str
    earlier_offset: int = -1

    def to_dead_letter(self, message: SourceMessage, received_at_ms: float, caps: CapsConfig) -> DeadLetter:
        """The dead letter of the refused copy (``message``: the one being folded)."""
        earlier = self.earlier_offset >= 0
        ts = None if earlier else message.timestamp
        return make_dead_letter(
            self.reason,
            self.detail,
            b"" if earlier else message.value or b"",
            topic=message.topic,
            partition=message.partition,
            offset=self.earlier_offset if earlier else message.offset,
            kafka_timestamp_ms=None if ts is None else int(ts * 1000),
            max_original_bytes=caps.dead_letter_bytes,
            received_at_ms=received_at_ms,
            request_id=self.event.request_id,
            tenant_id=self.event.tenant_id,
        )


#: What :meth:`RequestJoin.add` returns: record dicts to produce, and refused events to dead-letter.
JoinOutput = dict[str, Any] | TenantMismatch | Refusal


def _conflict_refusal(event: StageEvent, conflict: Conflict, offset: int | None) -> Refusal:
    loser = "the earlier copy" if conflict.stored_lost else "this copy"
    detail = (
        f"conflicting duplicate of {event.stage} {event.event_id or 'without event_id'} in request "
        f"{event.request_id!r}: {loser} (ts_ms {conflict.loser_ts!r}, duration_ms {conflict.loser_duration!r}) "
        "lost to the copy with the smaller (ts_ms, duration_ms, content digest)"
    )
    earlier = conflict.loser_offset if conflict.stored_lost else -1
    if conflict.stored_lost and earlier < 0:
        earlier = -1 if offset is None else offset  # unknown (old state): named at the winner's offset
    return Refusal("conflicting_duplicate", event, detail, earlier)


#: The bounds the join counts (:attr:`JoinCounters.caps`).
JOIN_CAPS: tuple[str, ...] = (
    "events_per_request",
    "request_state_bytes",
    "request_lifetime",
    "late_reemissions",
    "watermark_step",
    "watermark_lead",
    "open_requests_per_tenant",
    "remembered_requests",
    "open_requests_pool",
    "remembered_requests_pool",
)


@dataclass(slots=True)
class JoinCounters:
    """Running totals since the join was created (never reset; the adapter exports them)."""

    duplicates: int = 0
    late_events: int = 0
    evictions: int = 0
    tenant_mismatches: int = 0
    #: Conflicting duplicates resolved (each dead-letters its losing copy).
    conflicting_duplicates: int = 0
    #: Bounds that tripped, by name: ``events_per_request`` and ``request_state_bytes`` (events refused
    #: ``too_many_events``), ``request_lifetime`` (requests emitted at ``request_timeout_ms`` after their
    #: first event although events kept moving their deadline), ``late_reemissions`` (late events folded
    #: without re-emitting the record at once: it is re-emitted when the request is forgotten).
    caps: dict[str, int] = field(default_factory=lambda: dict.fromkeys(JOIN_CAPS, 0))
    #: Events at or below the request's last folded source offset: replays after a crash, not counted as dups.
    replayed: int = 0
    #: Late events of forgotten requests, emitted as ``amend=True`` records.
    amendments: int = 0
    #: Whole records emitted again because a late event joined a remembered request.
    re_emitted: int = 0
    #: First emissions by status (evictions included).
    emitted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUS_ORDER, 0))


class _TenantClock:
    """One tenant's watermark and deadline heap on one partition. Heap entries are ``(deadline, state key)``;
    an entry whose request no longer has that deadline is stale and skipped (lazy deletion)."""

    __slots__ = ("deadlines", "forgot_until", "idle_base", "last_wall", "watermark")

    def __init__(self) -> None:
        self.watermark = 0.0  # 0: no event yet (every valid ts_ms is far above)
        self.idle_base = 0.0
        self.last_wall: float | None = None
        self.deadlines: list[tuple[float, str]] = []
        #: The latest forget deadline of a request forgotten early (a remembered-requests cap): until the
        #: watermark passes it, a late event without a request may be one of theirs (:meth:`RequestJoin._add_new`).
        self.forgot_until = 0.0


class _Partition:
    """The tenants' clocks of one partition and the highest watermark among them (``lead``)."""

    __slots__ = ("lead", "tenants")

    def __init__(self) -> None:
        self.lead = 0.0
        self.tenants: dict[str, _TenantClock] = {}

    def clock(self, tenant: str) -> _TenantClock:
        clock = self.tenants.get(tenant)
        if clock is None:
            clock = self.tenants[tenant] = _TenantClock()
        return clock


class RequestJoin:
    """Joins the stage events of the partitions one worker owns into request records."""

    def __init__(
        self,
        config: JoinConfig,
        window_ms: int,
        budgets: TenantBudgets | None = None,
        window_lag_ms: float | None = None,
    ) -> None:
        """``budgets``: which tenants share the pool (default: none, every tenant has its own budgets).
        ``window_lag_ms``: how far behind the worker's clock a tenant's watermark may be and still hold the
        watermark the writer closes windows on (see :meth:`watermark`; default ``max_tenant_lag_ms``)."""
        self.config = config
        self.window_ms = window_ms
        self.budgets = budgets if budgets is not None else TenantBudgets()
        self._pooled = self.budgets.pooled
        self._steady: SteadyTenants | None = self.budgets.steady
        self._window_lag_ms = float(config.max_tenant_lag_ms if window_lag_ms is None else window_lag_ms)
        self.counters = JoinCounters()
        self._requests: dict[str, PendingRequest] = {}
        self._partitions: dict[int, _Partition] = {}
        # Requests by state key ((tenant, request id): see join_state.state_key).
        # Open requests by (started_at, state key) for eviction; lazily deleted like the deadline heaps.
        self._ages: dict[str, list[tuple[float, str]]] = {}  # per tenant: (started_at, state key), lazy
        # The age heaps are kept only from the first eviction until the join is well below its caps again
        # (built then from the open requests: the same victims as heaps kept all along, without an entry per
        # open request while no cap is near).
        self._ages_on = False
        self._open = 0
        self._open_by: dict[str, int] = {}  # open requests per tenant
        # Emitted requests by forget deadline, lazy: the registered tenants' and the pool's apart, so that the
        # pool's are forgotten first and never make a registered tenant's go (_forget_excess).
        self._forget_order: list[tuple[float, str]] = []
        self._forget_pool: list[tuple[float, str]] = []
        self._remembered_pool = 0  # emitted requests of the pool held
        self._dirty: dict[str, int] = {}
        #: The partitions the promoted tenants were last written to (their PROMOTIONS_PREFIX entries).
        self._promotions_at: set[int] = set()
        #: (partition, budget) of the clocks whose early-forget mark moved since the last dirty(), and of those
        #: whose mark is in the changelog (deleted by dirty() once their watermark passed it).
        self._forgot_dirty: set[tuple[int, str]] = set()
        self._forgot_written: dict[tuple[int, str], str] = {}  # -> its changelog key
        #: (changelog key, partition) of old-form keys (a bare request id) seen by :meth:`restore`: the
        #: adapter deletes them once the re-keyed states (marked dirty) are written.
        self.legacy_keys: list[tuple[str, int]] = []
        # Event-record bytes below which one more event (a known stage) passes both per-request bounds.
        by_bytes = (config.max_request_state_bytes - STATE_FIXED_BYTES - 128) * 3 // 4 - 3
        self._fast_events_bytes = min((config.max_events_per_request - 1) * EVENT_RECORD.size, by_bytes)
        # The bounds read for every event, copied from the (frozen) config: a field of this class is one load,
        # a settings attribute a lookup through its model.
        self._grace_ms = config.grace_ms
        self._request_timeout_ms = config.request_timeout_ms
        self._forget_after_ms = config.forget_after_ms
        self._max_step_ms = config.max_watermark_step_ms
        self._max_lead_ms = config.max_watermark_lead_ms
        self._max_tenant_lag_ms = config.max_tenant_lag_ms
        self._max_open = config.max_open_requests
        self._max_open_per_tenant = config.max_open_requests_per_tenant
        self._max_open_pool = self.budgets.max_open_pool
        self._max_remembered_pool = self.budgets.max_remembered_pool

    # --- queries --------------------------------------------------------------------------------

    @property
    def open_requests(self) -> int:
        """Requests not yet emitted."""
        return self._open

    @property
    def remembered_requests(self) -> int:
        """Requests held in memory: open plus emitted ones kept to absorb late events."""
        return len(self._requests)

    def watermark(self, partition: int, live_now_ms: float | None = None) -> float:
        """How far the tenants of a partition have progressed, for the writer's windows: the lowest tenant
        watermark (each at least ``max_tenant_lag_ms`` behind the leading one), or the leading one when no
        tenant holds state. The writer closes windows on it, so a tenant running ahead never closes
        another's windows early. 0.0 before the partition's first event.

        ``live_now_ms``: the worker's clock, passed when the partition is caught up (nothing left to read).
        When its leading tenant is then within ``window_lag_ms`` of that clock, a tenant whose watermark
        trails ``min(lead, clock)`` by more than ``window_lag_ms`` no longer holds it: its events are old
        when they arrive (a lagging producer clock or pipeline), and its records reach the writer after
        its windows closed, as late amendments, while the other tenants' windows close on time. The
        reference is capped by the clock, so a tenant running ahead cannot make the others look late; in
        a backlog or a replay of old traffic (no current clock to lag) every tenant holds it, as before."""
        part = self._partitions.get(partition)
        if part is None:
            return 0.0
        if not part.tenants:
            return part.lead
        low = min(self._effective(part, clock) for clock in part.tenants.values())
        if live_now_ms is not None and live_now_ms >= MIN_TS_MS:
            reference = min(part.lead, live_now_ms)
            if reference >= live_now_ms - self._window_lag_ms:
                low = max(low, reference - self._window_lag_ms)
        return low

    def tenant_watermark(self, partition: int, tenant: str) -> float:
        """The watermark a tenant's requests on ``partition`` are emitted by (0.0 before its first event);
        an unregistered tenant's is the pool's."""
        part = self._partitions.get(partition)
        if part is None:
            return 0.0
        clock = part.tenants.get(tenant)
        if clock is None and not self.budgets.is_registered(tenant):
            clock = part.tenants.get(POOL)
        return 0.0 if clock is None else self._effective(part, clock)

    def _adopt_promoted(self, tenants: list[str]) -> None:
        """Tenants just promoted out of the pool take their requests there to their own clocks, on every
        partition, once per promotion. Left on the pool's clock, which their events no longer move, they would
        wait for the pool's idle tick or the lag bound, and hold the writer's windows meanwhile.

        A clock made here starts where the pool's is (the watermark those requests' deadlines were set
        against); a tenant's clock kept from an earlier promotion is raised to it. One pass over each
        partition's pool heap: a moved request's live entry goes along, its stale ones are dropped."""
        prefixes = tuple(tenant + "\x00" for tenant in tenants)
        requests = self._requests
        for partition, part in self._partitions.items():
            pool = part.tenants.get(POOL)
            if pool is None:
                continue
            kept: list[tuple[float, str]] = []
            moved: dict[str, list[tuple[float, str]]] = {}
            for entry in pool.deadlines:
                key = entry[1]
                if not key.startswith(prefixes):
                    kept.append(entry)
                    continue
                pending = requests.get(key)
                if pending is None or pending.partition != partition or pending.deadline != entry[0]:
                    continue  # stale (lazy deletion)
                tenant = pending.tenant
                if pending.budget == POOL:
                    pending.budget = tenant
                    if not pending.emitted:
                        self._count_open(POOL, -1)
                        self._count_open(tenant, +1)
                        if self._ages_on:  # the pool's entry goes stale (_evict_oldest checks the budget)
                            heapq.heappush(self._ages.setdefault(tenant, []), (pending.started_at, key))
                    else:  # its entry in the pool's forget order goes stale (_forget_soonest checks the budget)
                        self._remembered_pool -= 1
                        heapq.heappush(self._forget_order, (pending.deadline, key))
                moved.setdefault(tenant, []).append(entry)
            if len(kept) == len(pool.deadlines):
                continue
            heapq.heapify(kept)
            pool.deadlines = kept
            for tenant, entries in moved.items():
                clock = part.tenants.get(tenant)
                if clock is None:
                    clock = part.tenants[tenant] = _TenantClock()
                    clock.last_wall = pool.last_wall
                    clock.idle_base = pool.idle_base
                if pool.watermark > clock.watermark:
                    clock.watermark = pool.watermark
                    clock.idle_base = max(clock.idle_base, pool.watermark)
                clock.deadlines.extend(entries)
                heapq.heapify(clock.deadlines)
            if not kept:
                del part.tenants[POOL]

    def _effective(self, part: _Partition, clock: _TenantClock) -> float:
        return max(clock.watermark, part.lead - self._max_tenant_lag_ms)

    def get(self, request_id: str, tenant_id: str | None = None) -> PendingRequest | None:
        """The state of a request held in memory (of ``tenant_id``; without one, of any tenant: for tests)."""
        if tenant_id is not None:
            return self._requests.get(state_key(tenant_id, request_id))
        return next((p for p in self._requests.values() if p.request_id == request_id), None)

    @property
    def pool_open_requests(self) -> int:
        """Open requests held under the pool (unregistered tenants)."""
        return self._open_by.get(POOL, 0)

    @property
    def pool_remembered_requests(self) -> int:
        """Emitted requests of the pool held to absorb late events."""
        return self._remembered_pool

    def has_dirty(self) -> bool:
        """True when some request (or the promoted tenants) changed since the last :meth:`dirty`."""
        return bool(self._dirty) or bool(self._forgot_dirty) or self._promotions_due()

    def _promotions_due(self) -> bool:
        """The promoted set changed, or a partition with state has not been written it (once per batch)."""
        steady = self._steady
        if steady is None:
            return False
        return steady.changed or (bool(steady.promoted) and self._partitions.keys() != self._promotions_at)

    def dirty(self) -> dict[str, tuple[int, bytes | None]]:
        """Return and clear ``{state key: (partition, packed state, None: delete)}`` since the last call; with
        them, when they changed, the promoted tenants (:data:`PROMOTIONS_PREFIX`) on each partition."""
        out: dict[str, tuple[int, bytes | None]] = {}
        for key, partition in self._dirty.items():
            pending = self._requests.get(key)
            out[key] = (partition, None if pending is None else pending.to_bytes())
        self._dirty = {}
        steady = self._steady
        if steady is not None and self._promotions_due():
            packed = orjson.dumps({"window": steady.window, "promoted": steady.snapshot()})
            for partition in self._partitions:
                out[PROMOTIONS_PREFIX + str(partition)] = (partition, packed)
            self._promotions_at = set(self._partitions)
            steady.changed = False
        if self._forgot_dirty or self._forgot_written:
            self._forgot_marks(out)
        return out

    def _forgot_marks(self, out: dict[str, tuple[int, bytes | None]]) -> None:
        """The early-forget marks that moved, and the deletions of those the watermark has passed."""
        for partition, budget in self._forgot_dirty:
            clock = self._clock_of(partition, budget)
            if clock is not None:
                key = self._forgot_written.get((partition, budget)) or f"{FORGOT_PREFIX}{partition}\x00{budget}"
                out[key] = (partition, orjson.dumps({"until": clock.forgot_until, "watermark": clock.watermark}))
                self._forgot_written[(partition, budget)] = key
        self._forgot_dirty = set()
        for (partition, budget), key in list(self._forgot_written.items()):
            clock = self._clock_of(partition, budget)
            if clock is None or clock.watermark >= clock.forgot_until:
                out[key] = (partition, None)
                del self._forgot_written[(partition, budget)]

    def _clock_of(self, partition: int, budget: str) -> _TenantClock | None:
        part = self._partitions.get(partition)
        return None if part is None else part.tenants.get(budget)

    # --- events ---------------------------------------------------------------------------------

    def add(self, event: StageEvent, partition: int, now_wall_ms: float, offset: int | None = None) -> list[JoinOutput]:
        """Fold one event; returns records due now (late re-emissions, amendments, evictions) and
        tenant mismatches. ``offset`` (the source offset, optional) lets a replay after a crash be told
        from a genuine duplicate: replayed events change nothing."""
        fields = event.__dict__  # the model's values in one read (see join_state.content_digest)
        tenant: str = fields["tenant_id"]
        pending = self._requests.get(f"{tenant}\x00{fields['request_id']}")  # state_key, inlined (hot path)
        if pending is not None and pending.partition != partition:
            partition = pending.partition  # the key is the request id, so only a misrouted event lands here
        part = self._partitions.get(partition)
        if part is None:
            part = self._partitions[partition] = _Partition()
        if pending is not None:
            budget = pending.budget
        elif self._pooled:
            budget = self.budgets.key(tenant, fields["ts_ms"])
            steady = self._steady
            if steady is not None and steady.fresh:  # a promotion just now: once per promotion
                self._adopt_promoted(steady.take_fresh())
        else:
            budget = tenant
        clock = part.tenants.get(budget)
        if clock is None:
            clock = part.tenants[budget] = _TenantClock()
        clock.last_wall = now_wall_ms
        clock.idle_base = clock.watermark
        if pending is None:  # another tenant's request with the same id is another request
            return self._add_new(event, part, clock, partition, offset, now_wall_ms, budget)
        if offset is not None and pending.offset is not None and offset <= pending.offset:
            self.counters.replayed += 1
            return []
        duration: float | None = fields["duration_ms"]
        end: float = fields["ts_ms"] + (duration or 0.0)
        if pending.customs or len(pending.events) >= self._fast_events_bytes:  # not surely under the caps
            refusal = self._over_cap(pending, event)
            if refusal is not None:
                if end > clock.watermark:  # its time is still evidence that the tenant moved on
                    self._raise(part, clock, end, now_wall_ms)
                return [refusal]
        started_at = pending.start if pending.start is not None else pending.min_ts
        key, digest = event_id_key(fields["event_id"]), fields_digest(fields)
        folded = pending.fold_event(event, key, digest, -1 if offset is None else offset)
        if offset is not None:
            pending.offset = offset
        self._dirty[pending.key] = pending.partition
        refused: list[JoinOutput] = []
        if folded is not True:
            if isinstance(folded, Conflict):
                self.counters.conflicting_duplicates += 1
                refused.append(_conflict_refusal(event, folded, offset))
            pending.duplicates += 1
            self.counters.duplicates += 1
            if not isinstance(folded, Conflict) or not folded.stored_lost:
                return refused
        if end > clock.watermark:
            self._raise(part, clock, end, now_wall_ms)
        if pending.emitted:
            pending.late += 1
            self.counters.late_events += 1
            if pending.late > self.config.max_late_reemissions:
                self.counters.caps["late_reemissions"] += 1  # re-emitted once more, when forgotten
                return refused
            self.counters.re_emitted += 1
            return [*refused, build_record(pending, self.config, self.window_ms)]
        self._schedule(clock, pending)
        if (pending.start if pending.start is not None else pending.min_ts) != started_at:
            self._push_age(pending)
        return refused

    def _surely_under_caps(self, pending: PendingRequest) -> bool:
        """The hot path's shortcut: no custom stage names and few enough event records that neither
        per-request bound can trip with one more event."""
        return not pending.customs and len(pending.events) < self._fast_events_bytes

    def _over_cap(self, pending: PendingRequest, event: StageEvent) -> Refusal | None:
        """A ``too_many_events`` refusal when folding ``event`` would pass a per-request bound."""
        cfg = self.config
        if pending.event_count >= cfg.max_events_per_request:
            cap, detail = "events_per_request", f"request already holds {cfg.max_events_per_request} events"
        elif pending.state_bytes() + 60 + len(event.stage) > cfg.max_request_state_bytes:
            cap, detail = "request_state_bytes", f"request state would pass {cfg.max_request_state_bytes} bytes"
        else:
            return None
        self.counters.caps[cap] += 1
        return Refusal("too_many_events", event, f"{detail} (request {event.request_id!r})")

    def _add_new(
        self,
        event: StageEvent,
        part: _Partition,
        clock: _TenantClock,
        partition: int,
        offset: int | None,
        now_wall_ms: float,
        budget: str,
    ) -> list[JoinOutput]:
        fields = event.__dict__  # the model's values in one read (see join_state.content_digest)
        request_id: str = fields["request_id"]
        end: float = fields["ts_ms"] + (fields["duration_ms"] or 0.0)
        wm = self._effective(part, clock)
        if wm > 0.0 and (
            end < wm - self._forget_after_ms
            or (end < wm - self._grace_ms and wm < self._forget_mark(part, clock, budget, fields["tenant_id"]))
        ):
            # A late event of a request already forgotten (past forget_after_ms, or maybe early, by a cap, while
            # the watermark has not passed the forget deadlines of those): the writer merges this into the stored
            # record. Joined as a new request, its record would lose to the stored row, or replace it.
            lone = PendingRequest(request_id, fields["tenant_id"], partition, wm)
            lone.fold(event, event_id_key(fields["event_id"]), fields_digest(fields), _offset(offset))
            lone.late = 1
            self.counters.late_events += 1
            self.counters.amendments += 1
            record = build_record(lone, self.config, self.window_ms)
            record["amend"] = True
            return [record]
        pending = PendingRequest(request_id, fields["tenant_id"], partition, wm)
        pending.budget = budget
        pending.fold(event, event_id_key(fields["event_id"]), fields_digest(fields), _offset(offset))
        pending.offset = offset
        self._requests[pending.key] = pending
        self._count_open(budget, +1)
        self._dirty[pending.key] = partition
        if end > clock.watermark:
            self._raise(part, clock, end, now_wall_ms)
        self._schedule(clock, pending)
        self._push_age(pending)
        return self._enforce_open_caps(budget)

    def _forget_mark(self, part: _Partition, clock: _TenantClock, budget: str, tenant: str) -> float:
        """The early-forget mark a late event of ``tenant`` is checked against: its clock's; for a tenant promoted
        out of the pool also the pool's, which its requests forgotten early while in the pool set."""
        mark = clock.forgot_until
        steady = self._steady
        if budget != POOL and steady is not None and tenant in steady.promoted:
            pool = part.tenants.get(POOL)
            if pool is not None and pool.forgot_until > mark:
                mark = pool.forgot_until
        return mark

    # --- time -----------------------------------------------------------------------------------

    def advance(self, partition: int, now_wall_ms: float, caught_up: bool = True) -> list[dict[str, Any]]:
        """Emit (and forget) what each tenant's watermark on a partition has passed; then forget the emitted
        requests past ``max_remembered_requests``, soonest-forgotten first.

        ``caught_up``: nothing is left to read on the partition, so the idle tick applies: the watermark of a
        tenant that sent nothing for ``idle_tick_ms`` of wall time moves on by the wall time since its last
        event. The adapter passes False while a backlog remains, so a replay never depends on its speed."""
        part = self._partitions.get(partition)
        if part is None:
            return []
        tick = self.config.idle_tick_ms
        if not caught_up:
            self.hold_idle(partition)
        else:
            for clock in part.tenants.values():
                if clock.last_wall is None:
                    clock.last_wall = now_wall_ms  # restored, or caught up again: start the idle clock now
                    clock.idle_base = clock.watermark
                elif now_wall_ms - clock.last_wall >= tick:
                    clock.watermark = max(clock.watermark, clock.idle_base + (now_wall_ms - clock.last_wall))
                    part.lead = max(part.lead, clock.watermark)
        out = self._release(partition, part) + self._forget_excess()
        self._drop_ages_when_below_caps()
        return out

    def hold_idle(self, partition: int) -> None:
        """The partition is not known to be caught up (a backlog, or no answer from the broker): its tenants'
        idle clocks start again once it is, so time the join could not read it never counts as silence."""
        part = self._partitions.get(partition)
        if part is not None:
            for clock in part.tenants.values():
                clock.last_wall = None

    def _drop_ages_when_below_caps(self) -> None:
        if not self._ages_on or 2 * self._open > self._max_open:
            return
        # Over budgets, not tenants: with the pool on, the registered tenants and the pool.
        if all(2 * n <= self._budget_cap(budget) for budget, n in self._open_by.items()):
            self._ages_on = False
            self._ages = {}

    def _budget_cap(self, budget: str) -> int:
        return self._max_open_pool if budget == POOL else self._max_open_per_tenant

    def _forget_excess(self) -> list[dict[str, Any]]:
        """Forget emitted requests early, soonest-forgotten first: the pool's past ``max_remembered_pool``, then
        any past ``max_remembered_requests``, the pool's before a registered tenant's. Their late events then
        become amendments (:meth:`_add_new`); one with late events not yet re-emitted is re-emitted now."""
        out: list[dict[str, Any]] = []
        while self._remembered_pool > self._max_remembered_pool:
            if not self._forget_soonest(self._forget_pool, True, out, "remembered_requests_pool"):
                break
        cap = self.config.max_remembered_requests
        while len(self._requests) - self._open > cap:
            if self._remembered_pool > 0 and self._forget_soonest(self._forget_pool, True, out, "remembered_requests"):
                continue
            if not self._forget_soonest(self._forget_order, False, out, "remembered_requests"):
                break
        remembered = len(self._requests) - self._open
        if len(self._forget_order) + len(self._forget_pool) > 2 * remembered + 1024:
            emitted = [p for p in self._requests.values() if p.emitted]
            self._forget_order = [(p.deadline, p.key) for p in emitted if p.budget != POOL]
            self._forget_pool = [(p.deadline, p.key) for p in emitted if p.budget == POOL]
            heapq.heapify(self._forget_order)
            heapq.heapify(self._forget_pool)
        return out

    def _forget_soonest(self, heap: list[tuple[float, str]], pool: bool, out: list[dict[str, Any]], cap: str) -> bool:
        """Forget the live entry of ``heap`` (the pool's when ``pool``) due soonest; False when it has none."""
        while heap:
            forget_at, key = heapq.heappop(heap)
            pending = self._requests.get(key)
            if (
                pending is None
                or not pending.emitted
                or pending.deadline != forget_at
                or (pending.budget == POOL) != pool
            ):
                continue  # stale (lazy deletion), or a request since promoted out of the pool
            if pending.late > self.config.max_late_reemissions:
                out.append(build_record(pending, self.config, self.window_ms))
            self._drop_emitted(key, pending)
            self.counters.caps[cap] += 1
            part = self._partitions.get(pending.partition)
            clock = None if part is None else part.tenants.get(pending.budget)
            if clock is not None and forget_at > clock.forgot_until:
                clock.forgot_until = forget_at
                self._forgot_dirty.add((pending.partition, pending.budget))
            return True
        return False

    def _drop_emitted(self, key: str, pending: PendingRequest) -> None:
        """Forget an emitted request (its changelog entry is deleted with the next :meth:`dirty`)."""
        del self._requests[key]
        if pending.budget == POOL:
            self._remembered_pool -= 1
        self._dirty[key] = pending.partition

    def advance_all(self, now_wall_ms: float) -> list[dict[str, Any]]:
        """:meth:`advance` every owned partition, in partition order."""
        out: list[dict[str, Any]] = []
        for partition in sorted(self._partitions):
            out.extend(self.advance(partition, now_wall_ms))
        return out

    def _release(self, partition: int, part: _Partition) -> list[dict[str, Any]]:
        """Every tenant's due requests, tenants in name order; a tenant left without state is dropped."""
        out: list[dict[str, Any]] = []
        for tenant in sorted(part.tenants):
            clock = part.tenants[tenant]
            out.extend(self._release_tenant(partition, clock, self._effective(part, clock)))
            if not clock.deadlines:
                del part.tenants[tenant]
        return out

    def _release_tenant(self, partition: int, clock: _TenantClock, watermark: float) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        heap = clock.deadlines
        forget_after = self._forget_after_ms
        while heap and heap[0][0] <= watermark:
            deadline, key = heapq.heappop(heap)
            pending = self._requests.get(key)
            if pending is None or pending.deadline != deadline or pending.partition != partition:
                continue
            if pending.emitted:
                if pending.late > self.config.max_late_reemissions:
                    out.append(build_record(pending, self.config, self.window_ms))  # the late events not yet sent
                self._drop_emitted(key, pending)
                continue
            record = build_record(pending, self.config, self.window_ms)
            if self._natural_due(pending) > deadline:
                self.counters.caps["request_lifetime"] += 1
            self._mark_emitted(pending, record["status"], deadline + forget_after, clock)
            out.append(record)
        return out

    def _natural_due(self, pending: PendingRequest) -> float:
        """When the request's events say it is done: after first_token and its stragglers, else timed out. An
        ``llm_unmeasured`` call (its first chunk untold) ends the wait like a first_token: after its end."""
        if pending.first_token is not None:
            return max(pending.first_token, pending.max_end) + self.config.grace_ms
        if pending.customs is not None and LLM_UNMEASURED in pending.customs:
            return pending.max_end + self.config.grace_ms
        return pending.started_at + self.config.request_timeout_ms

    def _deadline(self, pending: PendingRequest) -> float:
        """The natural deadline, but never later than ``request_timeout_ms`` after the first event (so a
        request id reused forever, e.g. a constant ``"unknown"``, cannot slide its deadline), and never
        earlier than ``grace_ms`` after the watermark its first event found."""
        lifetime = pending.first_ts + self.config.request_timeout_ms
        return max(min(self._natural_due(pending), lifetime), pending.first_wm + self.config.grace_ms)

    def _schedule(self, clock: _TenantClock, pending: PendingRequest) -> None:
        # _deadline and _natural_due, inlined (once per event); the same values.
        first_token = pending.first_token
        if first_token is not None:
            natural = max(first_token, pending.max_end) + self._grace_ms
        elif pending.customs is not None and LLM_UNMEASURED in pending.customs:
            natural = pending.max_end + self._grace_ms
        else:
            natural = (pending.start if pending.start is not None else pending.min_ts) + self._request_timeout_ms
        deadline = max(min(natural, pending.first_ts + self._request_timeout_ms), pending.first_wm + self._grace_ms)
        if deadline != pending.deadline:
            pending.deadline = deadline
            heapq.heappush(clock.deadlines, (deadline, pending.key))

    def _raise(self, part: _Partition, clock: _TenantClock, end: float, now_wall_ms: float) -> None:
        """Move the tenant's watermark to ``end``, an event's end (callers call only when it is past the
        watermark), within two bounds, so that a skewed event cannot time out the tenant's own in-flight
        requests (other tenants have their own watermarks):

        * never past the worker's clock + ``max_watermark_lead_ms`` (live traffic has happened already; a
          producer clock running ahead only delays its own requests). A wall clock before 2000 is a test's
          relative clock, and this bound is off;
        * never more than ``max_watermark_step_ms`` in one event (a replay far behind the clock), except
          for the tenant's first event on the partition, which sets it.
        """
        if clock.watermark > 0.0 and end - clock.watermark > self._max_step_ms:
            self.counters.caps["watermark_step"] += 1
            end = clock.watermark + self._max_step_ms
        if now_wall_ms >= MIN_TS_MS and end > now_wall_ms + self._max_lead_ms:
            self.counters.caps["watermark_lead"] += 1
            end = max(clock.watermark, now_wall_ms + self._max_lead_ms)
        clock.watermark = end
        clock.idle_base = end
        part.lead = max(part.lead, end)

    def _mark_emitted(self, pending: PendingRequest, status: str, forget_at: float, clock: _TenantClock) -> None:
        pending.emitted = True
        pending.deadline = forget_at
        heapq.heappush(clock.deadlines, (forget_at, pending.key))
        if pending.budget == POOL:
            heapq.heappush(self._forget_pool, (forget_at, pending.key))
            self._remembered_pool += 1
        else:
            heapq.heappush(self._forget_order, (forget_at, pending.key))
        self._count_open(pending.budget, -1)
        self.counters.emitted[status] += 1
        self._dirty[pending.key] = pending.partition

    # --- eviction -------------------------------------------------------------------------------

    def _count_open(self, budget: str, delta: int) -> None:
        self._open += delta
        n = self._open_by.get(budget, 0) + delta
        if n > 0:
            self._open_by[budget] = n
        else:
            self._open_by.pop(budget, None)
            self._ages.pop(budget, None)

    def _enforce_open_caps(self, budget: str) -> list[JoinOutput]:
        """Evict for the caps: the budget's own oldest past its cap (a tenant's, or the pool's); past the
        global cap, the pool's oldest while the pool holds any, else the oldest request of the tenant
        holding the most (so one tenant's flood evicts its own requests, and the pool never a registered
        tenant's). With the pool on, ``_open_by`` holds the registered tenants and the pool only."""
        outputs: list[JoinOutput] = []
        if budget == POOL:
            while self._open_by.get(POOL, 0) > self._max_open_pool:
                self.counters.caps["open_requests_pool"] += 1
                outputs.append(self._evict_oldest(POOL))
        else:
            while self._open_by.get(budget, 0) > self._max_open_per_tenant:
                self.counters.caps["open_requests_per_tenant"] += 1
                outputs.append(self._evict_oldest(budget))
        while self._open > self._max_open:
            victim = POOL if POOL in self._open_by else max(self._open_by, key=self._open_by.__getitem__)
            outputs.append(self._evict_oldest(victim))
        return outputs

    def _push_age(self, pending: PendingRequest) -> None:
        if not self._ages_on:
            return  # built from the open requests when an eviction first needs them
        budget = pending.budget
        heap = self._ages.setdefault(budget, [])
        heapq.heappush(heap, (pending.started_at, pending.key))
        if len(heap) > 2 * self._open_by.get(budget, 0) + 64:
            self._rebuild_ages(budget)

    def _rebuild_ages(self, budget: str | None = None) -> None:
        """Drop stale entries: of one budget's heap, or (None) rebuild every heap."""
        if budget is None:
            self._ages = {}
        else:
            self._ages[budget] = []
        for p in self._requests.values():
            if not p.emitted and (budget is None or p.budget == budget):
                self._ages.setdefault(p.budget, []).append((p.started_at, p.key))
        for heap in self._ages.values():
            heapq.heapify(heap)

    def _evict_oldest(self, budget: str) -> dict[str, Any]:
        if not self._ages_on:
            self._ages_on = True
            self._rebuild_ages()
        heap = self._ages[budget]
        while True:
            started_at, key = heapq.heappop(heap)
            pending = self._requests.get(key)
            if (
                pending is not None
                and not pending.emitted
                and pending.started_at == started_at
                and pending.budget == budget  # else moved to a promoted tenant's budget
            ):
                break
        status: RequestStatus = "orphan" if pending.start is None else "timed_out"
        record = build_record(pending, self.config, self.window_ms, status_override=status)
        part = self._partitions[pending.partition]
        clock = part.clock(pending.budget)
        self._mark_emitted(pending, status, self._effective(part, clock) + self.config.forget_after_ms, clock)
        self.counters.evictions += 1
        return record

    # --- ownership and recovery ----------------------------------------------------------------

    def restore(self, key: str, packed: bytes, partition: int | None = None) -> int:
        """Load one request from its changelog entry; returns its partition (``partition`` overrides).

        ``key`` is its :func:`state_key`, or (a changelog written before requests were keyed by tenant)
        its bare request id: such a request is marked dirty, so the next :meth:`dirty` writes it under its
        state key, and the old key is listed in :attr:`legacy_keys` for the adapter to delete after that.
        Raises ValueError on a corrupt value. Restoring otherwise marks nothing dirty.

        A :data:`PROMOTIONS_PREFIX` key holds promoted tenants: they are merged into the join's (so a tenant
        promoted before a restart stays so), and the requests of those new here that were restored into the
        pool move to their own clocks (:meth:`_adopt_promoted`); the merged set is written back on the next
        :meth:`dirty`.
        """
        if key.startswith(PROMOTIONS_PREFIX):
            self._restore_promotions(packed)
            return int(key[len(PROMOTIONS_PREFIX) :]) if partition is None else partition
        if key.startswith(FORGOT_PREFIX):
            return self._restore_forgot(key, packed, partition)
        pending = PendingRequest.from_bytes(key, packed)
        if not self.budgets.is_registered(pending.tenant):
            pending.budget = POOL
        prefix = pending.tenant + "\x00"
        legacy = not key.startswith(prefix)
        pending.key = state_key(pending.tenant, key) if legacy else key
        if partition is not None:
            pending.partition = partition
        previous = self._requests.get(pending.key)
        if previous is not None and not previous.emitted:
            self._count_open(previous.budget, -1)
        elif previous is not None and previous.budget == POOL:
            self._remembered_pool -= 1
        self._requests[pending.key] = pending
        if legacy:
            self.legacy_keys.append((key, pending.partition))
            self._dirty[pending.key] = pending.partition
        part = self._partition(pending.partition)
        clock = part.clock(pending.budget)
        floor = pending.max_end
        if pending.emitted:
            floor = max(floor, pending.deadline - self.config.forget_after_ms)
        if floor > clock.watermark:
            clock.watermark = clock.idle_base = floor
            part.lead = max(part.lead, floor)
        heapq.heappush(clock.deadlines, (pending.deadline, pending.key))
        if not pending.emitted:
            self._count_open(pending.budget, +1)
            self._push_age(pending)
        elif pending.budget == POOL:
            heapq.heappush(self._forget_pool, (pending.deadline, pending.key))
            self._remembered_pool += 1
        else:
            heapq.heappush(self._forget_order, (pending.deadline, pending.key))
        return pending.partition

    def _restore_forgot(self, key: str, packed: bytes, partition: int | None) -> int:
        """An early-forget mark: the clock's mark and watermark floor again, and a heap entry at the mark (a
        stale one: no request has the empty key) that keeps the clock until its watermark passes the mark."""
        try:
            written, _, budget = key[len(FORGOT_PREFIX) :].partition("\x00")
            data = orjson.loads(packed)
            until, watermark = float(data["until"]), float(data["watermark"])
            where = int(written) if partition is None else partition
        except (KeyError, TypeError, AttributeError) as exc:  # int()/float()/orjson errors are ValueErrors
            raise ValueError(f"corrupt early-forget mark: {exc!r}") from exc
        if budget != POOL and not self.budgets.is_registered(budget):
            budget = POOL
        part = self._partition(where)
        clock = part.clock(budget)
        if watermark > clock.watermark:
            clock.watermark = clock.idle_base = watermark
            part.lead = max(part.lead, watermark)
        if until > clock.forgot_until:
            clock.forgot_until = until
            heapq.heappush(clock.deadlines, (until, ""))
        previous = self._forgot_written.get((where, budget))
        if previous is not None and previous != key:
            # Two marks for one clock (a tenant no longer registered, restored into the pool): the merged mark is
            # written under this key, the other key deleted with the legacy keys.
            self.legacy_keys.append((previous, where))
            self._forgot_dirty.add((where, budget))
        self._forgot_written[(where, budget)] = key
        return where

    def _restore_promotions(self, packed: bytes) -> None:
        try:
            data = orjson.loads(packed)
            promoted = {str(tenant): int(window) for tenant, window in data["promoted"].items()}
        except (KeyError, TypeError, AttributeError) as exc:  # orjson's decode error is a ValueError
            raise ValueError(f"corrupt promoted tenants: {exc!r}") from exc
        self.budgets.restore_promoted(promoted)
        steady = self._steady
        if steady is not None and steady.fresh:
            self._adopt_promoted(steady.take_fresh())

    def revoke(self, partitions: Iterable[int]) -> None:
        """Drop the state of partitions this worker no longer owns (their pending dirty writes too)."""
        gone = set(partitions)
        for key, pending in list(self._requests.items()):
            if pending.partition in gone:
                del self._requests[key]
                if not pending.emitted:
                    self._count_open(pending.budget, -1)
                elif pending.budget == POOL:
                    self._remembered_pool -= 1
        self._dirty = {r: p for r, p in self._dirty.items() if p not in gone}
        for partition in gone:
            self._partitions.pop(partition, None)
        self._promotions_at -= gone
        self._forgot_dirty = {m for m in self._forgot_dirty if m[0] not in gone}
        self._forgot_written = {m: k for m, k in self._forgot_written.items() if m[0] not in gone}
        if self._ages_on:
            self._rebuild_ages()

    def reset(self) -> None:
        """Forget all state (before a full restore); the counters keep running."""
        self._requests.clear()
        self._partitions.clear()
        self._ages = {}
        self._ages_on = False
        self._forget_order = []
        self._forget_pool = []
        self._remembered_pool = 0
        self._open = 0
        self._open_by = {}
        self._dirty = {}
        self._promotions_at = set()
        self._forgot_dirty = set()
        self._forgot_written = {}
        self.legacy_keys = []

    def _partition(self, partition: int) -> _Partition:
        part = self._partitions.get(partition)
        if part is None:
            part = self._partitions[partition] = _Partition()
        return part


def _offset(offset: int | None) -> int:
    return -1 if offset is None else offset
