"""Spring Boot 4's OpenTelemetry starter and OpenTelemetry's Java agent together, on the Spring AI 2.0 service of
test_otlp_spring_ai.py (tests/data/otel_instrumentations/capture_java.py, set-up ``spring_ai_agent``: the agent
2.31.1 exports its spans over OTLP/HTTP, the starter's go to the service's file; merged per trace, as a Collector
gets both). Spring Boot's documentation advises one or the other; together, captured 2026-12-06, no context reaches
any span: every span (Spring AI's, the service's own ``POST /ask``, the agent's OkHttp client spans) is the root of a
trace of its own.

Each retrieval is then a request of its own (``timed_out``) and each chat call another (``missing_stage`` or
``no_first_chunk``), measured from its own start. Nothing in a lone span tells that it lost its request, so the
pipeline stores what it gets; ``ttft otel check`` names it ("a trace that starts at a stage span") with the fix.
"""

from __future__ import annotations

import json

import pytest

from schemas.otlp import OtlpSpan
from streams.cli.otel_check import report_lines
from streams.core.otlp_check import FIXES, LONE_SPAN, check_traces
from streams.core.otlp_traces import TraceAssembler
from streams.settings import CapsConfig, JoinConfig, OtlpConfig
from tests.support.captured_otlp import DATA, captured, read_capture, stored_record

AGENT = "java_spring_ai_spring_ai_agent"


def test_every_span_is_the_root_of_a_trace_of_its_own() -> None:
    spans = read_capture(AGENT)
    doc = json.loads((DATA / f"{AGENT}.json").read_text())
    assert len(spans) == len({s.trace_id for s in spans}) >= 40
    assert all(s.is_root for s in spans)
    scopes = {s.scope_name for s in spans}
    assert {"org.springframework.boot", "io.opentelemetry.okhttp-3.0", "rag-api"} <= scopes
    assert "opentelemetry-javaagent 2.31.1" in doc["versions"]["spring"]
    for _, trace in captured(AGENT).values():  # the service's request traces: its root span alone
        assert [s.name for s in trace] == ["POST /ask"]


def test_otel_check_names_the_lone_stage_spans_first_with_the_fix() -> None:
    reports, findings = check_traces(read_capture(AGENT))
    lone = [f for f in findings if LONE_SPAN in f.missing]
    assert len(lone) == 9  # per request: the retrieval, its embedding call, the chat call
    assert all(f.missing[0] == LONE_SPAN for f in lone)
    text = "\n".join(report_lines("capture", 44, reports, findings))
    assert f"missing          {LONE_SPAN} (3 traces" in text
    assert "either the Java agent or Spring Boot's OpenTelemetry starter, not both" in FIXES[LONE_SPAN]


def test_whole_traces_have_no_lone_span_item() -> None:
    for name in ("java_spring_ai_spring_ai", "java_spring_ai11_spring_ai11", "java_openai_agent"):
        _, findings = check_traces(read_capture(name))
        assert not [f for f in findings if LONE_SPAN in f.missing], name


def test_otel_check_takes_the_chat_clients_stream_flag_as_the_assembler_does() -> None:
    """Spring AI 1.1's chat span says nothing about streaming; its ChatClient span does: no 'stream flag' advice."""
    _, findings = check_traces(read_capture("java_spring_ai11_spring_ai11"))
    assert sorted(f.status for f in findings) == ["complete", "no_first_chunk", "no_first_chunk"]
    assert all("stream flag" not in f.missing for f in findings)


def test_without_reactors_context_propagation_a_streams_search_leaves_the_request() -> None:
    """``spring.reactor.context-propagation`` at Boot's default (set-up ``spring_ai_noprop``): a stream's vector store
    search (its embedding call and HTTP client span under it) is a trace of its own. The worker stores it as a
    retrieval-only request (``timed_out``) and the request without its retrieval; the check names the search's trace,
    not the request's."""
    name = "java_spring_ai_spring_ai_noprop"
    cases = captured(name)
    for case in ("stream", "stream2"):
        _, spans = cases[case]
        assert not [s for s in spans if s.attributes.get("spring.ai.kind") == "vector_store"]
        record, _ = stored_record(spans)
        assert record["status"] == "no_first_chunk" and record["retrieval_ms"] is None
    _, plain = cases["non_stream"]  # a plain call keeps its context
    assert stored_record(plain)[0]["retrieval_ms"] is not None
    _, findings = check_traces(read_capture(name))
    cut = [f for f in findings if LONE_SPAN in f.missing]
    assert len(cut) == 2 and all(f.status == "timed_out" for f in cut)
    searches = {
        s.trace_id for s in read_capture(name) if s.attributes.get("spring.ai.kind") == "vector_store" and s.is_root
    }
    assert {f.trace_id for f in cut} == searches


def test_litellms_callback_span_written_outside_the_stream_is_named() -> None:
    _, findings = check_traces(read_capture("litellm_otel_semconv"))
    (cut,) = [f for f in findings if LONE_SPAN in f.missing]
    assert cut.trace_id == "f6adc03cee2467b8f6d0af1c4c8016c3"  # the json's other trace, "during: stream"


@pytest.mark.parametrize(
    ("name", "cut_off"),
    [(AGENT, 9), ("java_spring_ai_spring_ai_noprop", 2), ("litellm_otel_semconv", 1), ("java_spring_ai_spring_ai", 0)],
)
def test_the_worker_counts_the_traces_the_check_names(name: str, cut_off: int) -> None:
    """``ttft_otlp_cut_off_traces``: what the check names, counted by the worker's assembler as it resolves traces
    (on-call sees it without running the check)."""
    asm = TraceAssembler(OtlpConfig(), JoinConfig(), CapsConfig(), "otlp_spans")
    spans = read_capture(name)
    now = max(s.end_ns for s in spans) / 1e6 + 1.0
    by_trace: dict[str, list[OtlpSpan]] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id, []).append(span)
    for offset, trace in enumerate(by_trace.values()):
        asm.add_message(sorted(trace, key=lambda s: (s.is_root, s.end_ns, s.span_id)), 0, offset, now)
    asm.advance(0, now + 3_600_000)
    assert asm.counters.cut_off == cut_off
