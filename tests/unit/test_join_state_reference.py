"""The join's per-event hashes and attr fold agree with their first, plain implementations (kept below as the
reference): the digests and event keys live in changelog states, so they must stay bit-identical whatever
the faster code computes them with; the attrs a request keeps must be the same pairs."""

from __future__ import annotations

import hashlib
import zlib
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.events import KNOWN_ATTRS, StageEvent
from schemas.vocabulary import KNOWN_STAGES
from streams.core.join_state import _ATTR_INDEX, _ATTR_RANKS, PendingRequest, content_digest, event_key

T0 = 1_796_000_000_000.0
_NO_ATTRS = dict.fromkeys(sorted(KNOWN_ATTRS))


def reference_digest(event: StageEvent) -> int:
    attrs = event.attrs
    known: dict[str, Any] | None = None
    extra: dict[str, Any] | None = None
    if attrs is not None:
        known = dict(_NO_ATTRS)
        extra = {}
        for name, value in attrs.items():
            if name in known:
                known[name] = value
            else:
                extra[name] = value
    payload = orjson.dumps(
        [
            event.ts_ms,
            event.duration_ms,
            event.version_id,
            event.rollout,
            event.route,
            event.fallback_level,
            known,
            extra,
        ],
        option=orjson.OPT_SORT_KEYS,
    )
    digest = zlib.crc32(payload)
    return (digest - (1 << 32) if digest >= 1 << 31 else digest) or 1


def reference_key(event: StageEvent) -> int:
    if event.event_id is None:
        return 0
    digest = hashlib.blake2b(event.event_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True) or 1


def reference_fold_attrs(p: PendingRequest, event: StageEvent, index: int, rank: Any) -> tuple[Any, ...] | None:
    """The attrs ``p`` holds after taking event ``index``'s, computed as the first implementation did."""
    attrs = event.attrs
    assert attrs is not None
    sparse = p.attrs or ()
    new: dict[int, tuple[int, Any]] | None = None
    for name, value in attrs.items():
        i = _ATTR_INDEX.get(name)
        if i is None or value is None:
            continue
        for j in range(0, len(sparse), 2):
            tag = sparse[j]
            if tag & 7 == i:
                source = tag >> 3
                if source >= 0:
                    ranks, other = _ATTR_RANKS[name]
                    old_stage, old = p._rank(source)
                    if (ranks.get(old_stage, other), old) <= (ranks.get(event.stage, other), rank):
                        break
                new = new or {}
                new[i] = ((index << 3) | i, value)
                break
        else:
            new = new or {}
            new[i] = ((index << 3) | i, value)
    if new is None:
        return p.attrs
    for j in range(0, len(sparse), 2):
        i = sparse[j] & 7
        if i not in new:
            new[i] = (sparse[j], sparse[j + 1])
    merged: list[Any] = []
    for i in sorted(new):
        merged += new[i]
    return tuple(merged)


TEXT = st.text(min_size=1, max_size=12)
KNOWN_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "prompt_tokens": st.integers(0, 10_000_000),
    "cached_tokens": st.integers(0, 10_000_000),
    "prompt_cache_hit": st.booleans(),
    "draft_accept_rate": st.floats(0, 1),
    "rerank_top_k": st.integers(0, 100_000),
    "retrieval_cache_hit": st.booleans(),
    "trace_id": st.text(min_size=1, max_size=40),
}
CUSTOM_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)


@st.composite
def attrs_of(draw: st.DrawFn) -> dict[str, Any] | None:
    if draw(st.integers(0, 5)) == 0:
        return None
    out: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(sorted(KNOWN_VALUES)), unique=True, max_size=7)):
        out[name] = draw(st.one_of(st.none(), KNOWN_VALUES[name]))
    for name in draw(st.lists(TEXT.filter(lambda k: k not in KNOWN_ATTRS), unique=True, max_size=3)):
        out[name] = draw(CUSTOM_VALUE)
    order = draw(st.permutations(list(out)))
    return {k: out[k] for k in order}


@st.composite
def events(draw: st.DrawFn) -> StageEvent:
    stage = draw(st.one_of(st.sampled_from(KNOWN_STAGES), st.sampled_from(["my_stage", "other_stage"])))
    instant = stage in ("request_start", "first_token")
    fields: dict[str, Any] = {
        "request_id": "r-1",
        "tenant_id": "acme",
        "stage": stage,
        "ts_ms": T0 + draw(st.integers(0, 5_000)) / draw(st.sampled_from([1, 4])),
        "duration_ms": None if instant else draw(st.one_of(st.integers(0, 9_000), st.floats(0, 9_000))),
        "version_id": draw(st.sampled_from(["unknown", "v1", "vé-2", "版本"])),
        "rollout": draw(st.sampled_from([None, "stable", "canary"])),
        "route": draw(st.sampled_from([None, "main", "fäst"])),
        "fallback_level": draw(st.one_of(st.none(), st.integers(0, 100))),
        "event_id": draw(st.one_of(st.none(), st.text(min_size=1, max_size=40))),
        "attrs": draw(attrs_of()),
    }
    return StageEvent.model_validate(fields)


@settings(max_examples=400, deadline=None)
@given(events())
def test_digest_and_event_key_are_the_reference_values(event: StageEvent) -> None:
    assert content_digest(event) == reference_digest(event)
    assert event_key(event) == reference_key(event)


@settings(max_examples=300, deadline=None)
@given(st.lists(events(), min_size=1, max_size=10))
def test_the_attrs_a_request_keeps_are_the_reference_ones(stream: list[StageEvent]) -> None:
    p = PendingRequest("r-1", "acme", 0, T0)
    for offset, event in enumerate(stream):
        before = p.attrs
        index = p.event_count
        folded = p.fold_event(event, event_key(event), content_digest(event), offset)
        if folded is not True or event.attrs is None:
            continue
        after = p.attrs
        p.attrs = before
        dur = 0.0 if event.duration_ms is None else event.duration_ms + 0.0
        expected = reference_fold_attrs(p, event, index, (event.ts_ms, event_key(event), event.stage, dur))
        assert after == expected
        p.attrs = after
