"""Request records from joined state (:func:`build_record`) and from a late amendment (:func:`merge_records`).

Records are plain dicts with exactly the fields of :class:`schemas.records.RequestRecord`. The rules are
docs/design.md's join semantics: status precedence orphan > no_first_chunk > timed_out > missing_stage > complete;
missing stage values are None, never 0; ``other_ms`` is signed; retries are summed with a repeat counter; the earliest
instant wins. ``missing_stages`` lists the absent required stages whatever the status, so a later
amendment can tell which gaps it fills, and ``event_keys`` the events a record counted, so a later amendment can
tell a retry of a stage (a new event: summed) from a replay (an event already counted: no value changes).

The reserved stage ``llm_unmeasured`` (an LLM call whose first chunk its telemetry does not tell) is no custom
stage: it fills ``llm_unmeasured_ms`` and, without a ``first_token``, makes the request ``no_first_chunk``.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from schemas.records import (
    ATTR_COLUMNS,
    STAGE_COLUMNS,
    STATUS_RANK,
    RecallMode,
    RequestRecord,
    RequestStatus,
    record_version,
)
from schemas.vocabulary import KNOWN_STAGES, LLM_UNMEASURED, PARENT_STAGES, REQUIRED_STAGES
from streams.core.join_state import EVENT_RECORD, PendingRequest
from streams.settings import JoinConfig

_SPAN_STAGES = frozenset(column.removesuffix("_ms") for column in STAGE_COLUMNS)
_KNOWN = frozenset(KNOWN_STAGES)
_STAGE_OF_COLUMN = tuple((column, column.removesuffix("_ms")) for column in STAGE_COLUMNS)
_RECALLS = ("vector_recall_ms", "bm25_recall_ms")
_INT64 = struct.Struct("<q")
_TIMING = struct.Struct("<dd")
_STAGE_SALTS: dict[str, int] = {}


#: An empty 8-byte BLAKE2b: a copy of it hashes like ``blake2b(data, digest_size=8)`` without parsing the
#: constructor's dozen keyword arguments each time (about a third of the cost of one short hash).
_BLAKE2B_8 = hashlib.blake2b(digest_size=8)


def _hash64(data: bytes) -> int:
    hasher = _BLAKE2B_8.copy()
    hasher.update(data)
    value: int = _INT64.unpack(hasher.digest())[0]
    return value


def _stage_salt(stage: str) -> int:
    salt = _STAGE_SALTS.get(stage)
    if salt is None:
        salt = _hash64(b"stage\x00" + stage.encode())
        if len(_STAGE_SALTS) < 4_096:  # known stages and the common custom ones; the rest are hashed each time
            _STAGE_SALTS[stage] = salt
    return salt


def event_identity(stage: str, key: int, ts: float, dur: float) -> int:
    """The signed 64-bit identity of one counted event in a record's ``event_keys``: its dedup identity
    (:meth:`schemas.events.StageEvent.dedup_key`) hashed with its stage name. ``key`` is the join's hash of
    its ``event_id`` (0 without one: then its ``ts_ms`` and ``duration_ms``, 0.0 for an instant, identify it).
    Stable across processes and versions: stored rows keep these."""
    if key == 0:
        key = _hash64(_TIMING.pack(ts, dur))
    return key ^ _stage_salt(stage)


def required_stages(config: JoinConfig, route: str | None) -> tuple[str, ...]:
    """The stages a request on ``route`` must have (the per-route override, else the default)."""
    if route is not None and route in config.route_required_stages:
        return config.route_required_stages[route]
    return config.required_stages


def _required_order(stage: str) -> tuple[int, int, str]:
    if stage in REQUIRED_STAGES:
        return (0, REQUIRED_STAGES.index(stage), stage)
    if stage in _KNOWN:
        return (1, KNOWN_STAGES.index(stage), stage)
    return (2, 0, stage)


#: The order of the absent-stage lists seen (a request that timed out early lacks the same few): copied out.
_MISSING_ORDER: dict[tuple[str, ...], list[str]] = {}


def sorted_missing(stages: Iterable[str]) -> list[str]:
    """Stage names in the order of settings REQUIRED_STAGES, then known stages, then by name."""
    given = tuple(stages)
    found = _MISSING_ORDER.get(given)
    if found is None:
        found = sorted(set(given), key=_required_order)
        if len(_MISSING_ORDER) < 1_024:  # the required stages' subsets, per route: a handful
            _MISSING_ORDER[given] = found
    return list(found)


#: Whether a required-stage tuple is in :func:`sorted_missing`'s order already (then so is any part of it).
_IN_ORDER: dict[tuple[str, ...], bool] = {}


def _in_order(stages: tuple[str, ...]) -> bool:
    found = _IN_ORDER.get(stages)
    if found is None:
        found = list(stages) == sorted_missing(stages)  # False for a tuple that repeats a stage, too
        if len(_IN_ORDER) < 1_024:
            _IN_ORDER[stages] = found
    return found


def window_start(started_at: float, window_ms: int) -> float:
    """``floor(started_at / W) * W``."""
    return float(math.floor(started_at / window_ms) * window_ms)


def recall_mode(vector: Sequence[tuple[float, float]], bm25: Sequence[tuple[float, float]]) -> RecallMode:
    """parallel when a vector and a bm25 recall span ``[ts, ts + dur)`` overlap, serial when both ran
    without overlapping, single when only one ran, none when neither did."""
    if vector and bm25:
        for vt, vd in vector:
            for bt, bd in bm25:
                if vt < bt + bd and bt < vt + vd:
                    return "parallel"
        return "serial"
    return "single" if vector or bm25 else "none"


def status_of(
    has_start: bool, has_first_token: bool, missing: Sequence[str], unmeasured: bool = False
) -> RequestStatus:
    """Status precedence: orphan, no_first_chunk (no first token, but an ``llm_unmeasured`` call: answered,
    its TTFT unknown), timed_out, missing_stage, complete (the first that matches)."""
    if not has_start:
        return "orphan"
    if not has_first_token:
        return "no_first_chunk" if unmeasured else "timed_out"
    return "missing_stage" if missing else "complete"


def other_ms(ttft: float | None, stages: Mapping[str, float | None]) -> float | None:
    """``ttft - (retrieval + prompt_assemble + llm_ttft)``, signed; None unless all four are known."""
    if ttft is None:
        return None
    total = 0.0
    for stage in PARENT_STAGES:
        value = stages.get(stage)
        if value is None:
            return None
        total += value
    return ttft - total


#: A record with RequestRecord's fields in its order, holding what a request without the field has where
#: build_record does not always set it (stage and attr columns None, recall mode "none", not an amendment):
#: build_record copies it and sets what the request has (a copy is one allocation, where adding the ~40 fields
#: one by one resized the dict four times; a one-event request's record cost ~34k instructions).
_BLANK: dict[str, Any] = {**dict.fromkeys(RequestRecord.model_fields), "recall_mode": "none", "amend": False}
_COLUMN_OF_STAGE = {stage: column for column, stage in _STAGE_OF_COLUMN}


def build_record(
    pending: PendingRequest,
    config: JoinConfig,
    window_ms: int,
    status_override: RequestStatus | None = None,
) -> dict[str, Any]:
    """The request record of ``pending`` as it stands (``status_override``: an eviction's verdict)."""
    # A fixed summation order makes the floats identical whatever order the events arrived in: by
    # (ts, key, stage, duration), the rows themselves (pending.iter_events, reordered, and sorted as is).
    # A stage code indexes the known stages, then the request's custom names (join_state.FIRST_CUSTOM_CODE).
    names = KNOWN_STAGES + pending.customs if pending.customs else KNOWN_STAGES
    events = [(ts, key, names[code], dur) for code, ts, dur, key, _, _ in EVENT_RECORD.iter_unpack(pending.events)]
    if len(events) > 1:
        events.sort()
    spans: dict[str, float] = {}
    counts: dict[str, int] = {}
    vector: list[tuple[float, float]] = []
    bm25: list[tuple[float, float]] = []
    keys: list[int] = []
    for ts, key, stage, dur in events:
        keys.append(event_identity(stage, key, ts, dur))
        counts[stage] = counts.get(stage, 0) + 1
        if stage == "request_start" or stage == "first_token":
            continue
        spans[stage] = spans.get(stage, 0.0) + dur
        if stage == "vector_recall":
            vector.append((ts, dur))
        elif stage == "bm25_recall":
            bm25.append((ts, dur))
    start, first_token = pending.start, pending.first_token
    required = required_stages(config, pending.route)
    absent = [s for s in required if s not in counts]
    missing = absent if not absent or _in_order(required) else sorted_missing(absent)
    unmeasured = spans.get(LLM_UNMEASURED)
    status = status_override or status_of(start is not None, first_token is not None, missing, unmeasured is not None)
    ttft = first_token - start if start is not None and first_token is not None else None
    started_at = pending.started_at
    record = _BLANK.copy()
    record["request_id"] = pending.request_id
    record["tenant_id"] = pending.tenant
    record["version_id"] = pending.version
    record["rollout"] = pending.rollout
    record["route"] = pending.route
    record["fallback_level"] = pending.fallback
    record["status"] = status
    record["missing_stages"] = missing
    record["started_at"] = started_at
    record["first_token_at"] = first_token
    record["window_start"] = window_start(started_at, window_ms)
    record["ttft_ms"] = ttft
    custom: list[str] = []
    for stage, total in spans.items():  # the stage columns; the blank has None for the absent ones
        column = _COLUMN_OF_STAGE.get(stage)
        if column is not None:
            record[column] = total
        elif stage not in _KNOWN and stage != LLM_UNMEASURED:
            custom.append(stage)
    record["other_ms"] = other_ms(ttft, spans)
    record["llm_unmeasured_ms"] = unmeasured
    # Both maps are in name order; most requests have neither custom stages nor repeats (nothing to sort).
    record["custom_stages"] = {s: spans[s] for s in sorted(custom)} if custom else {}
    repeated = [(s, n - 1) for s, n in counts.items() if n > 1]
    record["stage_repeats"] = dict(sorted(repeated)) if repeated else {}
    if vector or bm25:
        record["recall_mode"] = recall_mode(vector, bm25)
    pending.put_attrs(record)
    record["duplicate_events"] = pending.duplicates
    record["late_events"] = pending.late
    record["event_count"] = len(events)
    if len(keys) > 1:
        keys.sort()
    record["event_keys"] = keys
    # schemas.records.record_version, inlined: a call into Python from the compiled core costs ~3k instructions.
    record["record_version"] = (len(events) << 8) | (STATUS_RANK[status] << 4) | min(pending.late, 15)
    return record


def _has_stage(record: Mapping[str, Any], stage: str) -> bool:
    if stage == "request_start":
        return bool(record["status"] != "orphan")
    if stage == "first_token":
        return record["first_token_at"] is not None
    if stage in _SPAN_STAGES:
        return record[f"{stage}_ms"] is not None
    return stage in record["custom_stages"]


def _merged_recall_mode(
    stored: Mapping[str, Any], amendment: Mapping[str, Any], merged: Mapping[str, Any], summed: set[str]
) -> Any:
    if all(merged[c] is not None for c in _RECALLS):
        if summed & set(_RECALLS):
            return None  # a late recall attempt: its overlap with the other recall is unknown
        for source in (stored, amendment):
            if all(source[c] is not None for c in _RECALLS):
                return source["recall_mode"]
        return None  # the two recalls came in different records: their overlap is unknown
    return "single" if any(merged[c] is not None for c in _RECALLS) else "none"


def _keyed(record: Mapping[str, Any]) -> list[int] | None:
    """The record's ``event_keys`` when they name every event it counted, else None (a row written before
    the field, or merged from amendments that could not be told apart)."""
    keys: list[int] = record.get("event_keys") or []
    return keys if keys and len(keys) == record["event_count"] else None


def merge_records(stored: Mapping[str, Any], amendment: Mapping[str, Any], window_ms: int) -> dict[str, Any]:
    """Fold a late amendment (``amend=True``) into the stored record of the same request (pure).

    Both records name the events they counted (``event_keys``). An amendment whose events are all counted
    already is a replay: only ``duplicate_events`` grows. One whose events are all new is a retry or a stage
    that came late: a stage the stored record lacks is taken, one it has is summed with a repeat (docs/design.md: a
    retried stage is summed), however late the retry came. Without keys on both sides (rows written before
    the field) a stage already present in ``stored`` is assumed already counted and left as it is. Instants
    keep the earliest; status, ttft, other, missing stages, window and record version are recomputed. When
    the two recalls arrive in different records their overlap is unknown and ``recall_mode`` becomes None.
    """
    stored_keys, amend_keys = _keyed(stored), _keyed(amendment)
    new_keys: list[int] = []
    if stored_keys is not None and amend_keys is not None:
        counted = set(stored_keys)
        new_keys = [k for k in amend_keys if k not in counted]
        if not new_keys:  # every event of the amendment is counted already: a replay
            replayed = dict(stored)
            replayed["duplicate_events"] = stored["duplicate_events"] + amendment["event_count"]
            replayed["amend"] = False
            return replayed
    sums = len(new_keys) == len(amend_keys or ()) > 0  # all new: a stage already stored is summed
    merged = dict(stored)
    stored_start = _has_stage(stored, "request_start")
    amend_start = _has_stage(amendment, "request_start")
    # Identity comes from request_start, else from the earliest event (docs/design.md).
    if (not stored_start and amend_start) or (
        not stored_start and not amend_start and amendment["started_at"] < stored["started_at"]
    ):
        for field in ("version_id", "rollout", "route", "started_at"):
            merged[field] = amendment[field]
    firsts = [t for t in (stored["first_token_at"], amendment["first_token_at"]) if t is not None]
    merged["first_token_at"] = min(firsts) if firsts else None
    has_start = stored_start or amend_start
    merged["ttft_ms"] = merged["first_token_at"] - merged["started_at"] if has_start and firsts else None
    repeats = dict(stored["stage_repeats"])
    summed: set[str] = set()

    def fold(stage: str, have: float | None, late: float | None, key: str) -> float | None:
        if late is None:
            return have
        extra = amendment["stage_repeats"].get(stage)
        if have is None:
            if extra is not None:
                repeats[stage] = extra
            return late
        if not sums:
            return have
        summed.add(key)
        repeats[stage] = repeats.get(stage, 0) + (extra or 0) + 1
        return have + late

    for column, stage in _STAGE_OF_COLUMN:
        merged[column] = fold(stage, stored[column], amendment[column], column)
    custom = dict(stored["custom_stages"])
    for stage, value in amendment["custom_stages"].items():
        folded = fold(stage, custom.get(stage), value, stage)
        if folded is not None:
            custom[stage] = folded
    merged["custom_stages"] = dict(sorted(custom.items()))
    # absent from a record written before the field
    unmeasured = fold(LLM_UNMEASURED, stored.get("llm_unmeasured_ms"), amendment.get("llm_unmeasured_ms"), "")
    merged["llm_unmeasured_ms"] = unmeasured
    merged["stage_repeats"] = dict(sorted(repeats.items()))
    missing = [s for s in stored["missing_stages"] if not _has_stage(amendment, s)]
    merged["missing_stages"] = missing
    status = status_of(has_start, bool(firsts), missing, unmeasured is not None)
    merged["status"] = status
    merged["other_ms"] = other_ms(merged["ttft_ms"], {s: merged[f"{s}_ms"] for s in PARENT_STAGES})
    merged["recall_mode"] = _merged_recall_mode(stored, amendment, merged, summed)
    for column in ATTR_COLUMNS:
        if merged[column] is None:
            merged[column] = amendment[column]
    merged["fallback_level"] = max(stored["fallback_level"], amendment["fallback_level"])
    merged["window_start"] = window_start(merged["started_at"], window_ms)
    for counter in ("duplicate_events", "late_events", "event_count"):
        merged[counter] = stored[counter] + amendment[counter]
    # Keys stay only while they name every counted event (a partly known amendment cannot be told apart).
    merged["event_keys"] = sorted([*(stored_keys or ()), *new_keys]) if sums else []
    merged["record_version"] = record_version(merged["event_count"], status, merged["late_events"])
    merged["amend"] = False
    return merged
