"""A retried retrieval through the OTLP mapping and the join: two sibling retriever spans under the root, a
reranker under the second (issue 25 saw such requests stored with the first attempt's duration only). The
retrieval stored must be the sum of both attempts whatever the export batches, their order on the
partition, and the watermark moves and idle ticks between them."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.decode import decode_stage_event
from schemas.events import StageEvent
from schemas.otlp import AttrValue, OtlpSpan, OtlpSpanEvent
from streams.core.join import RequestJoin
from streams.core.otlp_traces import ForwardedEvent, Output, TraceAssembler
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
