"""PendingRequest: dedup keys, the compact changelog form, and its round trip."""

from __future__ import annotations

import base64
import itertools
import struct
from typing import Any

import orjson
import pytest

from schemas.events import StageEvent
from streams.core.join import build_record
from streams.core.join_state import EVENT_RECORD, Conflict, PendingRequest, content_digest, event_key
from streams.settings import JoinConfig

T0 = 1_700_000_000_000.0
CFG = JoinConfig()


def ev(stage: str, ts: float, dur: float | None = None, **kw: Any) -> StageEvent:
    kw.setdefault("tenant_id", "acme")
    return StageEvent(request_id="req-0001", stage=stage, ts_ms=T0 + ts, duration_ms=dur, **kw)


def typical(with_ids: bool = True) -> list[StageEvent]:
    """An 8-event request as a service emits it: event ids, a route, a trace id and cache attrs."""
    specs: list[tuple[str, float, float | None, dict[str, Any]]] = [
        ("request_start", 0, None, {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}),
        ("retrieval", 2, 310.5, {"retrieval_cache_hit": False}),
        ("vector_recall", 3, 120.25, {}),
        ("bm25_recall", 3, 95.0, {}),
        ("rerank", 130, 180.0, {"rerank_top_k": 20}),
        (
            "prompt_assemble",
            313,
            84.0,
            {"prompt_tokens": 3_100, "cached_tokens": 2_048, "prompt_cache_hit": True},
        ),
        ("llm_ttft", 398, 1_150.75, {"draft_accept_rate": 0.72}),
        ("first_token", 1_549, None, {}),
    ]
    return [
        ev(
            stage,
            ts,
            dur,
            event_id=f"req-0001:{stage}:0" if with_ids else None,
            attrs=attrs or None,
            version_id="gpt-x-2024-06",
            route="main",
            rollout="stable",
            fallback_level=0,
        )
        for stage, ts, dur, attrs in specs
    ]


def folded(events: list[StageEvent]) -> PendingRequest:
    p = PendingRequest("req-0001", "acme", 3, T0 - 5.0)
    for e in events:
        p.fold(e, event_key(e))
    return p


PAIRS = [
    (ev("retrieval", 1, 2.0), ev("retrieval", 1, 2.0)),
    (ev("retrieval", 1, 2.0), ev("retrieval", 1, 3.0)),
    (ev("retrieval", 1, 2.0), ev("retrieval", 2, 2.0)),
    (ev("retrieval", 1, 2.0), ev("rerank", 1, 2.0)),
    (ev("retrieval", 1, 2.0, event_id="a"), ev("retrieval", 9, 9.0, event_id="a")),
    (ev("retrieval", 1, 2.0, event_id="a"), ev("retrieval", 1, 2.0, event_id="b")),
    (ev("retrieval", 1, 2.0, event_id="a"), ev("retrieval", 1, 2.0)),
    (ev("retrieval", 1, 2.0, event_id="a"), ev("rerank", 1, 2.0, event_id="a")),
    (ev("first_token", 1), ev("first_token", 1)),
    (ev("first_token", 1), ev("first_token", 2)),
    (ev("first_token", 1, event_id="f"), ev("first_token", 5, event_id="f")),
    (ev("my_stage", 1, 2.0), ev("my_stage", 1, 2.0)),
    (ev("my_stage", 1, 2.0), ev("other_stage", 1, 2.0)),
]


@pytest.mark.parametrize(("first", "second"), PAIRS)
def test_fold_dedup_agrees_with_the_contract_dedup_key(first: StageEvent, second: StageEvent) -> None:
    p = folded([first])
    assert p.fold(second, event_key(second)) is (first.dedup_key() != second.dedup_key())


def folded_with_digests(events: list[StageEvent]) -> tuple[PendingRequest, list[bool | Conflict]]:
    p = PendingRequest("req-0001", "acme", 3, T0 - 5.0)
    return p, [p.fold_event(e, event_key(e), content_digest(e), offset) for offset, e in enumerate(events)]


CONFLICTS = [
    # Same event id, different content: a producer bug. The smaller (ts, duration, digest) copy wins.
    (
        ev("llm_ttft", 1, 2.0, event_id="x", attrs={"draft_accept_rate": 0.5}, version_id="v1"),
        ev("llm_ttft", 7, 9.0, event_id="x", attrs={"draft_accept_rate": 0.9}, version_id="v2"),
    ),
    (ev("retrieval", 1, 2.0, event_id="x", route="a"), ev("retrieval", 1, 2.0, event_id="x", route="b")),
    (ev("retrieval", 1, 2.0, version_id="v1"), ev("retrieval", 1, 2.0, version_id="v2")),  # no event id
    (ev("request_start", 0, event_id="s", version_id="v1"), ev("request_start", 3, event_id="s", version_id="v2")),
]


@pytest.mark.parametrize(("a", "b"), CONFLICTS)
def test_conflicting_copies_resolve_the_same_in_either_order(a: StageEvent, b: StageEvent) -> None:
    others = [ev("request_start", -1, version_id="v0"), ev("first_token", 50), ev("prompt_assemble", 2, 1.0)]
    if a.stage == "request_start":
        others = others[1:]
    p, outcomes = folded_with_digests([*others, a, b])
    q, outcomes_rev = folded_with_digests([*others, b, a])
    assert build_record(p, CFG, 60_000) == build_record(q, CFG, 60_000)
    assert sorted(p.iter_events()) == sorted(q.iter_events())
    conflict, conflict_rev = outcomes[-1], outcomes_rev[-1]
    assert isinstance(conflict, Conflict) and isinstance(conflict_rev, Conflict)
    assert conflict.stored_lost != conflict_rev.stored_lost  # one order replaces, the other refuses
    n = len(others)
    # The same copy loses both times; its offset differs with its place in each log.
    assert {conflict.loser_offset, conflict_rev.loser_offset} == {n, n + 1}


def test_an_identical_copy_is_a_plain_duplicate() -> None:
    a = ev("retrieval", 1, 2.0, event_id="x", attrs={"rerank_top_k": 3})
    _, outcomes = folded_with_digests([a, ev("retrieval", 1, 2.0, event_id="x", attrs={"rerank_top_k": 3})])
    assert outcomes == [True, False]


def test_state_format_1_is_still_read() -> None:
    p = folded(typical())
    fields = orjson.loads(p.to_bytes())
    blob = base64.b64decode(fields[15])
    v1 = b"".join(
        struct.pack("<Hddq", code, ts, dur, key) for code, ts, dur, key, _, _ in EVENT_RECORD.iter_unpack(blob)
    )
    fields[0], fields[15] = 1, base64.b64encode(v1).decode()
    q = PendingRequest.from_bytes("req-0001", orjson.dumps(fields))
    assert build_record(q, CFG, 60_000) == build_record(p, CFG, 60_000)
    assert q.fold(typical()[1], event_key(typical()[1])) is False  # dedup still works on upgraded records


def test_event_key_is_stable_across_processes() -> None:
    # The key is stored in the changelog: changing the hash breaks dedup across an upgrade.
    assert event_key(ev("retrieval", 0, 1.0, event_id="e-1")) == -6985662141323381967
    assert event_key(ev("retrieval", 0, 1.0)) == 0


@pytest.mark.parametrize("with_ids", [True, False])
def test_round_trip_through_bytes(with_ids: bool) -> None:
    p = folded([*typical(with_ids), ev("custom_b", 5, 1.0), ev("custom_a", 6, 2.0), ev("custom_b", 7, 1.0)])
    p.duplicates, p.late, p.emitted, p.deadline, p.offset, p.fallback = 2, 1, True, T0 + 9e5, 12_345, 3
    packed = p.to_bytes()
    q = PendingRequest.from_bytes("req-0001", packed)
    assert q.to_bytes() == packed
    assert build_record(q, CFG, 60_000) == build_record(p, CFG, 60_000)
    # mypyc's build of the class (streams/core/native.py) lists its fields in __mypyc_attrs__, not __slots__.
    fields = getattr(PendingRequest, "__slots__", None) or PendingRequest.__mypyc_attrs__  # type: ignore[attr-defined]
    assert len(fields) >= 20
    for name in fields:
        assert getattr(q, name) == getattr(p, name), name


def test_state_of_a_typical_request_is_a_few_hundred_bytes() -> None:
    p = folded(typical())
    p.offset = 123_456_789
    assert p.event_count == 8
    assert len(p.events) == 8 * EVENT_RECORD.size
    assert len(p.to_bytes()) <= 600


def test_strings_are_interned() -> None:
    a, b = folded(typical()), folded(typical())
    assert a.version is b.version and a.tenant is b.tenant and a.route is b.route


def _corrupt(index: int, value: Any) -> bytes:
    fields = orjson.loads(folded(typical()).to_bytes())
    fields[index] = value
    return orjson.dumps(fields)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"{",
        b"[]",
        b"[99]",
        b'{"a": 1}',
        b"[1, 0]",
        _corrupt(2, 7),  # tenant not a string
        _corrupt(6, 8),  # identity event index past the events
        _corrupt(13, "12"),  # offset not a number
        _corrupt(15, "!!!"),  # events not base64
        _corrupt(15, base64.b64encode(b"x" * 25).decode()),  # not whole records
        _corrupt(15, base64.b64encode(EVENT_RECORD.pack(40, T0, 1.0, 0, 0, -1)).decode()),  # unknown stage code
        _corrupt(16, [None] * 3),  # attrs of the wrong shape
    ],
)
def test_from_bytes_rejects_corrupt_state(data: bytes) -> None:
    with pytest.raises(ValueError, match="req-0001"):
        PendingRequest.from_bytes("req-0001", data)


def test_content_digests_are_stable_across_the_attrs_representation() -> None:
    """Digests live in changelog states: these were computed when ``attrs`` was a nested model (before
    issue 13 made it a plain dict), and a restored state must keep recognising the same duplicates."""
    base = {
        "request_id": "r1",
        "tenant_id": "acme",
        "stage": "llm_ttft",
        "ts_ms": 1796000000000.5,
        "duration_ms": 640.25,
        "version_id": "v7",
        "rollout": "canary",
        "route": "main",
        "fallback_level": 1,
    }
    cases: list[dict[str, Any]] = [
        {},
        {"attrs": {}},
        {"attrs": {"trace_id": "abc"}},
        {"attrs": {"prompt_tokens": 1200, "cached_tokens": 0, "prompt_cache_hit": True, "draft_accept_rate": 0.5}},
        {"attrs": {"prompt_tokens": None, "custom": "x", "n": 1.5, "flag": False, "z": None}},
        {"attrs": {"rerank_top_k": 10, "retrieval_cache_hit": False, "trace_id": "t" * 128, "k": 7}},
    ]
    digests = [content_digest(StageEvent.model_validate({**base, **case})) for case in cases]
    assert digests == [-1686665198, -941366755, 218753061, 2132542831, -1928192243, 292192505]


@pytest.mark.parametrize("levels", [(5, 0), (0, 5), (2, None), (None, 3), (1, 4)])
def test_a_conflicting_duplicates_fallback_level_does_not_depend_on_arrival_order(
    levels: tuple[int | None, int | None],
) -> None:
    # Two copies of one llm_ttft (same event id) that differ only in fallback_level: whichever wins, the
    # request keeps the highest level any copy said, in every arrival order of the request's events.
    copies = [ev("llm_ttft", 3, 9.0, event_id="x", fallback_level=level) for level in levels]
    others = [ev("request_start", 0, event_id="s"), ev("first_token", 20, event_id="f")]
    want = max(level or 0 for level in levels)
    records = []
    for order in itertools.permutations([*others, *copies]):
        p, outcomes = folded_with_digests(list(order))
        assert sum(isinstance(o, Conflict) for o in outcomes) == 1
        records.append(build_record(p, CFG, 60_000))
    assert {r["fallback_level"] for r in records} == {want}
    assert all(r == records[0] for r in records)


def test_exact_bytes_is_orjson_output_in_a_block_of_its_own_size() -> None:
    import sys

    from streams.core.join_state import exact_bytes

    record = {"request_id": "r1", "started_at": 1_796_478_640_125.17, "missing_stages": ["retrieval"], "x": None}
    out = exact_bytes(record)
    assert out == orjson.dumps(record) and type(out) is bytes
    assert sys.getsizeof(out) == sys.getsizeof(b"") + len(out)


def test_a_record_has_the_schemas_fields_in_its_order_and_its_identities_stay() -> None:
    """build_record starts from a blank record: whatever the request holds, the record has exactly
    RequestRecord's fields, in its order, and validates; a keyless event's identity (a BLAKE2b of its timing)
    is the value stored rows already hold."""
    from schemas.records import RequestRecord, record_version
    from streams.core.join_record import event_identity

    lone = PendingRequest("req-0001", "acme", 0, 0.0)
    lone.fold(ev("request_start", 0), 0)
    full = PendingRequest("req-0001", "acme", 0, 0.0)
    for event in (ev("request_start", 0, attrs={"trace_id": "ab"}), ev("bm25_recall", 2, 5.0), ev("hx_custom", 8, 1.0)):
        full.fold(event, event_key(event))
    for pending in (lone, full):
        record = build_record(pending, JoinConfig(), 60_000)
        assert list(record) == list(RequestRecord.model_fields), list(record)
        RequestRecord.model_validate(record)
        assert record["record_version"] == record_version(record["event_count"], record["status"], pending.late)
    assert build_record(full, JoinConfig(), 60_000)["custom_stages"] == {"hx_custom": 1.0}
    assert build_record(full, JoinConfig(), 60_000)["trace_id"] == "ab"
    assert event_identity("request_start", 0, 1_000.0, 0.0) == 4_158_866_512_014_050_795
    assert event_identity("rerank", 0, 1.7e12, 12.5) == 616_414_550_513_908_332
