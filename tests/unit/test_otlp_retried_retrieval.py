"""A retried retrieval through the OTLP mapping and the join: two sibling retriever spans under the root, a
reranker under the second (issue 25 saw such requests stored with the first attempt's duration only). The
retrieval stored must be the sum of both attempts whatever the export batches, their order on the
partition, and the watermark moves and idle ticks between them."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.decode import decode_stage_event
from schemas.events import StageEvent
from schemas.otlp import AttrValue, OtlpSpan, OtlpSpanEvent
from streams.core.join import RequestJoin, merge_records
from streams.core.otlp_outputs import ForwardedEvent, Output
from streams.core.otlp_traces import TraceAssembler
from streams.settings import CapsConfig, JoinConfig, OtlpConfig

T0 = 1_764_000_000_000_000_000  # ns
MS = 1_000_000
NOW_MS = T0 / MS + 60_000.0
TRACE = "5e" * 16
ROOT, FIRST, SECOND, RERANK, EMBED_1, EMBED_2, LLM = (f"{i:02x}" * 8 for i in range(1, 8))
JOIN = JoinConfig()
CAPS = CapsConfig()


def _span(span_id: str, parent: str, start_ms: float, end_ms: float, kind: str, **extra: Any) -> OtlpSpan:
    attrs: dict[str, AttrValue] = {"tenant.id": "acme", "service.name": "rag"}
    if kind:
        attrs["openinference.span.kind"] = kind
    return OtlpSpan(
        trace_id=TRACE,
        span_id=span_id,
        parent_span_id=parent,
        name=kind or "POST /ask",
        start_ns=T0 + round(start_ms * MS),
        end_ns=T0 + round(end_ms * MS),
        attributes=attrs,
        events=tuple(OtlpSpanEvent(name, T0 + round(at * MS), {}) for name, at in extra.get("events", ())),
    )


SPANS = (  # in end-time order, as an SDK exports them
    _span(EMBED_1, FIRST, 1.0, 41.0, "EMBEDDING"),
    _span(FIRST, ROOT, 0.5, 80.6, "RETRIEVER"),  # 80.1 ms
    _span(EMBED_2, SECOND, 82.0, 132.0, "EMBEDDING"),
    _span(RERANK, SECOND, 500.0, 580.0, "RERANKER"),
    _span(SECOND, ROOT, 81.0, 581.0, "RETRIEVER"),  # 500 ms
    _span(LLM, ROOT, 600.0, 3_900.0, "LLM", events=(("First Token Stream Event", 1_500.0),)),
    _span(ROOT, "", 0.0, 3_910.0, ""),
)
#: Wall time an idle pause lasts: past the join's grace, so the bridge's idle tick can resolve a held trace.
PAUSE_MS = JOIN.grace_ms + 2 * JOIN.idle_tick_ms


def _record(outputs: list[Output], now_ms: float) -> dict[str, Any]:
    join = RequestJoin(JOIN, 60_000)
    records: list[dict[str, Any]] = []
    for o in outputs:
        assert isinstance(o, ForwardedEvent), o
        event = decode_stage_event(o.value, o.request_id.encode(), "ttft.stage-events", 0, 0, None, CAPS, now_ms)
        assert isinstance(event, StageEvent), event
        records += [r for r in join.add(event, 0, now_ms) if isinstance(r, dict)]
    records += join.advance(0, now_ms)
    records += join.advance(0, now_ms + JOIN.request_timeout_ms + PAUSE_MS)
    assert records and {r["request_id"] for r in records} == {TRACE}
    return max(records, key=lambda r: r["record_version"])


@settings(max_examples=200, deadline=None)
@given(
    cuts=st.sets(st.integers(1, len(SPANS) - 1), max_size=len(SPANS) - 1),
    order=st.permutations(range(len(SPANS))),
    pauses=st.sets(st.integers(0, len(SPANS) - 1)),
    reorder=st.booleans(),
)
def test_retried_retrieval_sums_both_attempts_whatever_the_batches_and_their_order(
    cuts: set[int], order: list[int], pauses: set[int], reorder: bool
) -> None:
    bounds = [0, *sorted(cuts), len(SPANS)]
    messages = [list(SPANS[a:b]) for a, b in pairwise(bounds)]
    if reorder:  # the Collector's sending queue can deliver one trace's batches out of order
        messages = [messages[i] for i in sorted(range(len(messages)), key=lambda i: order.index(i))]
    asm = TraceAssembler(OtlpConfig(), JOIN, CAPS, "otlp_spans")
    now = NOW_MS
    out: list[Output] = []
    for i, message in enumerate(messages):
        out += asm.add_message(message, 0, i, now)
        out += asm.advance(0, now)
        if i in pauses:  # the partition idles: its watermark moves on with wall time
            now += PAUSE_MS
            out += asm.advance(0, now)
    now += JOIN.request_timeout_ms + PAUSE_MS
    out += asm.advance(0, now)
    events = [orjson.loads(o.value) for o in out if isinstance(o, ForwardedEvent)]
    retrievals = sorted((e["event_id"], e["duration_ms"]) for e in events if e["stage"] == "retrieval")
    assert retrievals == [(FIRST, 80.1), (SECOND, 500.0)]
    record = _record(out, now)
    assert record["retrieval_ms"] == 580.1
    assert record["stage_repeats"]["retrieval"] == 1
    assert record["rerank_ms"] == 80.0
    if not reorder:
        # Delivered out of order, an embedding span that comes after its trace was mapped and before its
        # retriever span (in another message) cannot be told to be inside a retriever: it is no stage.
        assert record["vector_recall_ms"] == 90.0


def test_a_late_embedding_sent_before_its_retriever_in_one_message_is_vector_recall() -> None:
    asm = TraceAssembler(OtlpConfig(), JOIN, CAPS, "otlp_spans")
    early, late = [s for s in SPANS if s.span_id not in (EMBED_1, FIRST)], [SPANS[0], SPANS[1]]
    out = asm.add_message(early, 0, 0, NOW_MS)  # the root came first: the trace is mapped without them
    out += asm.add_message(late, 0, 1, NOW_MS)
    events = [orjson.loads(o.value) for o in out if isinstance(o, ForwardedEvent)]
    assert sorted(e["event_id"] for e in events if e["stage"] == "vector_recall") == sorted([EMBED_1, EMBED_2])
    assert sorted(e["event_id"] for e in events if e["stage"] == "retrieval") == sorted([FIRST, SECOND])


def _stored(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The row the writer keeps: the most complete full record, then every amendment merged in order
    (streams.store.requests_store.apply_amendments; an amendment of a request not stored is kept as it is)."""
    full = [r for r in records if not r["amend"]]
    row = max(full, key=lambda r: r["record_version"]) if full else None
    for amendment in (r for r in records if r["amend"]):
        row = dict(amendment) if row is None else merge_records(row, amendment, 60_000)
    assert row is not None
    return row


RETRY = frozenset({EMBED_2, RERANK, SECOND})


@pytest.mark.parametrize("late", ["trace", "retry"])
def test_a_retried_retrieval_that_reaches_the_join_after_it_forgot_the_request_sums_both_attempts(late: str) -> None:
    """Issue 25's 43 traces: events that reach the join more than ``forget_after_ms`` (event time) behind its
    watermark each become an ``amend=True`` record, and the writer kept the retrieval it had stored (the first
    attempt's) and dropped the second. ``late``: the whole trace came that late, or only its second attempt's
    spans (delivered after the rest of the trace, once the join had emitted and forgotten the request)."""
    asm = TraceAssembler(OtlpConfig(), JOIN, CAPS, "otlp_spans")
    join = RequestJoin(JOIN, 60_000)
    records: list[dict[str, Any]] = []

    def feed(outputs: list[Output], now_ms: float) -> None:
        for o in outputs:
            assert isinstance(o, ForwardedEvent), o
            raw = decode_stage_event(o.value, o.request_id.encode(), "ttft.stage-events", 0, 0, None, CAPS, now_ms)
            assert isinstance(raw, StageEvent), raw
            records.extend(r for r in join.add(raw, 0, now_ms) if isinstance(r, dict))
        records.extend(join.advance(0, now_ms))

    now = NOW_MS
    early = [] if late == "trace" else [s for s in SPANS if s.span_id not in RETRY]
    for i, span in enumerate(early):
        feed(asm.add_message([span], 0, i, now), now)
    # Other requests of the tenant, much later in event time, move the join's watermark on.
    for step in range(1, 4):
        now += JOIN.forget_after_ms
        other = StageEvent(request_id=f"other-{step}", tenant_id="acme", stage="retrieval", ts_ms=now, duration_ms=1.0)
        join.add(other, 0, now)
        feed(asm.advance(0, now), now)
    for i, span in enumerate([s for s in SPANS if s not in early], start=len(early)):
        feed(asm.add_message([span], 0, i, now), now)
    now += JOIN.request_timeout_ms + PAUSE_MS
    feed(asm.advance(0, now), now)
    mine = [r for r in records if r["request_id"] == TRACE]
    assert any(r["amend"] for r in mine)
    row = _stored(mine)
    assert row["retrieval_ms"] == 580.1 and row["stage_repeats"]["retrieval"] == 1
    assert row["rerank_ms"] == 80.0 and row["status"] == "complete"
    assert row["event_count"] == len(row["event_keys"])
