"""Changelog compatibility of the in-memory layout: states written before the sparse attrs and the request id
read from the key (the bytes below, as that code wrote them) restore and serialise back byte for byte, and
the same events folded today serialise to the same bytes."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.events import StageEvent
from streams.core.join import RequestJoin
from streams.core.join_record import build_record
from streams.core.join_state import PendingRequest, content_digest, event_key, state_key
from streams.settings import JoinConfig

T0 = 1_700_000_000_000.0
CFG = JoinConfig()

# Written by the join state code before this layout (the same STATE_FORMAT 2).
WRITTEN_BEFORE: dict[str, bytes] = {
    "typical": (
        b'[2,3,"acme","v2","canary","main",0,0,0,0,1699999999995.0,0,1700000002014.0,104,["custom_x"],"AAAAAIBW/rx4QgAAAAAAAAAA5kmEw6rPbt47s/zGZAAAAAAAAAAFAAAggFb+vHhCAAAAAAAA+D8NctW9ifNpH5yUHidlAAAAAAAAAAYAAECAVv68eEIAAAAAAAAiQAAAAAAAAAAADc6x3WYAAAAAAAAACAAAUIBW/rx4QgAAAAAAAPA/AAAAAAAAAABWAlX8ZwAAAAAAAAAHAADggFb+vHhCAAAAAAAAAAAAAAAAAAAAAOMHi8FoAAAAAAAAAA==",[10,4,true,0.5,null,null,"abc",1,1,1,2,-1,-1,0]]'
    ),
    "replaced": (
        b'[2,0,"acme","unknown",null,null,0,0,1,2,1700000000000.0,1,0.0,null,null,"AQAAAIBW/rx4QgAAAAAAAABASt9DZ/luWE/7NeOvyAAAAAAAAAA=",[null,null,null,null,null,null,null,-1,-1,-1,-1,-1,-1,-1]]'
    ),
    "no_attrs": (
        b'[2,1,"acme","unknown",null,null,0,0,0,0,1700000000000.0,0,0.0,null,null,"BwAAMIBW/rx4QgAAAAAAAAAAAAAAAAAAAACBhsW0ZAAAAAAAAAA=",null]'
    ),
}


def ev(stage: str, dt: float, dur: float | None = None, **kw: Any) -> StageEvent:
    fields = {"request_id": "r-1", "tenant_id": "acme", "stage": stage, "ts_ms": T0 + dt, "duration_ms": dur, **kw}
    return StageEvent.model_validate(fields)


def fold(p: PendingRequest, events: list[StageEvent], first_offset: int = 100) -> None:
    for i, e in enumerate(events):
        p.fold_event(e, event_key(e), content_digest(e), first_offset + i)


def typical() -> PendingRequest:
    p = PendingRequest("r-1", "acme", 3, T0 - 5.0)
    start_attrs = {"trace_id": "abc"}
    prompt_attrs = {"prompt_tokens": 10, "cached_tokens": 4, "prompt_cache_hit": True, "x": 1}
    fold(
        p,
        [
            ev("request_start", 0, event_id="s", version_id="v2", route="main", rollout="canary", attrs=start_attrs),
            ev("prompt_assemble", 2, 1.5, event_id="p", attrs=prompt_attrs),
            ev("llm_ttft", 4, 9.0, attrs={"prompt_tokens": 11, "draft_accept_rate": 0.5}),
            ev("custom_x", 5, 1.0),
            ev("first_token", 14),
        ],
    )
    p.offset, p.deadline = 104, T0 + 2014.0
    return p


def replaced() -> PendingRequest:
    """A conflicting copy won and carries no attrs: the loser's attrs lose their source."""
    q = PendingRequest("r-2", "acme", 0, T0)
    fold(q, [ev("retrieval", 1, 2.0, event_id="x", attrs={"rerank_top_k": 3, "retrieval_cache_hit": True})])
    fold(q, [ev("retrieval", 0, 2.0, event_id="x")], 200)
    q.emitted, q.late, q.duplicates = True, 2, 1
    return q


def no_attrs() -> PendingRequest:
    r = PendingRequest("r-3", "acme", 1, T0)
    fold(r, [ev("first_token", 3)])
    return r


BUILT = {"typical": typical, "replaced": replaced, "no_attrs": no_attrs}


@pytest.mark.parametrize("name", sorted(WRITTEN_BEFORE))
def test_states_written_before_restore_and_serialise_back_byte_for_byte(name: str) -> None:
    packed = WRITTEN_BEFORE[name]
    p = PendingRequest.from_bytes(state_key("acme", "r-x"), packed)
    assert p.to_bytes() == packed


@pytest.mark.parametrize("name", sorted(WRITTEN_BEFORE))
def test_the_same_events_serialise_to_the_bytes_written_before(name: str) -> None:
    assert BUILT[name]().to_bytes() == WRITTEN_BEFORE[name]


@pytest.mark.parametrize("name", sorted(WRITTEN_BEFORE))
def test_a_restored_state_builds_the_record_of_the_folded_one(name: str) -> None:
    built = BUILT[name]()
    join = RequestJoin(CFG, 60_000)
    join.restore(built.key, WRITTEN_BEFORE[name], built.partition)
    restored = join.get(built.request_id, "acme")
    assert restored is not None and restored.request_id == built.request_id and restored.key == built.key
    assert build_record(restored, CFG, 60_000) == build_record(built, CFG, 60_000)
    assert restored.attr_values() == built.attr_values()


def test_attr_values_follow_the_owner_ranking() -> None:
    # prompt_tokens: prompt_assemble owns it before llm_ttft; trace_id comes from request_start.
    assert typical().attr_values() == (10, 4, True, 0.5, None, None, "abc")
    assert replaced().attr_values() == (None,) * 7


def test_the_request_id_is_the_tail_of_the_key() -> None:
    p = PendingRequest("a\x00b", "t\u00fc", 0, T0)
    assert p.key == state_key("t\u00fc", "a\x00b") and p.request_id == "a\x00b"
