"""The service's first-token mark gives ``llm_ttft`` to the answering call whose span tells no first chunk
(OpenTelemetry's own openai-java and openai-v2 instrumentations): which LLM span takes it and which do not.

Captured on a Java service in test_otlp_java.py; here the edges, on hand-made GenAI traces: retrieval 0-50 ms, a
chat span 80-400 ms telling no first chunk, the mark at 280 ms.
"""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest

from schemas.otlp import AttrValue, OtlpSpan
from streams.core.otlp_outputs import ForwardedEvent
from streams.core.otlp_traces import TraceAssembler
from streams.settings import CapsConfig, JoinConfig, OtlpConfig
from tests.support.captured_otlp import stored_record

T0 = 1_764_000_000_000_000_000  # ns
MS = 1_000_000
TRACE = "5c" * 16
ROOT, RETRIEVAL, CHAT, MARK, TURN_1, TOOL = (f"{i:02x}" * 8 for i in range(1, 7))


def _span(span_id: str, name: str, start_ms: float, end_ms: float, parent: str = ROOT, **attrs: AttrValue) -> OtlpSpan:
    return OtlpSpan(
        trace_id=TRACE,
        span_id=span_id,
        parent_span_id=parent if span_id != ROOT else "",
        name=name,
        start_ns=T0 + round(start_ms * MS),
        end_ns=T0 + round(end_ms * MS),
        attributes={"tenant.id": "acme", **attrs},
        scope_name="io.opentelemetry.openai-java-1.1",
        scope_version="2.31.1-alpha",
    )


def _chat(span_id: str, start_ms: float, end_ms: float, **attrs: AttrValue) -> OtlpSpan:
    return _span(span_id, "chat gpt-4o-mini", start_ms, end_ms, **{"gen_ai.operation.name": "chat", **attrs})


def _trace(*middle: OtlpSpan, mark_ms: float | None = 280.0, chat: OtlpSpan | None = None) -> list[OtlpSpan]:
    spans = [
        _span(ROOT, "POST /ask", 0.0, 420.0),
        _span(RETRIEVAL, "retrieval docs", 0.0, 50.0, **{"gen_ai.operation.name": "retrieval"}),
        *middle,
        chat if chat is not None else _chat(CHAT, 80.0, 400.0),
    ]
    if mark_ms is not None:
        spans.append(_span(MARK, "first token", mark_ms, mark_ms, **{"ttft.stage": "first_token"}))
    return spans


def test_the_mark_inside_the_chat_span_gives_its_llm_ttft() -> None:
    record, _ = stored_record(_trace())
    assert record["status"] == "complete"
    assert record["ttft_ms"] == pytest.approx(280.0, abs=0.01) and record["llm_ttft_ms"] == pytest.approx(200.0)


def test_without_a_mark_the_call_stays_unmeasured() -> None:
    record, _ = stored_record(_trace(mark_ms=None))
    assert record["status"] == "no_first_chunk" and record["llm_unmeasured_ms"] == pytest.approx(320.0)


@pytest.mark.parametrize("mark_ms", [60.0, 405.0])
def test_a_mark_outside_the_span_gives_its_ttft_only(mark_ms: float) -> None:
    """Before the call (a cache hit's answer?) or after its end (more than 1 ms): the call's first chunk is not
    known, so its llm_ttft is not made up; the request keeps the marked TTFT."""
    record, _ = stored_record(_trace(mark_ms=mark_ms))
    assert record["ttft_ms"] == pytest.approx(mark_ms, abs=0.01)
    assert record["llm_ttft_ms"] is None and record["llm_unmeasured_ms"] == pytest.approx(320.0)
    assert record["status"] == "missing_stage"


def test_a_mark_just_after_a_plain_calls_end_runs_llm_ttft_to_that_end() -> None:
    record, _ = stored_record(_trace(mark_ms=400.4))
    assert record["status"] == "complete" and record["llm_ttft_ms"] == pytest.approx(320.0)


def test_a_span_telling_its_own_first_chunk_keeps_it() -> None:
    chat = _chat(CHAT, 80.0, 400.0, **{"gen_ai.request.stream": True, "gen_ai.response.time_to_first_chunk": 0.15})
    record, _ = stored_record(_trace(chat=chat))
    assert record["llm_ttft_ms"] == pytest.approx(150.0) and record["ttft_ms"] == pytest.approx(280.0, abs=0.01)


def test_a_tool_call_turn_before_the_answer_is_a_step_and_the_answering_call_takes_the_mark() -> None:
    turn_1 = _chat(TURN_1, 60.0, 150.0, **{"gen_ai.response.finish_reasons": '["tool_calls"]'})
    tool = _span(TOOL, "execute_tool lookup", 152.0, 170.0, **{"gen_ai.operation.name": "execute_tool"})
    chat = _chat(CHAT, 175.0, 400.0)
    record, _ = stored_record(_trace(turn_1, tool, chat=chat))
    assert record["status"] == "complete"
    # the step's whole 90 ms, then the answer's 105 ms to the mark
    assert record["llm_ttft_ms"] == pytest.approx(90.0 + 105.0)
    assert record["stage_repeats"] == {"llm_ttft": 1}  # one call more than one


def test_a_mark_with_no_parent_is_dead_lettered_never_a_request() -> None:
    asm = TraceAssembler(OtlpConfig(), JoinConfig(), CapsConfig(), "otlp_spans")
    lost = replace(_span(MARK, "first token", 280.0, 280.0, **{"ttft.stage": "first_token"}), parent_span_id="")
    (out,) = asm.add_message([lost], 0, 0, T0 / 1e6 + 60_000)
    assert getattr(out, "reason_code", None) == "schema"
    assert asm.counters.spans["dead_letter"] == 1


def _events(outputs: list[object]) -> list[dict[str, object]]:
    return [orjson.loads(o.value) for o in outputs if isinstance(o, ForwardedEvent)]


def test_an_llm_span_exported_after_the_root_runs_to_the_mark_gets_its_prompt_and_survives_a_restore() -> None:
    """Spring AI ends a stream's chat span when its Flux completes, which may be after the service ended its root:
    the trace resolves at the root; the mark and the retrieval's end wait for the late span (in the changelog state
    too)."""
    spans = _trace()
    chat = next(s for s in spans if s.span_id == CHAT)
    asm = TraceAssembler(OtlpConfig(), JoinConfig(), CapsConfig(), "otlp_spans")
    now = T0 / 1e6 + 60_000
    first = _events(asm.add_message([s for s in spans if s is not chat], 0, 0, now))
    assert "llm_ttft" not in {e["stage"] for e in first} and "first_token" in {e["stage"] for e in first}
    ((key, (partition, packed)),) = asm.dirty().items()
    assert packed is not None
    restored = TraceAssembler(OtlpConfig(), JoinConfig(), CapsConfig(), "otlp_spans")
    restored.restore(key, packed, partition)
    for assembler in (asm, restored):
        late = {e["stage"]: e for e in _events(assembler.add_message([chat], 0, 1, now))}
        assert set(late) == {"llm_ttft", "prompt_assemble"}
        assert late["llm_ttft"]["duration_ms"] == pytest.approx(200.0)
        assert late["llm_ttft"]["attrs"]["first_chunk_from"] == "first_token"  # type: ignore[index]
        # the derived prompt assembly waited too: from the retrieval's end (50 ms) to the call's start (80 ms)
        assert late["prompt_assemble"]["duration_ms"] == pytest.approx(30.0)
