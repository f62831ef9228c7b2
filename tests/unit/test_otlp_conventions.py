"""Each instrumentation convention the mapping reads, on small hand-made spans (docs/otlp-mapping.md's table):
first chunk from an attribute in seconds or milliseconds or from the earliest matching event, values that
are no finite number, streaming flags, token spellings, stages of both conventions, derived prompt assembly."""

from __future__ import annotations

import itertools
import math
from typing import Any

import orjson
import pytest

from schemas.dead_letter import DeadLetter
from schemas.otlp import AttrValue, OtlpSpan, OtlpSpanEvent
from streams.core.otlp_conventions import (
    EMBEDDING,
    LATE_FIRST_CHUNK_NS,
    TOOL_CALL,
    first_chunk,
    span_stage,
    streaming,
    token_attrs,
)
from streams.core.otlp_outputs import MAX_SCOPES, OTHER_SCOPE, ForwardedEvent, Output
from streams.core.otlp_traces import TraceAssembler
from streams.settings import CapsConfig, JoinConfig, OtlpConfig

T0 = 1_764_000_000_000_000_000  # ns
MS = 1_000_000
NOW_MS = T0 / MS + 3_600_000
TRACE = "ab" * 16
ROOT = "01" * 8


def _span(
    span_id: str,
    start_ms: float,
    end_ms: float,
    attrs: dict[str, AttrValue] | None = None,
    events: tuple[tuple[str, float], ...] = (),
    parent: str = ROOT,
    scope: tuple[str, str] = ("test.scope", "1.0"),
) -> OtlpSpan:
    return OtlpSpan(
        trace_id=TRACE,
        span_id=span_id,
        parent_span_id=parent,
        name=span_id,
        start_ns=T0 + round(start_ms * MS),
        end_ns=T0 + round(end_ms * MS),
        attributes={"tenant.id": "acme", **(attrs or {})},
        events=tuple(OtlpSpanEvent(name, T0 + round(at * MS), {}) for name, at in events),
        scope_name=scope[0],
        scope_version=scope[1],
    )


def _llm(attrs: dict[str, AttrValue] | None = None, events: tuple[tuple[str, float], ...] = ()) -> OtlpSpan:
    return _span("0c" * 8, 400.0, 2_000.0, {"gen_ai.operation.name": "chat", **(attrs or {})}, events)


def _root() -> OtlpSpan:
    return _span(ROOT, 0.0, 2_100.0, parent="")


def _map(*spans: OtlpSpan) -> tuple[TraceAssembler, list[Output]]:
    asm = TraceAssembler(OtlpConfig(), JoinConfig(), CapsConfig(), "otlp_spans")
    return asm, asm.add_message([*spans, _root()], 0, 0, NOW_MS)


def _events(out: list[Output], stage: str) -> list[dict[str, Any]]:
    events = [orjson.loads(o.value) for o in out if isinstance(o, ForwardedEvent)]
    return sorted((e for e in events if e["stage"] == stage), key=lambda e: e["ts_ms"])


def _ttft(*spans: OtlpSpan) -> float:
    (event,) = _events(_map(*spans)[1], "llm_ttft")
    duration: float = event["duration_ms"]
    return duration


@pytest.mark.parametrize(
    ("attrs", "want_ms"),
    [
        ({"gen_ai.response.time_to_first_chunk": 0.25}, 250.0),  # GenAI semantic conventions: seconds
        ({"gen_ai.server.time_to_first_token": 0.3}, 300.0),  # OpenLIT, Strands: seconds
        ({"ai.response.msToFirstChunk": 350.5}, 350.5),  # Vercel AI SDK: milliseconds
        ({"ai.response.msToFirstChunk": 120}, 120.0),  # an integer is a number too
        # first found wins, in the documented order
        ({"gen_ai.server.time_to_first_token": 0.3, "gen_ai.response.time_to_first_chunk": 0.25}, 250.0),
    ],
)
def test_first_chunk_attribute_in_its_unit(attrs: dict[str, AttrValue], want_ms: float) -> None:
    assert _ttft(_llm(attrs)) == pytest.approx(want_ms, abs=1e-6)


@pytest.mark.parametrize(
    "name",
    ["gen_ai.first_chunk", "First Token Stream Event", "gen_ai.content.completion.chunk", "ai.stream.firstChunk"],
)
def test_first_chunk_is_the_earliest_matching_event(name: str) -> None:
    events = ((name, 900.0), ("unrelated", 500.0), (name, 700.0), (name, 1_100.0))  # not in time order
    assert _ttft(_llm(events=events)) == pytest.approx(300.0)


def test_an_attribute_wins_over_an_event() -> None:
    span = _llm({"gen_ai.response.time_to_first_chunk": 0.2}, (("gen_ai.first_chunk", 900.0),))
    assert _ttft(span) == pytest.approx(200.0)


@pytest.mark.parametrize(
    "value", [math.nan, math.inf, -math.inf, -0.5, 99.0, "0.25", True], ids=repr
)  # 99 s is past the span's end
def test_a_first_chunk_value_that_is_no_finite_number_in_the_span_is_ignored_with_its_reason(value: Any) -> None:
    name = "gen_ai.response.time_to_first_chunk"
    chunk = first_chunk(_llm({name: value}))
    assert chunk.at_ns is None and name in chunk.problem
    # the next source is used ...
    assert _ttft(_llm({name: value}, (("gen_ai.first_chunk", 700.0),))) == pytest.approx(300.0)
    # ... and without one the span is llm_unmeasured, never raising, with what was ignored
    asm, out = _map(_llm({name: value, "gen_ai.is_streaming": True}))
    assert not [o for o in out if isinstance(o, DeadLetter)]
    (unmeasured,) = _events(out, "llm_unmeasured")
    assert name in unmeasured["attrs"]["first_chunk_ignored"]
    assert asm.counters.no_first_chunk == {("test.scope", "1.0"): 1}


def test_events_before_the_span_or_long_after_it_are_ignored() -> None:
    late = 2_000.0 + LATE_FIRST_CHUNK_NS / MS + 1.0
    chunk = first_chunk(_llm(events=(("gen_ai.first_chunk", 100.0), ("gen_ai.first_chunk", late))))
    assert chunk.at_ns is None and "outside" in chunk.problem and "600 s after its end" in chunk.problem


def test_an_event_after_the_span_end_counts() -> None:
    """OpenInference's LlamaIndex instrumentor ends a streaming call's span when it hands the stream back, then
    adds the first chunk's event: the span tells the first chunk after its end (tests/unit/test_otlp_llamaindex.py)."""
    chunk = first_chunk(_llm(events=(("First Token Stream Event", 2_500.0),)))
    assert chunk.at_ns == T0 + round(2_500.0 * MS) and not chunk.problem
    assert _ttft(_llm(events=(("First Token Stream Event", 2_500.0),))) == pytest.approx(2_100.0)


@pytest.mark.parametrize(
    ("attrs", "want"),
    [
        ({"gen_ai.is_streaming": False}, False),  # OpenLLMetry
        ({"gen_ai.is_streaming": True}, True),
        ({"llm.is_streaming": False}, False),
        ({"gen_ai.request.stream": True}, True),
        ({"llm.invocation_parameters": '{"model": "m"}'}, False),  # OpenInference: the API default
        ({"llm.invocation_parameters": '{"model": "m", "stream": true}'}, True),
        ({"llm.invocation_parameters": "not json"}, None),
        ({"ai.operationId": "ai.generateText.doGenerate"}, False),  # Vercel AI SDK
        ({"ai.operationId": "ai.streamText.doStream"}, True),
        ({"llm.is_streaming": "True"}, True),  # LiteLLM's own callback: str(stream)
        ({"llm.is_streaming": "false"}, False),
        ({"llm.is_streaming": "yes"}, None),
        ({}, None),
    ],
)
def test_streaming_flag(attrs: dict[str, AttrValue], want: bool | None) -> None:
    assert streaming(attrs) is want


def test_non_streaming_call_is_its_duration_with_streaming_false() -> None:
    _, out = _map(_llm({"gen_ai.is_streaming": False}))
    (ttft,) = _events(out, "llm_ttft")
    (first,) = _events(out, "first_token")
    assert ttft["duration_ms"] == pytest.approx(1_600.0) and ttft["attrs"]["streaming"] is False
    assert first["ts_ms"] == pytest.approx(T0 / MS + 2_000.0)
    assert "streaming" not in first["attrs"]


def test_streaming_call_without_a_first_chunk_is_llm_unmeasured_and_counted_per_scope() -> None:
    a = _span(
        "0c" * 8, 400.0, 1_200.0, {"gen_ai.operation.name": "chat", "gen_ai.is_streaming": True}, scope=("x", "1")
    )
    b = _span("0d" * 8, 1_300.0, 2_000.0, {"gen_ai.operation.name": "chat"}, scope=("y", "2"))
    asm, out = _map(a, b)
    assert not [o for o in out if isinstance(o, DeadLetter)]
    unmeasured = _events(out, "llm_unmeasured")
    assert [(e["event_id"], e["ts_ms"], e["duration_ms"]) for e in unmeasured] == [
        ("0c" * 8, T0 / MS + 400.0, 800.0),
        ("0d" * 8, T0 / MS + 1_300.0, 700.0),
    ]
    assert [e["attrs"] for e in unmeasured] == [
        {"scope_name": "x", "scope_version": "1", "streaming": True, "trace_id": TRACE},
        {"scope_name": "y", "scope_version": "2", "trace_id": TRACE},  # a span that says nothing of streaming
    ]
    assert asm.counters.no_first_chunk == {("x", "1"): 1, ("y", "2"): 1}
    assert asm.counters.spans["stage"] == 3 and asm.counters.spans["dead_letter"] == 0  # the root too
    assert not _events(out, "first_token") and not _events(out, "llm_ttft")
    # prompt assembly is still derived up to the (first) LLM span: nothing here retrieved before it
    assert not _events(out, "prompt_assemble")


def test_two_unmeasured_llm_spans_of_one_call_count_once_as_the_inner() -> None:
    """A framework's LLM span around its client's, neither telling a first chunk (LangChain's OpenInference spans
    with OpenTelemetry's openai-v2): one call, one ``llm_unmeasured`` (streams/core/otlp_nesting.py)."""
    outer = _span("0c" * 8, 400.0, 2_000.0, {"gen_ai.operation.name": "chat", "gen_ai.is_streaming": True})
    inner = _span("0d" * 8, 500.0, 1_900.0, {"gen_ai.operation.name": "chat"}, parent=ROOT)
    asm, out = _map(outer, inner)
    assert [e["event_id"] for e in _events(out, "llm_unmeasured")] == ["0d" * 8]
    assert asm.counters.spans["nested"] == 1 and sum(asm.counters.no_first_chunk.values()) == 1


def test_an_unmeasured_call_keeps_its_tokens_and_model() -> None:
    attrs: dict[str, AttrValue] = {"gen_ai.usage.input_tokens": 812, "gen_ai.request.model": "gpt-4o-mini"}
    _, out = _map(_llm(attrs))
    (unmeasured,) = _events(out, "llm_unmeasured")
    assert unmeasured["attrs"]["prompt_tokens"] == 812 and unmeasured["route"] == "gpt-4o-mini"


def test_a_non_streaming_call_without_a_first_chunk_is_measured() -> None:
    _, out = _map(_llm({"gen_ai.is_streaming": False}))
    assert not _events(out, "llm_unmeasured")
    (ttft,) = _events(out, "llm_ttft")
    assert ttft["duration_ms"] == pytest.approx(1_600.0) and ttft["attrs"]["streaming"] is False


def test_a_vercel_stream_call_is_an_llm_span() -> None:
    attrs: dict[str, AttrValue] = {"ai.operationId": "ai.streamText.doStream", "ai.response.msToFirstChunk": 410.0}
    assert _ttft(_span("0c" * 8, 400.0, 2_000.0, attrs)) == pytest.approx(410.0)


@pytest.mark.parametrize(
    ("attrs", "want"),
    [
        ({"gen_ai.usage.input_tokens": 812, "gen_ai.usage.cache_read.input_tokens": 512}, (812, 512)),
        ({"gen_ai.usage.input_tokens": 812, "gen_ai.usage.cache_read_input_tokens": 256}, (812, 256)),
        ({"gen_ai.usage.prompt_tokens": 700, "gen_ai.usage.cached_tokens": 128}, (700, 128)),
        ({"llm.token_count.prompt": 900, "llm.token_count.prompt_details.cache_read": 640}, (900, 640)),
        ({"llm.token_count.prompt": 900.0}, (900, None)),  # a whole double
        ({"llm.token_count.prompt": 900.5, "gen_ai.usage.cached_tokens": -1}, (None, None)),
        ({"gen_ai.usage.input_tokens": math.nan, "llm.token_count.prompt": 5}, (5, None)),
        # A prompt of 0 tokens is an unknown usage (Spring AI 1.1's streams, OpenAI Agents'); 0 cached is a count.
        ({"gen_ai.usage.input_tokens": "0", "gen_ai.usage.cache_read.input_tokens": 0}, (None, 0)),
        ({"gen_ai.usage.input_tokens": 0, "llm.token_count.prompt": 812}, (812, None)),
    ],
)
def test_token_counts_in_either_spelling(attrs: dict[str, AttrValue], want: tuple[int | None, int | None]) -> None:
    got = token_attrs(attrs)
    assert (got.get("prompt_tokens"), got.get("cached_tokens")) == want


def test_token_counts_are_read_from_llm_spans_only() -> None:
    retrieval = _span("0a" * 8, 10.0, 300.0, {"gen_ai.operation.name": "retrieval"})
    embed = _span(
        "0b" * 8, 20.0, 60.0, {"gen_ai.operation.name": "embeddings", "gen_ai.usage.input_tokens": 8}, parent="0a" * 8
    )
    llm = _llm({"gen_ai.usage.input_tokens": 812, "gen_ai.response.time_to_first_chunk": 0.2})
    _, out = _map(retrieval, embed, llm)
    (recall,) = _events(out, "vector_recall")
    assert "prompt_tokens" not in recall["attrs"]
    assert _events(out, "llm_ttft")[0]["attrs"]["prompt_tokens"] == 812


@pytest.mark.parametrize(
    ("attrs", "want"),
    [
        ({"openinference.span.kind": "RETRIEVER"}, "retrieval"),
        ({"openinference.span.kind": "RERANKER"}, "rerank"),
        ({"openinference.span.kind": "PROMPT"}, "prompt_assemble"),
        ({"openinference.span.kind": "EMBEDDING"}, EMBEDDING),
        ({"openinference.span.kind": "LLM"}, "llm_ttft"),
        ({"openinference.span.kind": "CHAIN"}, None),
        ({"gen_ai.operation.name": "retrieval"}, "retrieval"),
        ({"gen_ai.operation.name": "embeddings"}, EMBEDDING),
        ({"gen_ai.operation.name": "chat"}, "llm_ttft"),
        ({"gen_ai.operation.name": "execute_tool"}, TOOL_CALL),  # held, never a stage: it tells an agent step
        ({"ttft.stage": "prompt_assemble", "openinference.span.kind": "LLM"}, "prompt_assemble"),
    ],
)
def test_stage_of_each_convention(attrs: dict[str, AttrValue], want: str | None) -> None:
    assert span_stage(attrs) == want


def test_embeddings_inside_a_gen_ai_retrieval_is_vector_recall_and_outside_it_no_stage() -> None:
    retrieval = _span("0a" * 8, 10.0, 300.0, {"gen_ai.operation.name": "retrieval"})
    inside = _span("0b" * 8, 20.0, 60.0, {"gen_ai.operation.name": "embeddings"}, parent="0a" * 8)
    outside = _span("0e" * 8, 70.0, 90.0, {"gen_ai.operation.name": "embeddings"})
    _, out = _map(retrieval, inside, outside, _llm(events=(("gen_ai.first_chunk", 700.0),)))
    assert [e["event_id"] for e in _events(out, "vector_recall")] == ["0b" * 8]
    assert [e["duration_ms"] for e in _events(out, "retrieval")] == [pytest.approx(290.0)]


def test_model_names_the_route_from_llm_spans_only() -> None:
    embed = _span("0b" * 8, 20.0, 60.0, {"gen_ai.operation.name": "embeddings", "gen_ai.request.model": "embedder"})
    llm = _llm({"llm.model_name": "gpt-4o-mini", "gen_ai.response.time_to_first_chunk": 0.2})
    _, out = _map(embed, llm)
    (start,) = _events(out, "request_start")
    assert start["route"] == "gpt-4o-mini"


def _prompt(*spans: OtlpSpan) -> list[dict[str, Any]]:
    return _events(_map(*spans)[1], "prompt_assemble")


def test_prompt_assembly_is_derived_from_the_last_retrieval_or_rerank_end_to_the_llm_start() -> None:
    first = _span("0a" * 8, 10.0, 100.0, {"openinference.span.kind": "RETRIEVER"})
    second = _span("0b" * 8, 110.0, 300.0, {"openinference.span.kind": "RETRIEVER"})
    rerank = _span("0e" * 8, 250.0, 330.0, {"openinference.span.kind": "RERANKER"}, parent="0b" * 8)
    llm = _llm(events=(("First Token Stream Event", 700.0),))
    (prompt,) = _prompt(first, second, rerank, llm)
    assert prompt["ts_ms"] == pytest.approx(T0 / MS + 330.0)
    assert prompt["duration_ms"] == pytest.approx(70.0)
    assert prompt["attrs"] == {"derived": True, "trace_id": TRACE}
    assert prompt["event_id"] == "0c" * 8 + "/prompt_assemble"


def test_a_prompt_span_or_ttft_stage_is_used_and_nothing_derived() -> None:
    retrieval = _span("0a" * 8, 10.0, 300.0, {"openinference.span.kind": "RETRIEVER"})
    llm = _llm(events=(("gen_ai.first_chunk", 700.0),))
    for attrs in ({"openinference.span.kind": "PROMPT"}, {"ttft.stage": "prompt_assemble"}):
        (prompt,) = _prompt(retrieval, _span("0f" * 8, 320.0, 380.0, attrs), llm)
        assert prompt["event_id"] == "0f" * 8 and prompt["duration_ms"] == pytest.approx(60.0)
        assert "derived" not in prompt["attrs"]


def test_no_prompt_assembly_is_derived_without_a_retrieval_before_the_llm_span() -> None:
    assert _prompt(_llm(events=(("gen_ai.first_chunk", 700.0),))) == []


def test_a_trace_with_a_root_retrieval_and_a_streaming_llm_span_has_every_required_stage() -> None:
    retrieval = _span("0a" * 8, 10.0, 300.0, {"gen_ai.operation.name": "retrieval"})
    _, out = _map(retrieval, _llm({"gen_ai.is_streaming": True}, (("gen_ai.content.completion.chunk", 700.0),)))
    stages = {orjson.loads(o.value)["stage"] for o in out if isinstance(o, ForwardedEvent)}
    assert stages == {"request_start", "retrieval", "prompt_assemble", "llm_ttft", "first_token"}
    assert not [o for o in out if isinstance(o, DeadLetter)]


def test_scopes_counted_apart_are_bounded() -> None:
    asm = TraceAssembler(OtlpConfig(), JoinConfig(), CapsConfig(), "otlp_spans")
    for i in range(MAX_SCOPES + 5):
        asm.counters.count_no_first_chunk(f"lib-{i}", "1")
    assert len(asm.counters.no_first_chunk) == MAX_SCOPES + 1
    assert asm.counters.no_first_chunk[OTHER_SCOPE] == 5


# --- the derived prompt assembly when the retrieval span comes after the trace was resolved ---------------------

RETRIEVER = {"openinference.span.kind": "RETRIEVER"}


def _late_trace(asm: TraceAssembler | None = None) -> tuple[TraceAssembler, list[Output]]:
    """Root and LLM span in one message (the trace resolves without a retrieval before its LLM span)."""
    asm = asm or TraceAssembler(OtlpConfig(), JoinConfig(), CapsConfig(), "otlp_spans")
    return asm, asm.add_message([_llm(events=(("gen_ai.first_chunk", 700.0),)), _root()], 0, 0, NOW_MS)


def test_a_retrieval_span_after_the_root_still_derives_the_prompt_assembly_once() -> None:
    """A retrieval service whose export comes after the root's: the trace resolved with nothing retrieved before
    its LLM span, so no prompt assembly; the late retrieval spans bring it (from the latest of their ends)."""
    asm, first = _late_trace()
    assert _events(first, "prompt_assemble") == []
    spans = [_span("0a" * 8, 10.0, 150.0, RETRIEVER), _span("0b" * 8, 160.0, 320.0, RETRIEVER)]
    later = asm.add_message(spans, 0, 1, NOW_MS)
    (prompt,) = _events(later, "prompt_assemble")
    assert prompt["ts_ms"] == pytest.approx(T0 / MS + 320.0) and prompt["duration_ms"] == pytest.approx(80.0)
    assert prompt["attrs"] == {"derived": True, "trace_id": TRACE}
    assert prompt["event_id"] == "0c" * 8 + "/prompt_assemble"
    assert prompt["tenant_id"] == "acme" and len(_events(later, "retrieval")) == 2
    # A replay of that message, or another retrieval later still, derives nothing more.
    assert _events(asm.add_message(spans, 0, 1, NOW_MS), "prompt_assemble") == []
    assert _events(asm.add_message([_span("0d" * 8, 330.0, 390.0, RETRIEVER)], 0, 2, NOW_MS), "prompt_assemble") == []


def test_the_pending_prompt_assembly_survives_a_restart() -> None:
    asm, _ = _late_trace()
    states = asm.dirty()
    restarted = TraceAssembler(OtlpConfig(), JoinConfig(), CapsConfig(), "otlp_spans")
    for key, (partition, packed) in states.items():
        assert packed is not None
        restarted.restore(key, packed, partition)
    later = restarted.add_message([_span("0a" * 8, 10.0, 300.0, RETRIEVER)], 0, 1, NOW_MS)
    (prompt,) = _events(later, "prompt_assemble")
    assert prompt["duration_ms"] == pytest.approx(100.0)


def test_a_late_prompt_span_or_a_retrieval_after_the_llm_start_derives_nothing() -> None:
    asm, _ = _late_trace()
    after_llm = asm.add_message([_span("0a" * 8, 10.0, 450.0, RETRIEVER)], 0, 1, NOW_MS)
    assert _events(after_llm, "prompt_assemble") == []  # ended after the LLM span started
    prompt_span = _span("0f" * 8, 320.0, 380.0, {"openinference.span.kind": "PROMPT"})
    with_prompt = asm.add_message([prompt_span, _span("0b" * 8, 10.0, 300.0, RETRIEVER)], 0, 2, NOW_MS)
    (prompt,) = _events(with_prompt, "prompt_assemble")  # the span's own, nothing derived
    assert prompt["event_id"] == "0f" * 8 and "derived" not in prompt["attrs"]


# --- the derived prompt assembly when the root resolved its trace alone --------------------------------------------


def _root_alone(asm: TraceAssembler | None = None) -> TraceAssembler:
    """The root in a message of its own, read first: CI, the Collector without ``partition_traces_by_id`` put a
    trace's retrieval and LLM spans in another message on another partition, read after it."""
    asm = asm or TraceAssembler(OtlpConfig(), JoinConfig(), CapsConfig(), "otlp_spans")
    assert asm.add_message([_root()], 0, 0, NOW_MS) == []  # no stage span yet: the root waits
    return asm


def _retrieval() -> OtlpSpan:
    return _span("0a" * 8, 10.0, 300.0, RETRIEVER)


def _first_chunk_llm() -> OtlpSpan:
    return _llm(events=(("gen_ai.first_chunk", 700.0),))


def _restarted(asm: TraceAssembler) -> TraceAssembler:
    restarted = TraceAssembler(OtlpConfig(), JoinConfig(), CapsConfig(), "otlp_spans")
    for key, (partition, packed) in asm.dirty().items():
        assert packed is not None
        restarted.restore(key, packed, partition)
    return restarted


@pytest.mark.parametrize("order", ["retrieval-llm", "llm-retrieval"])
def test_retrieval_and_llm_after_a_root_that_resolved_alone_derive_the_prompt_assembly(order: str) -> None:
    """CI: one request of 200 stored ``missing_stage`` (no prompt_assemble): its root resolved the trace alone,
    its retrieval and LLM spans came after, in one message, and nothing derived the prompt assembly."""
    asm = _root_alone()
    spans = [_retrieval(), _first_chunk_llm()]
    out = asm.add_message(spans if order == "retrieval-llm" else spans[::-1], 0, 1, NOW_MS)
    (prompt,) = _events(out, "prompt_assemble")
    assert prompt["ts_ms"] == pytest.approx(T0 / MS + 300.0) and prompt["duration_ms"] == pytest.approx(100.0)
    assert prompt["attrs"] == {"derived": True, "trace_id": TRACE}
    assert [len(_events(out, s)) for s in ("request_start", "retrieval", "llm_ttft", "first_token")] == [1, 1, 1, 1]


@pytest.mark.parametrize("order", ["retrieval-llm", "llm-retrieval"])
def test_retrieval_and_llm_in_two_later_messages_derive_it_once_across_a_restart(order: str) -> None:
    asm = _root_alone()
    first, second = (
        (_retrieval(), _first_chunk_llm()) if order == "retrieval-llm" else (_first_chunk_llm(), _retrieval())
    )
    assert _events(asm.add_message([first], 0, 1, NOW_MS), "prompt_assemble") == []
    asm = _restarted(asm)
    (prompt,) = _events(asm.add_message([second], 0, 2, NOW_MS), "prompt_assemble")
    assert prompt["duration_ms"] == pytest.approx(100.0)
    assert _events(asm.add_message([first, second], 0, 1, NOW_MS), "prompt_assemble") == []  # replayed: once


def test_a_prompt_span_after_a_root_that_resolved_alone_is_the_prompt_assembly() -> None:
    asm = _root_alone()
    prompt_span = _span("0f" * 8, 320.0, 380.0, {"openinference.span.kind": "PROMPT"})
    out = asm.add_message([_retrieval(), prompt_span], 0, 1, NOW_MS)
    out += asm.add_message([_first_chunk_llm()], 0, 2, NOW_MS)
    (prompt,) = _events(out, "prompt_assemble")
    assert prompt["event_id"] == "0f" * 8 and "derived" not in prompt["attrs"]


def test_nothing_is_derived_to_an_llm_span_that_started_before_the_late_retrieval_ended() -> None:
    asm = _root_alone()
    out = asm.add_message([_first_chunk_llm(), _span("0a" * 8, 10.0, 450.0, RETRIEVER)], 0, 1, NOW_MS)
    assert _events(out, "prompt_assemble") == [] and len(_events(out, "llm_ttft")) == 1


def _splits(spans: list[OtlpSpan]) -> list[list[list[OtlpSpan]]]:
    """Every way to send ``spans`` as messages: each order of the spans, cut into consecutive messages anywhere."""
    out = []
    for order in itertools.permutations(spans):
        for cuts in itertools.product((False, True), repeat=len(spans) - 1):
            messages, current = [], [order[0]]
            for span, cut in zip(order[1:], cuts, strict=True):
                if cut:
                    messages.append(current)
                    current = []
                current.append(span)
            out.append([*messages, current])
    return out


def test_a_root_retrieval_and_llm_trace_gives_the_same_events_however_its_spans_are_split_and_ordered() -> None:
    """The OpenTelemetry SDK service of the Collector tests (root, retrieval, LLM span; prompt assembly derived),
    its spans in every split into messages and every order of them, as the Collector without
    ``partition_traces_by_id`` may deliver them: always the same events, the derived prompt assembly included."""
    spans = [_root(), _retrieval(), _first_chunk_llm()]
    whole = TraceAssembler(OtlpConfig(), JoinConfig(), CapsConfig(), "otlp_spans").add_message(spans, 0, 0, NOW_MS)
    expected = sorted((orjson.loads(o.value) for o in whole if isinstance(o, ForwardedEvent)), key=orjson.dumps)
    assert [e["stage"] for e in expected].count("prompt_assemble") == 1
    splits = _splits(spans)
    assert len(splits) == 24  # 3! orders, each cut into messages in 2^2 ways
    for messages in splits:
        asm = TraceAssembler(OtlpConfig(), JoinConfig(), CapsConfig(), "otlp_spans")
        out = [o for offset, m in enumerate(messages) for o in asm.add_message(m, 0, offset, NOW_MS)]
        out += asm.advance(0, NOW_MS + JoinConfig().request_timeout_ms + 60_000)
        got = sorted((orjson.loads(o.value) for o in out if isinstance(o, ForwardedEvent)), key=orjson.dumps)
        assert got == expected, [[s.span_id for s in m] for m in messages]


def test_a_state_written_before_awaits_llm_still_derives_from_its_retrieval() -> None:
    """Trace states written before ``awaits_llm`` (21 elements): one resolved with a retrieval (``retrieved_ns``)
    still waits for its LLM span, as before; one resolved alone does not (the old behaviour, nothing invented)."""
    from streams.core.otlp_state import TraceState

    for first, waits in (([_retrieval(), _root()], True), ([_root()], False)):
        asm = TraceAssembler(OtlpConfig(), JoinConfig(), CapsConfig(), "otlp_spans")
        asm.add_message(first, 0, 0, NOW_MS)
        ((key, (partition, packed)),) = asm.dirty().items()
        assert packed is not None
        old = orjson.dumps(orjson.loads(packed)[:21])
        assert TraceState.unpack(old, partition).awaits_llm is waits
        restarted = TraceAssembler(OtlpConfig(), JoinConfig(), CapsConfig(), "otlp_spans")
        restarted.restore(key, old, partition)
        assert len(_events(restarted.add_message([_first_chunk_llm()], 0, 1, NOW_MS), "prompt_assemble")) == waits
