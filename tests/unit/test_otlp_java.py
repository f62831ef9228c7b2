"""A Java service: the openai-java client wrapped by OpenTelemetry's own library instrumentation
(``opentelemetry-openai-java-1.1``), and the same under OpenTelemetry's Java agent, against the loopback stub
(tests/data/otel_instrumentations/capture_java.py, ``java_openai/``): a stream, a plain call, the async client's
stream and a second stream.

Its chat span tells no first chunk and not whether the call streamed, so alone every request is ``no_first_chunk``
(never a guess). The service marking its caller's first token (a zero-length child span ``ttft.stage =
first_token``, the plain OpenTelemetry API: there is no ttft-emit helper for Java) makes them ``complete`` and
exact: the TTFT from the mark, and ``llm_ttft`` from the chat span's start to the mark. A mark made in the async
client's callback without the request's context is a trace of its own: dead-lettered with the fix, never a
request with a TTFT of 0 ms.
"""

from __future__ import annotations

import json
import struct

import pytest

from schemas.otlp import OtlpSpan, parse_spans
from streams.cli.otel_check import report_lines
from streams.core.otlp_check import FIRST_CHUNK_FIXES_BY_SCOPE, check_traces
from streams.core.otlp_traces import LOST_MARK_DETAIL, TraceAssembler
from streams.settings import CapsConfig, JoinConfig, OtlpConfig
from tests.support.captured_otlp import DATA, captured, stored_record

SCOPE = "io.opentelemetry.openai-java-1.1"
CASES = ("stream", "non_stream", "stream_async", "stream2")
#: How far the stored times may be from what the service saw (ms): the mark is made where the caller gets its text.
EXACT_MS = 0.2


def _chat(spans: list[OtlpSpan]) -> OtlpSpan:
    (chat,) = [s for s in spans if s.scope_name == SCOPE and s.name.startswith("chat ")]
    return chat


def _other_traces(library: str) -> list[list[OtlpSpan]]:
    """The capture's traces that are no request (``other_traces`` of its json)."""
    others = set(json.loads((DATA / f"{library}.json").read_text())["other_traces"])
    raw, at, out = (DATA / f"{library}.otlp").read_bytes(), 0, []
    while at < len(raw):
        (size,) = struct.unpack_from(">I", raw, at)
        spans = parse_spans(raw[at + 4 : at + 4 + size], "otlp_proto")
        at += 4 + size
        if spans[0].trace_id in others:
            out.append(spans)
    return out


#: The library instrumentation (``OpenAITelemetry.wrap``), and the same under OpenTelemetry's Java agent 2.31.1, which
#: applies it when a client is built and adds OkHttp's client spans (``POST``, scope ``io.opentelemetry.okhttp-3.0``:
#: no stage).
ALONE = ("java_openai_otel", "java_openai_agent")
MARKED = ("java_openai_otel_marked", "java_openai_agent_marked")


@pytest.mark.parametrize("setup", ALONE)
@pytest.mark.parametrize("case", CASES)
def test_alone_the_java_instrumentation_tells_no_first_chunk_and_nothing_is_guessed(setup: str, case: str) -> None:
    _truth, spans = captured(setup)[case]
    record, _ = stored_record(spans)
    assert record["status"] == "no_first_chunk" and record["ttft_ms"] is None
    chat = _chat(spans)
    assert record["llm_unmeasured_ms"] == pytest.approx((chat.end_ns - chat.start_ns) / 1e6, abs=0.01)
    assert record["retrieval_ms"] is not None and record["prompt_assemble_ms"] is not None


@pytest.mark.parametrize("setup", MARKED)
@pytest.mark.parametrize("case", CASES)
def test_the_services_own_first_token_mark_makes_it_complete_and_exact(setup: str, case: str) -> None:
    truth, spans = captured(setup)[case]
    record, _ = stored_record(spans)
    root = next(s for s in spans if s.is_root)
    chat = _chat(spans)
    assert record["status"] == "complete", record["missing_stages"]
    assert record["ttft_ms"] == pytest.approx((truth["first_chunk_ns"] - root.start_ns) / 1e6, abs=EXACT_MS)
    # llm_ttft runs from the chat span's start to the mark (a plain call's: to its end, the mark just after it)
    to_mark = (min(truth["first_chunk_ns"], chat.end_ns) - chat.start_ns) / 1e6
    assert record["llm_ttft_ms"] == pytest.approx(to_mark, abs=0.01)
    assert record["llm_unmeasured_ms"] is None
    # the agent's first request is cold (no warm-up under the agent: every call would be a trace): its class loading
    # is in no span, 73 ms of other_ms on this capture
    cold = setup == "java_openai_agent_marked" and case == "stream"
    assert 0 <= record["other_ms"] < (200 if cold else 5)


def test_a_mark_that_lost_its_context_is_dead_lettered_and_its_request_stays_unmeasured() -> None:
    _truth, spans = captured("java_openai_otel_marked")["stream_async_lost"]
    record, _ = stored_record(spans)
    assert record["status"] == "no_first_chunk" and record["ttft_ms"] is None
    (lost,) = _other_traces("java_openai_otel_marked")
    assert [s.name for s in lost] == ["first token"] and lost[0].is_root
    asm = TraceAssembler(OtlpConfig(), JoinConfig(), CapsConfig(), "otlp_spans")
    (letter,) = asm.add_message(lost, 0, 0, lost[0].end_ns / 1e6 + 60_000)
    assert letter.reason_code == "schema" and letter.detail.endswith(LOST_MARK_DETAIL)  # type: ignore[union-attr]
    assert letter.trace_id == lost[0].trace_id and letter.tenant_id == "acme"  # type: ignore[union-attr]


def test_otel_check_names_the_mark_as_the_first_chunk_the_lost_mark_and_the_java_fix() -> None:
    spans = [s for _, trace in captured("java_openai_otel_marked").values() for s in trace]
    others = [s for trace in _other_traces("java_openai_otel_marked") for s in trace]
    text = "\n".join(report_lines("capture", 0, *check_traces([*spans, *others])))
    assert "first chunk from the service's first-token mark (ttft.stage = first_token) inside it" in text
    assert "first-token mark without its request (1 traces" in text
    alone = [s for _, trace in captured("java_openai_otel").values() for s in trace]
    assert FIRST_CHUNK_FIXES_BY_SCOPE[SCOPE] in "\n".join(report_lines("capture", 0, *check_traces(alone)))
