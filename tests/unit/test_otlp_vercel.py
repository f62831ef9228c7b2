"""The Vercel AI SDK's own spans (``ai`` 6 with ``@ai-sdk/openai``, ``experimental_telemetry``), captured against the
stub by tests/data/otel_instrumentations/vercel/capture.mjs under Node: an outer ``ai.streamText`` span around the
provider call ``ai.streamText.doStream``, whose ``ai.response.msToFirstChunk`` tells the first chunk (also the event
``ai.stream.firstChunk``); ``ai.generateText.doGenerate`` for a plain call. OpenTelemetry JS stamps span starts in
whole milliseconds, so stage boundaries may be up to 1 ms off."""

from __future__ import annotations

import pytest

from tests.support.captured_otlp import Capture, captured, span_ms, stored_record

STUB_FIRST_CHUNK_MS, STUB_ANSWER_MS = 120.0, 150.0
#: The first (cold) call pays the SDK's and the connection's start-up (about 45 ms here).
COLD_SLACK_MS = 60.0
JS_START_MS = 1.0


@pytest.fixture(scope="module")
def traces() -> Capture:
    return captured("vercel")


def _client_ms(truth: dict[str, str], since: str) -> float:
    return (int(truth["first_chunk_ns"]) - int(truth[since])) / 1e6


@pytest.mark.parametrize("case", ["stream", "stream2"])
def test_streaming_calls_are_complete_from_ms_to_first_chunk(traces: Capture, case: str) -> None:
    truth, spans = traces[case]
    record, asm = stored_record(spans)
    (call,) = [s for s in spans if s.name == "ai.streamText.doStream"]
    assert record["status"] == "complete"
    assert record["llm_ttft_ms"] == pytest.approx(call.attributes["ai.response.msToFirstChunk"])
    assert STUB_FIRST_CHUNK_MS <= record["llm_ttft_ms"] <= STUB_FIRST_CHUNK_MS + COLD_SLACK_MS
    assert record["ttft_ms"] == pytest.approx(_client_ms(truth, "started_ns"), abs=5.0)  # the SDK sees it first
    assert record["retrieval_ms"] == pytest.approx(span_ms(spans, "retrieve"))
    assert record["prompt_assemble_ms"] is not None and -JS_START_MS <= record["other_ms"] <= JS_START_MS + 0.5
    assert (record["prompt_tokens"], record["cached_tokens"]) == (812, 512)  # ai.usage.*: not read before
    assert asm.counters.spans["nested"] == 0 and asm.counters.spans["not_stage"] == 1  # ai.streamText


def test_a_plain_call_is_its_provider_span(traces: Capture) -> None:
    _, spans = traces["non_stream"]
    record, _ = stored_record(spans)
    assert record["status"] == "complete"
    assert record["llm_ttft_ms"] == pytest.approx(span_ms(spans, "ai.generateText.doGenerate"))
    assert STUB_ANSWER_MS <= record["llm_ttft_ms"] <= STUB_ANSWER_MS + COLD_SLACK_MS
