"""Spring AI 1.1 on Spring Boot 3.5, the generation most Spring AI services run: the same RAG service as
test_otlp_spring_ai.py (tests/data/otel_instrumentations/capture_java.py, ``java_spring_ai11/``: Boot 3.5.7's actuator
OpenTelemetry SDK under Micrometer Tracing's bridge, Spring AI 1.1.2 with its own OpenAI client), a stream, a plain
call, a second stream, captured 2026-12-06.

Its chat model span tells neither a first chunk nor whether it streamed (scope ``org.springframework.boot`` 3.5.7).
The ChatClient span above it does: ``spring.ai.chat.client.stream`` (``call()`` or ``stream()``). Read since
2026-12-06: before, every call was ``no_first_chunk``, and a marked plain call ``missing_stage`` (its mark comes after
ChatClient's advisors, past the chat span's end). A stream reports 0 input tokens (its usage unknown): no longer
stored as a prompt of 0 tokens.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from schemas.otlp import OtlpSpan
from streams.core.otlp_state import TraceState
from tests.support.captured_otlp import captured, stored_in_end_order, stored_record

ALONE, MARKED = "java_spring_ai11_spring_ai11", "java_spring_ai11_spring_ai11_marked"
STREAMS = ("stream", "stream2")
CASES = ("stream", "non_stream", "stream2")


def _chat(spans: list[OtlpSpan]) -> OtlpSpan:
    (chat,) = [s for s in spans if s.name.startswith("chat ")]
    return chat


def test_the_capture_is_boot_3_and_its_chat_span_tells_nothing() -> None:
    for _, spans in captured(ALONE).values():
        chat = _chat(spans)
        assert (chat.scope_name, chat.scope_version) == ("org.springframework.boot", "3.5.7")
        assert "gen_ai.request.stream" not in chat.attributes and not chat.events


@pytest.mark.parametrize("case", STREAMS)
def test_alone_a_stream_is_no_first_chunk_and_its_unknown_usage_no_prompt_size(case: str) -> None:
    _, spans = captured(ALONE)[case]
    assert _chat(spans).attributes["gen_ai.usage.input_tokens"] == "0"  # Spring AI's empty usage
    record, _ = stored_record(spans)
    assert record["status"] == "no_first_chunk" and record["missing_stages"] == ["llm_ttft", "first_token"]
    assert record["prompt_tokens"] is None  # was 0: below the prompt cache's minimum, by a value nobody measured


def test_alone_a_plain_call_is_complete_by_its_chat_client_span() -> None:
    """The ChatClient span says ``call()``: the chat span's end is the answer (ChatClient's advisors after it are
    the caller's, in no span: a few ms short)."""
    truth, spans = captured(ALONE)["non_stream"]
    (client,) = [s for s in spans if s.attributes.get("spring.ai.kind") == "chat_client"]
    assert client.attributes["spring.ai.chat.client.stream"] == "false"
    root = next(s for s in spans if s.is_root)
    chat = _chat(spans)
    for record in (stored_record(spans)[0], stored_in_end_order(spans)):
        assert record["status"] == "complete", record["missing_stages"]
        assert 0 <= (truth["first_chunk_ns"] - root.start_ns) / 1e6 - record["ttft_ms"] < 15
        assert record["llm_ttft_ms"] == pytest.approx((chat.end_ns - chat.start_ns) / 1e6, abs=0.01)
        assert record["prompt_tokens"] == 812


def test_without_its_chat_client_flag_a_plain_call_tells_nothing() -> None:
    _, spans = captured(ALONE)["non_stream"]
    bare = [
        replace(s, attributes={k: v for k, v in s.attributes.items() if k != "spring.ai.chat.client.stream"})
        for s in spans
    ]
    record, _ = stored_record(bare)
    assert record["status"] == "no_first_chunk"


@pytest.mark.parametrize("case", CASES)
def test_marked_every_request_is_complete_and_exact_in_any_export_order_and_across_a_restart(case: str) -> None:
    truth, spans = captured(MARKED)[case]
    root = next(s for s in spans if s.is_root)
    chat = _chat(spans)
    records = (stored_record(spans)[0], stored_in_end_order(spans), stored_in_end_order(spans, restore=True))
    for record in records:
        assert record["status"] == "complete", record["missing_stages"]
        assert record["ttft_ms"] == pytest.approx((truth["first_chunk_ns"] - root.start_ns) / 1e6, abs=0.2)
        if case in STREAMS:
            assert record["llm_ttft_ms"] == pytest.approx((truth["first_chunk_ns"] - chat.start_ns) / 1e6, abs=0.01)
        else:  # a plain call by its ChatClient span: the chat span's whole duration, the mark after the advisors
            assert record["llm_ttft_ms"] == pytest.approx((chat.end_ns - chat.start_ns) / 1e6, abs=0.01)


def test_the_trace_state_keeps_the_caller_flags_and_older_states_read_without_them() -> None:
    state = TraceState("t", 0, callers={"a": False, "b": True})
    again = TraceState.unpack(state.pack(), 0)
    assert again.callers == {"a": False, "b": True}
    import orjson

    older = orjson.loads(state.pack())[:20]
    assert TraceState.unpack(orjson.dumps(older), 0).callers == {}
    broken = orjson.loads(state.pack())
    broken[20] = {"a": "yes"}
    with pytest.raises(ValueError):
        TraceState.unpack(orjson.dumps(broken), 0)
