"""An agent's tool-call turn is no answer: the request's first token is the answering call's first chunk.

An agent with tools calls the model, gets a tool call back (streamed: its first chunk is the tool call's), runs
the tool, and calls the model again for the answer the user reads. Before, the earliest first chunk of the
trace's LLM spans was the request's first token: a Pydantic AI agent's request was stored ``complete`` with a
TTFT of 212.1 ms where the user waited 442.3 ms, and ``other_ms`` came out negative (-129.0 ms). The turn that
asked for tools (its finish reason) and that another LLM call follows is now LLM time before the first token, all
of it; the answering call tells the first token.
"""

from __future__ import annotations

from typing import Any

import pytest

from schemas.otlp import AttrValue, OtlpSpan
from streams.core.otlp_check import check_traces
from streams.core.otlp_conventions import asked_for_tools
from streams.core.otlp_mapping import SpanNote, note_span
from tests.support.captured_otlp import stored_record

T0 = 1_764_000_000_000_000_000  # ns
MS = 1_000_000
TRACE = "7a" * 16
ROOT, RETRIEVAL, TURN_1, TOOL, TURN_2 = (f"{i:02x}" * 8 for i in range(1, 6))


def _span(span_id: str, name: str, start_ms: float, end_ms: float, parent: str = ROOT, **attrs: AttrValue) -> OtlpSpan:
    return OtlpSpan(
        trace_id=TRACE,
        span_id=span_id,
        parent_span_id=parent if span_id != ROOT else "",
        name=name,
        start_ns=T0 + round(start_ms * MS),
        end_ns=T0 + round(end_ms * MS),
        attributes={"tenant.id": "acme", "service.name": "rag", **attrs},
        scope_name="pydantic-ai",
        scope_version="2.78.0",
    )


def _turn(span_id: str, start_ms: float, end_ms: float, first_chunk_ms: float, finish: Any) -> OtlpSpan:
    return _span(
        span_id,
        "chat gpt-4o-mini",
        start_ms,
        end_ms,
        **{
            "gen_ai.operation.name": "chat",
            "gen_ai.request.stream": True,
            "gen_ai.response.time_to_first_chunk": first_chunk_ms / 1e3,
            "gen_ai.response.finish_reasons": finish,
        },
    )


def _agent_trace(first_finish: Any = ("tool_calls",), second: bool = True, tool: bool = True) -> list[OtlpSpan]:
    """Retrieval 0-50 ms; turn 1 80-210 ms (first chunk, the tool call, at +120); the tool 212-242 ms; turn 2
    245-490 ms (first text at +125 ms: 370 ms); the root ends at 495 ms."""
    spans = [
        _span(RETRIEVAL, "retrieval docs", 0.0, 50.0, **{"gen_ai.operation.name": "retrieval"}),
        _turn(TURN_1, 80.0, 210.0, 120.0, list(first_finish)),
    ]
    if tool:
        spans.append(
            _span(TOOL, "execute_tool lookup_capital", 212.0, 242.0, **{"gen_ai.operation.name": "execute_tool"})
        )
    if second:
        spans.append(_turn(TURN_2, 245.0, 490.0, 125.0, ["stop"]))
    return [*spans, _span(ROOT, "POST /ask", 0.0, 495.0)]


def test_the_first_token_is_the_answering_calls_first_chunk_not_the_tool_calls() -> None:
    record, _ = _stored(_agent_trace())
    assert record["status"] == "complete"
    assert record["ttft_ms"] == pytest.approx(370.0)  # before: 200.0, turn 1's tool call
    # Turn 1 whole (130 ms) and turn 2 to its first chunk (125 ms): the model's time before the first token.
    assert record["llm_ttft_ms"] == pytest.approx(255.0)
    assert record["stage_repeats"] == {"llm_ttft": 1}
    # The tool's 30 ms and the gaps: the unattributed rest, never negative.
    assert record["other_ms"] == pytest.approx(370.0 - 50.0 - 30.0 - 255.0)


def test_a_tool_call_turn_that_no_call_follows_is_the_answer() -> None:
    """Structured output returned as a tool call (Pydantic AI's ``final_result``): that turn is the answer."""
    record, _ = _stored(_agent_trace(second=False))
    assert record["status"] == "complete" and record["ttft_ms"] == pytest.approx(200.0)


def test_turns_that_end_with_text_and_no_tool_between_are_counted_as_before() -> None:
    """Two calls that both answered (a retry): the earliest first chunk is the first token, the calls summed."""
    record, _ = _stored(_agent_trace(first_finish=("stop",), tool=False))
    assert record["ttft_ms"] == pytest.approx(200.0) and record["llm_ttft_ms"] == pytest.approx(120.0 + 125.0)


@pytest.mark.parametrize(
    "tool_attrs",
    [
        {"gen_ai.operation.name": "execute_tool"},  # GenAI: Pydantic AI, openai-agents under OpenLLMetry
        {"openinference.span.kind": "TOOL"},  # OpenInference
        {"traceloop.span.kind": "tool"},  # OpenLLMetry's frameworks
        {"ai.operationId": "ai.toolCall"},  # Vercel AI SDK
    ],
)
def test_a_turn_a_tool_span_follows_is_a_step_whatever_its_finish_reason(tool_attrs: dict[str, AttrValue]) -> None:
    """Pydantic AI says ``stop`` for a Responses API turn that called a function; openai-v2 records no finish
    reason on a stream: the tool's span between the two calls tells the step."""
    spans = _agent_trace(first_finish=("stop",), tool=False)
    spans.insert(2, _span(TOOL, "lookup_capital", 212.0, 242.0, **tool_attrs))
    record, _ = _stored(spans)
    assert record["ttft_ms"] == pytest.approx(370.0) and record["llm_ttft_ms"] == pytest.approx(255.0)


@pytest.mark.parametrize(
    ("attrs", "asked"),
    [
        ({"gen_ai.response.finish_reasons": '["tool_call"]'}, True),  # an OTLP string array, as schemas.otlp keeps it
        ({"gen_ai.response.finish_reasons": ["tool_calls"]}, True),  # GenAI: openai-v2, Pydantic AI
        ({"gen_ai.response.finish_reasons": ("stop", "tool_calls")}, True),
        ({"gen_ai.response.finish_reasons": ["tool_use"]}, True),  # the anthropic SDK
        ({"llm.finish_reason": "tool_calls"}, True),  # OpenInference
        ({"gen_ai.completion.0.finish_reason": "tool_calls"}, True),  # OpenLLMetry
        ({"ai.response.finishReason": "tool-calls"}, True),  # Vercel AI SDK
        ({"anthropic.message.stop_reason": "tool_use"}, True),  # OpenLIT on Anthropic
        ({"gen_ai.response.finish_reasons": ["stop"]}, False),
        ({"gen_ai.response.finish_reasons": '["stop"]'}, False),
        ({"gen_ai.response.finish_reasons": "[not json"}, False),
        ({"gen_ai.response.finish_reason": "FinishReason.TOOL_CALLS"}, True),  # Semantic Kernel: its enum's name
        ({"gen_ai.response.finish_reason": "FinishReason.STOP"}, False),
        ({"llm.finish_reason": "end_turn"}, False),
        ({}, False),
    ],
)
def test_which_finish_reasons_ask_for_tools(attrs: dict[str, AttrValue], asked: bool) -> None:
    assert asked_for_tools(attrs) is asked


def test_the_tool_call_flag_survives_the_trace_state() -> None:
    note = note_span(_turn(TURN_1, 80.0, 210.0, 120.0, ["tool_calls"]), 0)
    assert note.tool_call and SpanNote.unpack(note.pack()) == note
    plain = note_span(_turn(TURN_2, 245.0, 490.0, 125.0, ["stop"]), 0)
    assert len(plain.pack()) == len(note.pack()) - 1  # no byte for the usual case


def test_check_reads_the_answering_calls_first_chunk() -> None:
    (report,), (finding,) = check_traces(_agent_trace())
    assert finding.status == "complete" and not finding.missing
    assert report.to_json()["complete"] == 1
    assert report.to_json()["llm_steps"] == {"calls": 1, "traces": 1}


def _stored(spans: list[OtlpSpan]) -> tuple[dict[str, Any], Any]:
    return stored_record(spans)


def test_the_genai_finish_reasons_array_is_read_from_otlp() -> None:
    """OTLP carries ``gen_ai.response.finish_reasons`` as an array value; scalars alone were kept before."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from schemas.otlp import parse_spans

    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = bytes.fromhex(TRACE), bytes.fromhex(TURN_1), "chat"
    span.start_time_unix_nano, span.end_time_unix_nano = T0, T0 + 130 * MS
    reasons = span.attributes.add(key="gen_ai.response.finish_reasons").value.array_value.values
    reasons.add(string_value="tool_calls")
    reasons.add(int_value=3)  # not a string: left out
    (decoded,) = parse_spans(request.SerializeToString(), "otlp_proto")
    assert decoded.attributes["gen_ai.response.finish_reasons"] == '["tool_calls"]'
    assert asked_for_tools(decoded.attributes)


def test_the_finish_reasons_array_is_read_from_otlp_json_too() -> None:
    """The Collector's Kafka exporter can write ``otlp_json``: the same array as ``arrayValue``, hex ids."""
    import orjson

    from schemas.otlp import parse_spans

    span = {
        "traceId": TRACE,
        "spanId": TURN_1,
        "name": "chat",
        "startTimeUnixNano": str(T0),
        "endTimeUnixNano": str(T0 + 130 * MS),
        "attributes": [
            {
                "key": "gen_ai.response.finish_reasons",
                "value": {"arrayValue": {"values": [{"stringValue": "tool_calls"}, {"intValue": "3"}]}},
            }
        ],
    }
    raw = orjson.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})
    (decoded,) = parse_spans(raw, "otlp_json")
    assert decoded.attributes["gen_ai.response.finish_reasons"] == '["tool_calls"]'
    assert asked_for_tools(decoded.attributes)


def test_a_question_condensed_by_a_model_before_the_retrieval_is_a_step() -> None:
    """Conversational RAG (LangChain's history-aware retriever, LlamaIndex's condense-question chat engine): a plain
    call rewrites the question, the retrieval runs on it, the answering call streams. Before: TTFT 80 ms (the
    rewrite's end) for 280, ``missing_stage`` without a prompt (the plan took the rewrite, before any retrieval)."""
    spans = [
        _span(TURN_1, "chat condense", 0.0, 80.0, **{"gen_ai.operation.name": "chat", "gen_ai.request.stream": False}),
        _span(RETRIEVAL, "retrieval docs", 85.0, 135.0, **{"gen_ai.operation.name": "retrieval"}),
        _turn(TURN_2, 160.0, 400.0, 120.0, ["stop"]),
        _span(ROOT, "POST /ask", 0.0, 405.0),
    ]
    record, _ = _stored(spans)
    assert record["status"] == "complete" and record["ttft_ms"] == pytest.approx(280.0)
    assert record["prompt_assemble_ms"] == pytest.approx(25.0)  # the retrieval's end to the answering call
    assert record["llm_ttft_ms"] == pytest.approx(80.0 + 120.0) and record["other_ms"] == pytest.approx(5.0)


def test_a_retrieval_an_agent_calls_as_a_tool_makes_the_first_turn_a_step() -> None:
    """Agentic RAG: the model asks for the retrieval (a tool), the answering call streams after it."""
    spans = [
        _turn(TURN_1, 10.0, 140.0, 120.0, ["tool_calls"]),
        _span(RETRIEVAL, "retrieval docs", 145.0, 195.0, **{"gen_ai.operation.name": "retrieval"}),
        _turn(TURN_2, 200.0, 440.0, 125.0, ["stop"]),
        _span(ROOT, "POST /ask", 0.0, 445.0),
    ]
    record, _ = _stored(spans)
    assert record["status"] == "complete" and record["ttft_ms"] == pytest.approx(325.0)
    assert record["prompt_assemble_ms"] == pytest.approx(5.0) and record["llm_ttft_ms"] == pytest.approx(255.0)


def test_a_plain_call_before_the_streamed_answer_is_a_step() -> None:
    """A router, guard or classifier call (not streamed) between the retrieval and the streamed answer: its end
    was the first token before (130 ms stored for 370)."""
    spans = [
        _span(RETRIEVAL, "retrieval docs", 0.0, 50.0, **{"gen_ai.operation.name": "retrieval"}),
        _span(TURN_1, "chat guard", 60.0, 130.0, **{"gen_ai.operation.name": "chat", "gen_ai.request.stream": False}),
        _turn(TURN_2, 140.0, 400.0, 230.0, ["stop"]),
        _span(ROOT, "POST /ask", 0.0, 405.0),
    ]
    record, _ = _stored(spans)
    assert record["status"] == "complete" and record["ttft_ms"] == pytest.approx(370.0)
    assert record["llm_ttft_ms"] == pytest.approx(70.0 + 230.0) and record["prompt_assemble_ms"] == pytest.approx(10.0)


def test_a_streamed_call_before_a_plain_one_stays_the_answer() -> None:
    """The answer streamed, then a plain call (follow-up suggestions): the stream's first chunk is the first token."""
    spans = [
        _span(RETRIEVAL, "retrieval docs", 0.0, 50.0, **{"gen_ai.operation.name": "retrieval"}),
        _turn(TURN_1, 60.0, 300.0, 120.0, ["stop"]),
        _span(
            TURN_2, "chat follow-ups", 310.0, 400.0, **{"gen_ai.operation.name": "chat", "gen_ai.request.stream": False}
        ),
        _span(ROOT, "POST /ask", 0.0, 405.0),
    ]
    record, _ = _stored(spans)
    assert record["ttft_ms"] == pytest.approx(180.0)


def test_a_zero_length_call_is_not_a_step_before_itself() -> None:
    """A plain call of zero length (a cached answer) is not after itself: with nothing after it, it is the answer."""
    spans = [
        _span(RETRIEVAL, "retrieval docs", 0.0, 50.0, **{"gen_ai.operation.name": "retrieval"}),
        _turn(TURN_1, 60.0, 300.0, 120.0, ["stop"]),
        _span(TURN_2, "chat cached", 310.0, 310.0, **{"gen_ai.operation.name": "chat", "gen_ai.request.stream": False}),
        _span(ROOT, "POST /ask", 0.0, 405.0),
    ]
    record, _ = _stored(spans)
    assert record["status"] == "complete" and record["ttft_ms"] == pytest.approx(180.0)
    assert record["stage_repeats"] == {"first_token": 1, "llm_ttft": 1}


def test_a_turn_started_in_whole_milliseconds_just_before_the_last_ended_still_follows_it() -> None:
    """The Vercel AI SDK's streamed tool loop under OpenTelemetry JS (captured: vercel_tools): a span starts at
    ``Date.now()``, in whole ms, and ends by ``performance.now()``, so turn 2 seemed to start 0.168 ms before turn 1
    ended. Turn 1's span stays open while the tool runs (``ai.toolCall`` inside it). Before, turn 1 was no step: TTFT
    176.8 ms stored (its tool call) for the 490.6 the client saw, ``other_ms`` -132.2; the tool's 31 ms LLM time."""
    spans = [
        _span(RETRIEVAL, "retrieve", 0.0, 43.6, **{"gen_ai.operation.name": "retrieval"}),
        _turn(TURN_1, 47.0, 357.168, 129.9, ["tool-calls"]),
        _span(TOOL, "ai.toolCall", 325.0, 356.0, **{"ai.operationId": "ai.toolCall"}),
        _turn(TURN_2, 357.0, 616.2, 132.2, ["stop"]),
        _span(ROOT, "POST /ask", 0.0, 617.3),
    ]
    record, _ = _stored(spans)
    assert record["status"] == "complete" and record["ttft_ms"] == pytest.approx(489.2)
    assert record["llm_ttft_ms"] == pytest.approx(310.168 - 31.0 + 132.2)  # turn 1 without its tool, turn 2 to +132.2
    # The tool's 31 ms, less the 0.168 ms the two turns seem to overlap (counted in both).
    assert record["other_ms"] == pytest.approx(31.0 - 0.168, abs=1e-3)


def test_calls_that_overlap_by_more_than_the_clock_slack_are_not_steps() -> None:
    """Two calls that overlap by 5 ms ran side by side: the second cannot have waited for the first's tool call."""
    spans = [
        _span(RETRIEVAL, "retrieval docs", 0.0, 50.0, **{"gen_ai.operation.name": "retrieval"}),
        _turn(TURN_1, 60.0, 200.0, 120.0, ["tool_calls"]),
        _turn(TURN_2, 195.0, 400.0, 125.0, ["stop"]),
        _span(ROOT, "POST /ask", 0.0, 405.0),
    ]
    record, _ = _stored(spans)
    assert record["ttft_ms"] == pytest.approx(180.0)  # the earliest first chunk, as for any two answering calls


def test_the_work_a_steps_span_holds_is_counted_once() -> None:
    """Tool and retrieval spans inside a step's span that overlap each other: their union comes off the step."""
    from streams.core.otlp_mapping import agent_steps

    def note(span: OtlpSpan) -> SpanNote:
        return note_span(span, 0)

    notes = [
        note(_turn(TURN_1, 10.0, 200.0, 100.0, ["tool_calls"])),
        note(_span(TOOL, "execute_tool a", 120.0, 160.0, **{"gen_ai.operation.name": "execute_tool"})),
        note(_span(RETRIEVAL, "retrieval docs", 150.0, 190.0, **{"gen_ai.operation.name": "retrieval"})),
        note(_turn(TURN_2, 205.0, 400.0, 125.0, ["stop"])),
    ]
    assert agent_steps(notes) == {TURN_1: 70 * MS}  # 120-190 ms
