"""The state of one request while its stage events are joined (:class:`PendingRequest`).

It is what the join keeps in memory for every open request and what goes to the changelog of the
``join-state`` table, so both forms are compact: the accepted events live in one ``bytes`` blob of fixed
38-byte records ``(stage code, ts_ms, duration_ms, event-id hash, content digest, source offset)``,
strings (tenant, version, route, stage names) are interned, the request id is the tail of the state key (not
kept twice), well-known attrs are kept sparse, and the serialised form is one orjson array.

Dedup follows :meth:`schemas.events.StageEvent.dedup_key`: same stage and same ``event_id``, or, without an
``event_id``, same stage, ``ts_ms`` and ``duration_ms``. The ``event_id`` is kept as a stable 64-bit hash
(blake2b), not as the string: it saves ~70 bytes per event, and a collision inside one request is
~1e-19 per pair of events.

Conflicting duplicates (same dedup key, different content: :func:`content_digest`) resolve the same
whatever the arrival order: the copy with the smaller ``(ts_ms, duration_ms, digest)`` is the event,
and the other is reported as a :class:`Conflict` for the join to dead-letter. The request's
``fallback_level`` is the highest level of every copy received, the losing copy's included (a maximum
does not depend on the order).

Everything that picks "one of several events" (identity fields, well-known attrs, float summation order)
ranks events by ``(ts_ms, key, stage, duration_ms)``, so the arrival order never changes a record.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
import struct
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import orjson

from schemas.events import KNOWN_ATTRS, StageAttrs, StageEvent
from schemas.records import ATTR_COLUMNS
from schemas.vocabulary import KNOWN_STAGES

#: Layout of one accepted event in :attr:`PendingRequest.events`: stage code, ts_ms, duration_ms,
#: event-id hash (0: none), content digest (0: unknown) and source offset (-1: unknown).
EVENT_RECORD: Final = struct.Struct("<Hddqiq")
#: The dedup identity is the first ``_IDENT_END`` bytes; the event-id hash starts at ``_KEY_AT``.
_KEY_AT: Final = 18
_IDENT_END: Final = 26
_DIGEST: Final = struct.Struct("<iq")
_pack: Final = EVENT_RECORD.pack
_RECORD_SIZE: Final = EVENT_RECORD.size
#: Format 1 records (before digests and offsets), read when restoring an older changelog.
_EVENT_RECORD_V1: Final = struct.Struct("<Hddq")
#: What :meth:`PendingRequest.state_bytes` allows for everything but the events and custom stage names
#: (ids, version, route, attrs with a 128-character trace id, numbers), JSON escapes included.
STATE_FIXED_BYTES: Final = 2_048
#: Serialised-form version: bump it when the array layout of :meth:`PendingRequest.to_bytes` changes.
STATE_FORMAT: Final = 2

STAGE_CODES: Final[dict[str, int]] = {name: code for code, name in enumerate(KNOWN_STAGES)}
REQUEST_START: Final = STAGE_CODES["request_start"]
FIRST_TOKEN: Final = STAGE_CODES["first_token"]
_START_CODE: Final = REQUEST_START.to_bytes(2, "little")
#: Codes from here on index the request's own tuple of custom stage names.
FIRST_CUSTOM_CODE: Final = len(KNOWN_STAGES)
MAX_CODE: Final = 0xFFFF

#: Stages that own a well-known attr, best first; any other stage ranks after them (docs/design.md, attrs).
_ATTR_OWNERS: Final[dict[str, tuple[str, ...]]] = {
    "prompt_tokens": ("prompt_assemble", "llm_ttft"),
    "cached_tokens": ("prompt_assemble", "llm_ttft"),
    "prompt_cache_hit": ("prompt_assemble", "llm_ttft"),
    "draft_accept_rate": ("llm_ttft",),
    "rerank_top_k": ("rerank", "retrieval"),
    "retrieval_cache_hit": ("retrieval",),
    "trace_id": (),
}
_N_ATTRS: Final = len(ATTR_COLUMNS)
_ATTR_INDEX: Final[dict[str, int]] = {name: i for i, name in enumerate(ATTR_COLUMNS)}
#: Every well-known attr of the input contract, unset (the start of an event's content digest), in key order.
_NO_ATTRS: Final[dict[str, Any]] = dict.fromkeys(sorted(KNOWN_ATTRS))
_N_KNOWN_ATTRS: Final = len(_NO_ATTRS)
#: The custom attrs of an event that has none (never modified).
_NO_EXTRA: Final[dict[str, Any]] = {}
#: :attr:`PendingRequest.attrs` is sparse: ``(tag, value, tag, value, ...)`` in attr-index order, one pair per
#: attr ever set, where ``tag = source event index * 8 + attr index`` (``>> 3`` and ``& 7`` take it apart,
#: also for a source of -1). The changelog keeps the dense form: the ``ATTR_COLUMNS`` values, then sources.
_TAG_BITS: Final = 3
_TAG_MASK: Final = (1 << _TAG_BITS) - 1
assert _N_ATTRS <= 1 << _TAG_BITS
#: The dense form of attrs never set: no value, no source.
_DENSE_UNSET: Final[tuple[Any, ...]] = (None,) * _N_ATTRS + (-1,) * _N_ATTRS
#: base64.b64encode without its Python wrapper (the same bytes).
_b64encode: Final = binascii.b2a_base64


def exact_bytes(obj: Any) -> bytes:
    """``orjson.dumps(obj)`` in a bytes object of its own size, for outputs held until a batch is produced.

    orjson writes into a buffer of several KiB and shrinks it in place, and the allocator keeps the whole
    block: 20,000 records held at once took 8 KiB of RSS and 5.8 us each, copied 0.4 KiB and 1.5 us."""
    return memoryview(orjson.dumps(obj)).tobytes()


EventRank = tuple[float, int, str, float]


def content_digest(event: StageEvent) -> int:
    """A stable 32-bit digest of what an event says beyond its dedup identity (never 0).

    Two copies with the same dedup key and different digests are conflicting duplicates.
    """
    # The model's values in one read: every attribute read of a pydantic model goes through its __getattr__
    # hook, which costs several dict lookups.
    return fields_digest(event.__dict__)


def fields_digest(
    fields: dict[str, Any], _dumps: Any = orjson.dumps, _crc32: Any = zlib.crc32, _sort: int = orjson.OPT_SORT_KEYS
) -> int:
    """:func:`content_digest` of the event whose field values (its ``__dict__``) are ``fields``."""
    attrs = fields["attrs"]
    # Every well-known attr (None when unset: unset and null say the same thing) and the custom ones, as two
    # objects: the layout the digest had when attrs was a nested model, so changelog states keep matching.
    known: dict[str, Any] | None = None
    extra: dict[str, Any] | None = None
    option = 0  # without a custom attr both objects are in key order already: nothing to sort
    if attrs is not None:
        known = {**_NO_ATTRS, **attrs}
        if len(known) == _N_KNOWN_ATTRS:
            extra = _NO_EXTRA
        else:
            known = dict(_NO_ATTRS)
            extra = {}
            for name, value in attrs.items():
                if name in known:
                    known[name] = value
                else:
                    extra[name] = value
            option = _sort
    payload = _dumps(
        [
            fields["ts_ms"],
            fields["duration_ms"],
            fields["version_id"],
            fields["rollout"],
            fields["route"],
            fields["fallback_level"],
            known,
            extra,
        ],
        option=option,
    )
    digest = _crc32(payload)
    return (digest - (1 << 32) if digest >= 1 << 31 else digest) or 1


@dataclass(frozen=True, slots=True)
class Conflict:
    """Two copies of one event (same dedup key) that say different things.

    The copy with the smaller ``(ts_ms, duration_ms, digest)`` wins whatever the arrival order; the
    other is dead-lettered ``conflicting_duplicate``. ``stored_lost``: the copy folded earlier lost and
    was replaced (``loser_offset`` is its source offset, -1 when unknown); else the new copy lost.
    """

    stored_lost: bool
    loser_offset: int
    loser_ts: float
    loser_duration: float


def state_key(tenant_id: str, request_id: str) -> str:
    """The join's key of a request: its tenant, a NUL, its request id (docs/design.md: a request is identified
    by ``(tenant_id, request_id)``; two tenants' requests never share state). Also the changelog key."""
    return f"{tenant_id}\x00{request_id}"


#: blake2b with an 8-byte digest, unfed: copying it is cheaper than building one with keyword arguments.
_EVENT_ID_HASH: Final = hashlib.blake2b(digest_size=8)
_INT64: Final = struct.Struct("<q")


def event_key(event: StageEvent) -> int:
    """The compact dedup key of an event: a stable hash of its ``event_id``, 0 when it has none."""
    return event_id_key(event.event_id)


def event_id_key(eid: str | None, _unpack: Any = _INT64.unpack) -> int:
    """:func:`event_key` of an event whose ``event_id`` is ``eid``.

    The hash is blake2b with an 8-byte digest of the id in UTF-8, read as a little-endian signed integer
    (a hash of 0 counts as 1): the changelog states keep these, so the definition never changes."""
    if eid is None:
        return 0
    h = _EVENT_ID_HASH.copy()
    h.update(eid.encode())
    key: int = _unpack(h.digest())[0]
    return key or 1


_ATTR_RANKS: Final[dict[str, tuple[dict[str, int], int]]] = {
    name: ({stage: rank for rank, stage in enumerate(owners)}, len(owners)) for name, owners in _ATTR_OWNERS.items()
}


def attr_owner_rank(attr: str, stage: str) -> int:
    """0 for the best owning stage of a well-known attr, higher for worse sources."""
    ranks, other = _ATTR_RANKS[attr]
    return ranks.get(stage, other)


def _int(value: Any) -> int:
    if type(value) is not int:
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _float(value: Any) -> float:
    if type(value) not in (int, float):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


def _intern(value: str | None) -> str | None:
    return None if value is None else sys.intern(value)


class PendingRequest:
    """One request being joined: its accepted events, identity, attrs and bookkeeping.

    ``request_id`` is the tail of ``key`` (not stored twice); ``attrs`` is sparse (see ``_TAG_BITS``).

    ``deadline`` is the watermark at which the join acts next: the emission deadline while open, the
    forget deadline once ``emitted``. ``offset`` is the highest source offset folded (replay detection).
    ``start``, ``first_token``, ``min_ts`` and ``max_end`` are derived from ``events`` (not serialised).
    """

    __slots__ = (
        "attrs",
        "budget",
        "customs",
        "deadline",
        "duplicates",
        "emitted",
        "events",
        "fallback",
        "first_token",
        "first_ts",
        "first_wm",
        "ident",
        "key",
        "late",
        "max_end",
        "min_ts",
        "offset",
        "partition",
        "rollout",
        "route",
        "start",
        "tenant",
        "version",
    )

    def __init__(self, request_id: str, tenant: str, partition: int, first_wm: float) -> None:
        self.tenant: str = sys.intern(tenant)
        #: The join's budget the request is held under: its tenant, or the pool (streams.core.tenancy); not
        #: serialised (a restore decides it again).
        self.budget: str = self.tenant
        #: :func:`state_key` of the request (the join's dict key and the changelog key).
        self.key = state_key(self.tenant, request_id)
        self.partition = partition
        self.first_wm = first_wm
        self.version: str = "unknown"
        self.rollout: str | None = None
        self.route: str | None = None
        self.ident = -1
        self.fallback = 0
        # Well-known attrs, sparse: (tag, value) pairs in attr-index order (see _TAG_BITS); None: never set.
        self.attrs: tuple[Any, ...] | None = None
        self.duplicates = 0
        self.late = 0
        self.emitted = False
        self.deadline = 0.0
        self.offset: int | None = None
        self.customs: tuple[str, ...] | None = None
        self.events = b""
        self.start: float | None = None
        self.first_token: float | None = None
        self.min_ts = math.inf
        self.max_end = -math.inf
        #: ``ts_ms`` of the first event folded (arrival order): the request's lifetime runs from here.
        self.first_ts = math.inf

    # --- reading ------------------------------------------------------------------------------

    @property
    def request_id(self) -> str:
        """The request id: ``key`` after the tenant and the NUL."""
        return self.key[len(self.tenant) + 1 :]

    @property
    def event_count(self) -> int:
        """Distinct accepted events."""
        return len(self.events) // EVENT_RECORD.size

    def _first_ts(self) -> float:
        return float(EVENT_RECORD.unpack_from(self.events, 0)[1]) if self.events else math.inf

    def state_bytes(self) -> int:
        """An upper estimate of the changelog value's size (:meth:`to_bytes`), without building it: the
        base64 of the event records, the custom stage names and a fixed allowance for the other fields."""
        customs = sum(len(c) + 3 for c in self.customs or ())
        return 4 * ((len(self.events) + 2) // 3) + customs + STATE_FIXED_BYTES

    @property
    def started_at(self) -> float:
        """``request_start``'s ts, else the earliest event's ts (orphans)."""
        return self.start if self.start is not None else self.min_ts

    def stage_name(self, code: int) -> str:
        """The stage name of a stage code of this request."""
        if code < FIRST_CUSTOM_CODE:
            return KNOWN_STAGES[code]
        assert self.customs is not None
        return self.customs[code - FIRST_CUSTOM_CODE]

    def iter_events(self) -> Iterator[tuple[str, float, float, int]]:
        """The accepted events as ``(stage, ts_ms, duration_ms, key)``, in arrival order."""
        for code, ts, dur, key, _, _ in EVENT_RECORD.iter_unpack(self.events):
            yield self.stage_name(code), ts, dur, key

    def _rank(self, index: int) -> tuple[str, EventRank]:
        code, ts, dur, key, _, _ = EVENT_RECORD.unpack_from(self.events, index * EVENT_RECORD.size)
        name = self.stage_name(code)
        return name, (ts, key, name, dur)

    # --- folding ------------------------------------------------------------------------------

    def _code(self, stage: str) -> int:
        code = STAGE_CODES.get(stage)
        if code is not None:
            return code
        customs = self.customs or ()
        if stage in customs:
            return FIRST_CUSTOM_CODE + customs.index(stage)
        code = FIRST_CUSTOM_CODE + len(customs)
        if code > MAX_CODE:
            raise ValueError(f"request {self.request_id!r} has too many distinct custom stages")
        self.customs = (*customs, sys.intern(stage))
        return code

    def fold(self, event: StageEvent, key: int, digest: int = 0, offset: int = -1) -> bool:
        """Fold an event in; False when it duplicates an accepted one (or lost a conflict to it).

        ``key`` is :func:`event_key` of the event. The tenant is checked by the caller.
        """
        return self.fold_event(event, key, digest, offset) is True

    def fold_event(self, event: StageEvent, key: int, digest: int = 0, offset: int = -1) -> bool | Conflict:
        """Fold an event in: True when added, False for a duplicate, a :class:`Conflict` when a copy with
        the same dedup key says something else (``digest``: :func:`content_digest`, 0 = unknown)."""
        fields = event.__dict__  # the model's values in one read (see content_digest)
        stage: str = fields["stage"]
        code = STAGE_CODES.get(stage)
        if code is None:
            code = self._code(stage)
        ts: float = fields["ts_ms"]  # validated: a float
        # + 0.0 turns -0.0 into 0.0: equal as floats (dedup_key), so they must be equal as bytes too.
        duration: float | None = fields["duration_ms"]
        dur = 0.0 if duration is None else duration + 0.0
        record = _pack(code, ts, dur, key, digest, offset)
        rank: EventRank = (ts, key, stage, dur)
        events = self.events
        if events:
            # _holds, inlined: a byte search for the dedup identity, then an alignment check.
            needle, skip = (record[_KEY_AT:_IDENT_END], _KEY_AT) if key != 0 else (record[:_IDENT_END], 0)
            at = events.find(needle)
            while at >= 0:
                start = at - skip
                if start % _RECORD_SIZE == 0 and events[start : start + 2] == record[:2]:
                    return self._resolve(start // _RECORD_SIZE, event, record, rank)
                at = events.find(needle, at + 1)
            index = len(events) // _RECORD_SIZE
        else:
            index = 0
            self.first_ts = ts
        self.events = events + record
        self._account(code, ts, dur)
        self._fold_identity(event, index, code == REQUEST_START, rank)
        fallback = fields["fallback_level"]
        if fallback is not None and fallback > self.fallback:
            self.fallback = fallback
        attrs = fields["attrs"]
        if attrs is not None:
            self._fold_attrs(attrs, stage, index, rank)
        return True

    def _fold_rest(self, event: StageEvent, index: int, rank: EventRank) -> None:
        if event.fallback_level is not None and event.fallback_level > self.fallback:
            self.fallback = event.fallback_level
        if event.attrs is not None:
            self._fold_attrs(event.attrs, event.stage, index, rank)

    def _holds(self, record: bytes, by_id: bool) -> int:
        """The index of an accepted event with the dedup key of ``record``, else -1. A byte search (C
        speed) plus an alignment check: with an event id, same stage code and key; without, the same
        stage code, ts, duration and (no) key."""
        events, size = self.events, EVENT_RECORD.size
        needle, skip = (record[_KEY_AT:_IDENT_END], _KEY_AT) if by_id else (record[:_IDENT_END], 0)
        at = events.find(needle)
        while at >= 0:
            start = at - skip
            if start % size == 0 and events[start : start + 2] == record[:2]:
                return start // size
            at = events.find(needle, at + 1)
        return -1

    def _resolve(self, index: int, event: StageEvent, record: bytes, rank: EventRank) -> bool | Conflict:
        """A second copy of event ``index``: a duplicate, or a conflict the smaller copy wins."""
        at = index * EVENT_RECORD.size
        stored = self.events[at : at + EVENT_RECORD.size]
        old_digest, old_offset = _DIGEST.unpack_from(stored, _IDENT_END)
        new_digest, new_offset = _DIGEST.unpack_from(record, _IDENT_END)
        if old_digest == new_digest or old_digest == 0 or new_digest == 0:
            return False
        _, old_ts, old_dur, _, _, _ = EVENT_RECORD.unpack(stored)
        if (old_ts, old_dur, old_digest) <= (rank[0], rank[3], new_digest):
            # The fallback level is the highest any copy said, the losing one included: a replaced copy's
            # level is kept too (see _replace), so either arrival order gives the same level.
            fallback = event.fallback_level
            if fallback is not None and fallback > self.fallback:
                self.fallback = fallback
            return Conflict(False, new_offset, rank[0], rank[3])
        self._replace(index, event, record, rank)
        return Conflict(True, old_offset, old_ts, old_dur)

    def _replace(self, index: int, event: StageEvent, record: bytes, rank: EventRank) -> None:
        """Put the winning copy in place of event ``index`` (its identity and attrs now come from it).

        Kept: a higher ``fallback_level`` of the losing copy (the level is the highest of every copy, winner
        or loser, whatever the arrival order: :meth:`_resolve`). Not undone: an attr only the losing copy
        carried when another event carries it too (that one is not kept, so the attr is dropped).
        """
        at = index * EVENT_RECORD.size
        self.events = self.events[:at] + record + self.events[at + EVENT_RECORD.size :]
        self.first_ts = self._first_ts()
        self.start = self.first_token = None
        self.min_ts, self.max_end = math.inf, -math.inf
        for code, ts, dur, _, _, _ in EVENT_RECORD.iter_unpack(self.events):
            self._account(code, ts, dur)
        if self.ident == index:
            self._set_identity(event, index)
        else:
            self._fold_identity(event, index, record[:2] == _START_CODE, rank)
        if self.attrs is not None:  # the attrs of the replaced copy go (an attr without a source is left out)
            sparse = self.attrs
            self.attrs = tuple(
                x for j in range(0, len(sparse), 2) if sparse[j] >> _TAG_BITS != index for x in sparse[j : j + 2]
            )
        self._fold_rest(event, index, rank)

    def _account(self, code: int, ts: float, dur: float) -> None:
        if code == REQUEST_START:
            if self.start is None or ts < self.start:
                self.start = ts
        elif code == FIRST_TOKEN and (self.first_token is None or ts < self.first_token):
            self.first_token = ts
        if ts < self.min_ts:
            self.min_ts = ts
        end = ts + dur if dur else ts  # the same value; an instant shares its ts object (memory)
        if end > self.max_end:
            self.max_end = end

    def _fold_identity(self, event: StageEvent, index: int, is_start: bool, rank: EventRank) -> None:
        if self.ident >= 0:
            at = self.ident * EVENT_RECORD.size
            holds_start = self.events[at : at + 2] == _START_CODE
            if holds_start and not is_start:
                return  # the common case, decided without unpacking
            if holds_start == is_start and self._rank(self.ident)[1] <= rank:
                return
        self._set_identity(event, index)

    def _set_identity(self, event: StageEvent, index: int) -> None:
        self.ident = index
        self.version = sys.intern(event.version_id)
        self.rollout = event.rollout
        self.route = _intern(event.route)

    def _fold_attrs(self, attrs: StageAttrs, stage: str, index: int, rank: EventRank) -> None:
        """Take the well-known ``attrs`` of event ``index`` (of ``stage``, ranked ``rank``) where no better-ranked
        event set them already."""
        pairs = list(self.attrs or ())  # (tag, value) pairs in attr-index order
        changed = False
        ranked = -1  # the source event whose rank ``old_stage`` and ``old`` hold (a few attrs share one)
        old_stage, old = "", rank
        for name, value in attrs.items():  # the few attrs the event carries (each is independent)
            i = _ATTR_INDEX.get(name)
            if i is None or value is None:
                continue
            n = len(pairs)
            j = 0
            tag = 0
            while j < n:  # i's place
                tag = pairs[j]
                if tag & _TAG_MASK >= i:
                    break
                j += 2
            if j < n and tag & _TAG_MASK == i:
                source = tag >> _TAG_BITS
                if source >= 0:
                    # The event with the better (owner rank, event rank) keeps the attr; on a tie, the holder.
                    if source != ranked:
                        ranked = source
                        old_stage, old = self._rank(source)
                    ranks, other = _ATTR_RANKS[name]
                    held_by, offered_by = ranks.get(old_stage, other), ranks.get(stage, other)
                    if held_by < offered_by or (held_by == offered_by and old <= rank):
                        continue
                pairs[j] = (index << _TAG_BITS) | i
                pairs[j + 1] = value
            else:
                pairs.insert(j, value)
                pairs.insert(j, (index << _TAG_BITS) | i)
            changed = True
        if changed:
            self.attrs = tuple(pairs)

    def put_attrs(self, record: dict[str, Any]) -> None:
        """Set the well-known attr columns this request has in ``record`` (the others stay as they are)."""
        sparse = self.attrs
        if sparse is not None:
            for j in range(0, len(sparse), 2):
                tag: int = sparse[j]
                record[ATTR_COLUMNS[tag & _TAG_MASK]] = sparse[j + 1]

    def attr_values(self) -> tuple[Any, ...]:
        """The well-known attr values in ``ATTR_COLUMNS`` order (None when never seen)."""
        values: list[Any] = [None] * _N_ATTRS
        sparse = self.attrs or ()
        for j in range(0, len(sparse), 2):
            tag: int = sparse[j]
            values[tag & _TAG_MASK] = sparse[j + 1]
        return tuple(values)

    def _dense_attrs(self) -> list[Any] | None:
        """The changelog form of ``attrs``: the ``ATTR_COLUMNS`` values, then each one's source (-1: none)."""
        if self.attrs is None:
            return None
        dense: list[Any] = list(_DENSE_UNSET)
        sparse = self.attrs
        for j in range(0, len(sparse), 2):
            tag: int = sparse[j]
            i = tag & _TAG_MASK
            dense[i] = sparse[j + 1]
            dense[_N_ATTRS + i] = tag >> _TAG_BITS
        return dense

    # --- serialising --------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """The changelog form: one orjson array. The request id is the table key and is not repeated;
        the event records travel as base64 of the in-memory blob (smaller and faster than numbers).

        Copied to a bytes object of its own size: orjson's output keeps the ~8 KiB block it was written in,
        and a checkpoint holds thousands of them at once (~5 us of page faults each, see ``exact_bytes``)."""
        return exact_bytes(
            [
                STATE_FORMAT,
                self.partition,
                self.tenant,
                self.version,
                self.rollout,
                self.route,
                self.ident,
                self.fallback,
                self.duplicates,
                self.late,
                self.first_wm,
                int(self.emitted),
                self.deadline,
                self.offset,
                self.customs,
                _b64encode(self.events, newline=False).decode("ascii"),
                self._dense_attrs(),
            ]
        )

    @classmethod
    def from_bytes(cls, request_id: str, data: bytes) -> PendingRequest:
        """Rebuild a request from :meth:`to_bytes`; raises ValueError on an unknown or corrupt form."""
        try:
            fields = orjson.loads(data)
            if not isinstance(fields, list) or not fields or fields[0] not in (1, STATE_FORMAT):
                raise ValueError("unknown format")
            (_, partition, tenant, version, rollout, route, ident, fallback, duplicates, late, first_wm) = fields[:11]
            (emitted, deadline, offset, customs, events, attrs) = fields[11:]
            pending = cls(request_id, tenant, _int(partition), _float(first_wm))
            pending.version = sys.intern(version)
            pending.rollout = rollout
            pending.route = _intern(route)
            pending.ident = _int(ident)
            pending.fallback = _int(fallback)
            pending.duplicates = _int(duplicates)
            pending.late = _int(late)
            pending.emitted = bool(_int(emitted))
            pending.deadline = _float(deadline)
            pending.offset = None if offset is None else _int(offset)
            pending.customs = tuple(sys.intern(c) for c in customs) if customs else None
            dense = list(attrs) if attrs else None
            pending.events = _upgrade_events(base64.b64decode(events, validate=True), fields[0])
            if len(pending.events) % EVENT_RECORD.size or (dense and len(dense) != 2 * _N_ATTRS):
                raise ValueError("bad event or attr records")
            count = pending.event_count
            sources = dense[_N_ATTRS:] if dense else ()
            if not -1 <= pending.ident < count or any(not -1 <= s < count for s in sources):
                raise ValueError("event index out of range")
            pending.attrs = None if dense is None else _sparse_attrs(dense)
            n_codes = FIRST_CUSTOM_CODE + len(pending.customs or ())
            for code, ts, dur, _, _, _ in EVENT_RECORD.iter_unpack(pending.events):
                if code >= n_codes:
                    raise ValueError(f"unknown stage code {code}")
                pending._account(code, ts, dur)
            pending.first_ts = pending._first_ts()
        except (orjson.JSONDecodeError, TypeError, ValueError, binascii.Error) as exc:
            raise ValueError(f"corrupt join state for request {request_id!r}: {exc}") from exc
        return pending


def _upgrade_events(blob: bytes, state_format: int) -> bytes:
    """Format 1 event records (no digest, no offset) as current ones: digest and offset unknown."""
    if state_format != 1:
        return blob
    if len(blob) % _EVENT_RECORD_V1.size:
        raise ValueError("bad event records")
    return b"".join(
        EVENT_RECORD.pack(code, ts, dur, key, 0, -1) for code, ts, dur, key in _EVENT_RECORD_V1.iter_unpack(blob)
    )


def _sparse_attrs(dense: list[Any]) -> tuple[Any, ...]:
    """:meth:`PendingRequest._dense_attrs` back to the sparse form (an attr neither set nor sourced is left out)."""
    out: list[Any] = []
    for i in range(_N_ATTRS):
        value, source = dense[i], _int(dense[_N_ATTRS + i])
        if value is not None or source != -1:
            out += ((source << _TAG_BITS) | i, value)
    return tuple(out)
