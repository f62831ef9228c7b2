"""A LlamaIndex query engine traced by OpenInference's LlamaIndex and OpenAI instrumentors, as OpenInference's
guides set them up (tests/data/otel_instrumentations/capture_llamaindex.py: how, and with which versions).

What the spans say: LlamaIndex's streaming LLM span (``OpenAI.stream_chat``) is ended when the stream is handed
back, before its first chunk, whose event it adds afterwards; ``OpenAI.stream`` is its parent; the client's
``ChatCompletion`` is a sibling that starts after both ended (the stream is lazy); retrieval and embedding
spans come in nests of two and three. Before, the first-chunk event was ignored as outside its span and the
nests were summed as retries: a streaming request's TTFT was stored as 72.8 ms for 203 ms, with the LlamaIndex
instrumentor alone as 50.8 ms for 174 ms (its ``llm_ttft`` 1.5 ms), both ``complete``; ``vector_recall`` was three
times its time, a non-streaming ``llm_ttft`` 468.7 ms for 154.5, ``other_ms`` down to -357 ms."""

from __future__ import annotations

import pytest

from streams.core.otlp_check import check_traces
from tests.support.captured_otlp import Capture, captured, first_event_ms, span_ms, stored_record

STUB_FIRST_CHUNK_MS, STUB_ANSWER_MS = 120.0, 150.0
#: What the instrumentation and the stub's own scheduling may add to its delays (same process, same clock).
SLACK_MS = 25.0


@pytest.fixture(scope="module")
def traces() -> Capture:
    return captured("llamaindex")


def _client_ttft_ms(truth: dict[str, int]) -> float:
    return (truth["first_chunk_ns"] - truth["called_ns"]) / 1e6


def test_the_capture_has_what_this_is_about(traces: Capture) -> None:
    _, spans = traces["stream"]
    by_name = {s.name: s for s in spans}
    stream_chat, client = by_name["OpenAI.stream_chat"], by_name["ChatCompletion"]
    (event,) = stream_chat.events
    assert event.name == "First Token Stream Event" and event.time_ns > stream_chat.end_ns
    assert stream_chat.parent_span_id == by_name["OpenAI.stream"].span_id
    assert client.start_ns > stream_chat.end_ns and client.parent_span_id != stream_chat.span_id


def test_streaming_both_instrumented_is_the_client_call_once(traces: Capture) -> None:
    truth, spans = traces["stream"]
    record, asm = stored_record(spans)
    assert record["status"] == "complete" and record["llm_unmeasured_ms"] is None
    assert record["llm_ttft_ms"] == pytest.approx(first_event_ms(spans, "ChatCompletion"))
    assert STUB_FIRST_CHUNK_MS <= record["llm_ttft_ms"] <= STUB_FIRST_CHUNK_MS + SLACK_MS
    assert abs(record["ttft_ms"] - _client_ttft_ms(truth)) < SLACK_MS
    assert record["retrieval_ms"] == pytest.approx(span_ms(spans, "VectorIndexRetriever.retrieve"))
    assert record["vector_recall_ms"] == pytest.approx(span_ms(spans, "OpenAIEmbedding.get_query_embedding"))
    assert 0.0 <= record["other_ms"] < SLACK_MS
    # OpenAI.stream, OpenAI.stream_chat, VectorIndexRetriever._retrieve, two inner embedding spans
    assert asm.counters.spans["nested"] == 5


def test_llamaindex_alone_measures_from_its_late_first_chunk_event(traces: Capture) -> None:
    truth, spans = traces["llamaindex_only"]
    record, asm = stored_record(spans)
    assert record["status"] == "complete"
    assert record["llm_ttft_ms"] == pytest.approx(first_event_ms(spans, "OpenAI.stream_chat"))
    assert STUB_FIRST_CHUNK_MS <= record["llm_ttft_ms"] <= STUB_FIRST_CHUNK_MS + SLACK_MS
    assert abs(record["ttft_ms"] - _client_ttft_ms(truth)) < SLACK_MS
    assert not asm.counters.no_first_chunk


def test_non_streaming_is_the_innermost_of_three_nested_llm_spans(traces: Capture) -> None:
    _, spans = traces["non_stream"]
    record, _ = stored_record(spans)
    assert record["status"] == "complete"
    assert record["llm_ttft_ms"] == pytest.approx(span_ms(spans, "ChatCompletion"))
    assert STUB_ANSWER_MS <= record["llm_ttft_ms"] <= STUB_ANSWER_MS + SLACK_MS
    assert 0.0 <= record["other_ms"] < SLACK_MS


def test_otel_check_finds_every_trace_complete(traces: Capture) -> None:
    spans = [s for _, trace in traces.values() for s in trace]
    reports, findings = check_traces(spans)
    assert [f.status for f in findings] == ["complete"] * 3
    assert not any(r.missing for r in reports)
    nested = {what for r in reports for what in r.nested}
    assert (
        "'OpenAI.stream' (openinference.span.kind = LLM) around 'OpenAI.stream_chat': one llm_ttft, counted once"
        in nested
    )
