"""The Vercel AI SDK's own spans (``ai`` 6 with ``@ai-sdk/openai``, ``experimental_telemetry``), captured against the
stub by tests/data/otel_instrumentations/vercel/capture.mjs under Node: an outer ``ai.streamText`` span around the
provider call ``ai.streamText.doStream``, whose ``ai.response.msToFirstChunk`` tells the first chunk (also the event
``ai.stream.firstChunk``); ``ai.generateText.doGenerate`` for a plain call. OpenTelemetry JS stamps span starts in
whole milliseconds, so stage boundaries may be up to 1 ms off."""

from __future__ import annotations

import pytest

from schemas.otlp import OtlpSpan
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


@pytest.fixture(scope="module")
def tool_traces() -> Capture:
    """vercel_tools/capture_tools.mjs: a tool loop (``stopWhen: stepCountIs(3)``), streamed and not, and a control."""
    return captured("vercel_tools")


def _turns(spans: list[OtlpSpan]) -> tuple[OtlpSpan, OtlpSpan, OtlpSpan]:
    calls = sorted((s for s in spans if s.name.endswith((".doStream", ".doGenerate"))), key=lambda s: s.start_ns)
    (tool,) = [s for s in spans if s.name == "ai.toolCall"]
    first, second = calls
    return first, tool, second


def test_the_tool_capture_has_what_this_is_about(tool_traces: Capture) -> None:
    """Streamed, the first turn's span holds the tool (the SDK runs it before it closes that turn), and the second
    turn seems to start before the first ended: OpenTelemetry JS starts spans in whole milliseconds."""
    first, tool, second = _turns(tool_traces["tool_stream"][1])
    assert first.attributes["ai.response.finishReason"] == "tool-calls"
    assert first.start_ns < tool.start_ns and tool.end_ns < first.end_ns
    assert 0 < first.end_ns - second.start_ns < JS_START_MS * 1e6
    first, tool, second = _turns(tool_traces["tool_non_stream"][1])
    assert first.end_ns <= tool.start_ns and tool.end_ns <= second.start_ns


@pytest.mark.parametrize("case", ["tool_stream", "tool_non_stream"])
def test_a_tool_loop_is_timed_to_the_answers_first_chunk(tool_traces: Capture, case: str) -> None:
    """Before the step rule allowed for whole-millisecond starts, the streamed loop was stored ``complete`` with its
    tool call's first chunk: 176.8 ms for the 490.6 the client saw, ``other_ms`` -132.2."""
    truth, spans = tool_traces[case]
    record, _ = stored_record(spans)
    first, tool, second = _turns(spans)
    assert record["status"] == "complete" and record["stage_repeats"] == {"llm_ttft": 1}
    seen = truth["first_chunk_ns"] if truth["streaming"] else truth["answered_ns"]
    assert record["ttft_ms"] == pytest.approx((int(seen) - int(truth["started_ns"])) / 1e6, abs=5.0)
    tool_ms = span_ms(spans, "ai.toolCall")
    held_ms = tool_ms if first.end_ns > tool.start_ns else 0.0  # streamed: the tool's time is not the model's
    answer_ms = second.attributes.get("ai.response.msToFirstChunk", (second.end_ns - second.start_ns) / 1e6)
    assert isinstance(answer_ms, float)
    assert record["llm_ttft_ms"] == pytest.approx((first.end_ns - first.start_ns) / 1e6 - held_ms + answer_ms, abs=0.01)
    assert tool_ms - JS_START_MS <= record["other_ms"] <= tool_ms + JS_START_MS + 1.0


def test_without_a_tool_the_streamed_answer_is_timed_as_before(tool_traces: Capture) -> None:
    truth, spans = tool_traces["stream"]
    record, _ = stored_record(spans)
    assert record["status"] == "complete" and record["stage_repeats"] == {}
    assert record["ttft_ms"] == pytest.approx(_client_ms(truth, "started_ns"), abs=5.0)
