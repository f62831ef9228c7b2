"""A LangChain RAG chain traced by OpenInference's LangChain and OpenAI instrumentors, as Phoenix's guides set
them up (tests/data/otel_instrumentations/capture_langchain.py: how the spans were made, with which versions).

Both instrumentors trace each ``ChatOpenAI`` call (LangChain's ``LLM`` span, no first chunk, around the client's
``ChatCompletion``), and LangChain's ``EnsembleRetriever`` is a ``RETRIEVER`` span around its two retrievers.
Before streams/core/otlp_nesting.py, each was summed as a retry: retrieval twice its time, the non-streaming
call's ``llm_ttft`` twice, ``other_ms`` negative, and ``llm_unmeasured_ms`` set on requests whose first chunk was
measured. OpenLLMetry's LangChain instrumentation (``langchain_openllmetry``) named its retrievers in a way not
read before (``vector_db_retrieve``: ``missing_stage``) and tells no first chunk without ttft-emit's helper."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from streams.cli.otel_check import report_lines
from streams.core.otlp_check import check_traces
from tests.support.captured_otlp import Capture, captured, span_ms, stored_record

STUB_FIRST_CHUNK_MS, STUB_ANSWER_MS = 120.0, 150.0
#: What the instrumentation and the stub's own scheduling may add to its delays (same process, same clock).
SLACK_MS = 25.0
_record, _ms = stored_record, span_ms


@pytest.fixture(scope="module")
def traces() -> Capture:
    return captured("langchain")


def test_the_capture_has_the_nests_this_is_about(traces: dict[str, Any]) -> None:
    _, spans = traces["stream"]
    names = sorted(s.name for s in spans if s.attributes.get("openinference.span.kind") in ("LLM", "RETRIEVER"))
    assert names == ["BM25Retriever", "ChatCompletion", "ChatOpenAI", "EnsembleRetriever", "VectorStoreRetriever"]
    by_name = {s.name: s for s in spans}
    wrapper, call = by_name["ChatOpenAI"], by_name["ChatCompletion"]
    assert wrapper.start_ns <= call.start_ns and call.end_ns <= wrapper.end_ns
    assert call.parent_span_id != wrapper.span_id  # not linked: only time says one holds the other


def test_streaming_both_instrumented_counts_each_stage_once(traces: dict[str, Any]) -> None:
    truth, spans = traces["stream"]
    record, asm = _record(spans)
    assert record["status"] == "complete" and record["llm_unmeasured_ms"] is None
    assert record["retrieval_ms"] == pytest.approx(_ms(spans, "EnsembleRetriever"))
    assert STUB_FIRST_CHUNK_MS <= record["llm_ttft_ms"] <= STUB_FIRST_CHUNK_MS + SLACK_MS
    assert 0.0 <= record["other_ms"] < SLACK_MS
    client_ttft = (truth["first_chunk_ns"] - truth["called_ns"]) / 1e6
    assert abs(record["ttft_ms"] - client_ttft) < SLACK_MS
    assert asm.counters.spans["nested"] == 3  # ChatOpenAI, BM25Retriever, VectorStoreRetriever
    assert not asm.counters.no_first_chunk


def test_non_streaming_call_is_its_client_span_not_twice(traces: dict[str, Any]) -> None:
    _, spans = traces["non_stream"]
    record, _ = _record(spans)
    assert record["status"] == "complete"
    assert record["llm_ttft_ms"] == pytest.approx(_ms(spans, "ChatCompletion"))
    assert STUB_ANSWER_MS <= record["llm_ttft_ms"] <= STUB_ANSWER_MS + SLACK_MS
    assert record["other_ms"] >= 0.0


def test_langchain_alone_tells_no_first_chunk_and_check_says_what_to_add(traces: dict[str, Any]) -> None:
    _, spans = traces["langchain_only"]
    record, asm = _record(spans)
    assert record["status"] == "no_first_chunk"
    assert record["llm_unmeasured_ms"] == pytest.approx(_ms(spans, "ChatOpenAI"))
    assert record["retrieval_ms"] == pytest.approx(_ms(spans, "EnsembleRetriever"))
    assert set(asm.counters.no_first_chunk) == {("openinference.instrumentation.langchain", "0.1.80")}
    reports, _ = check_traces(spans)
    text = "\n".join(report_lines("langchain.otlp", len(spans), reports, []))
    assert "OpenAIInstrumentor beside the LangChainInstrumentor" in text


def test_otel_check_names_the_spans_counted_once(traces: dict[str, Any]) -> None:
    spans = [s for _, trace in traces.values() for s in trace]
    reports, findings = check_traces(spans)
    assert [f.status for f in findings] == ["complete", "complete", "no_first_chunk"]
    scope = next(r for r in reports if r.scope[0] == "openinference.instrumentation.openai")
    assert scope.complete == 2 and not scope.missing
    wrapper = "'ChatOpenAI' (openinference.span.kind = LLM) around 'ChatCompletion': one llm_ttft, counted once"
    assert scope.nested[wrapper] == 2
    lines = report_lines("langchain.otlp", len(spans), reports, findings)
    assert any("counted once     'BM25Retriever'" in line and "inside 'EnsembleRetriever'" in line for line in lines)
    assert orjson.loads(orjson.dumps(scope.to_json()))["counted_once"]


@pytest.fixture(scope="module")
def openllmetry() -> Capture:
    return captured("langchain_openllmetry")


def test_openllmetry_with_the_helper_is_complete_and_exact(openllmetry: Capture) -> None:
    """OpenLLMetry's LangChain instrumentation: retrievers are ``vector_db_retrieve`` operations, and its
    ``ChatOpenAI.chat`` span (not current, the client's span suppressed under it) gets the first chunk from
    ttft-emit's helper on the model's client."""
    truth, spans = openllmetry["stream"]
    record, asm = _record(spans)
    assert record["status"] == "complete" and record["llm_unmeasured_ms"] is None
    assert STUB_FIRST_CHUNK_MS <= record["llm_ttft_ms"] <= STUB_FIRST_CHUNK_MS + SLACK_MS
    client_ttft = (truth["first_chunk_ns"] - truth["called_ns"]) / 1e6
    assert abs(record["ttft_ms"] - client_ttft) < SLACK_MS
    assert record["retrieval_ms"] == pytest.approx(_ms(spans, "vector_db_retrieve EnsembleRetriever"))
    assert record["vector_recall_ms"] == pytest.approx(_ms(spans, "openai.embeddings"))
    assert asm.counters.spans["nested"] == 2  # the ensemble's two retrievers
    _, plain = openllmetry["non_stream"]
    record, _ = _record(plain)
    assert record["status"] == "complete" and record["llm_ttft_ms"] == pytest.approx(_ms(plain, "ChatOpenAI.chat"))


def test_openllmetry_without_the_helper_says_to_add_it(openllmetry: Capture) -> None:
    _, spans = openllmetry["no_helper"]
    record, _ = _record(spans)
    assert record["status"] == "no_first_chunk" and record["retrieval_ms"] is not None
    reports, _ = check_traces(spans)
    text = "\n".join(report_lines("langchain_openllmetry.otlp", len(spans), reports, []))
    assert "time_first_chunk(llm.root_client)" in text
