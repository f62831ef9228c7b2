"""A Spring AI 2.0 RAG service traced by Spring's own observability: Spring Boot 4's OpenTelemetry starter (Micrometer
Tracing's bridge) with a ChatClient, a QuestionAnswerAdvisor over a SimpleVectorStore and the OpenAI chat and
embedding models, against the loopback stub (tests/data/otel_instrumentations/capture_java.py, ``java_spring_ai/``):
a stream, a plain call, a second stream.

Spring AI names its vector store's search ``spring.ai.kind = vector_store``, ``db.operation.name = query``, its
embedding call ``gen_ai.operation.name = embedding``, and Micrometer writes every tag as a string: read since
2026-12-06 (every request was ``missing_stage`` without its retrieval, its plain calls ``no_first_chunk``). Its chat
span tells no first chunk: a stream is ``no_first_chunk`` until the service marks its first token; then exact. A
stream's chat span ends when its Flux completes, at times after the root: the mark waits for it.
"""

from __future__ import annotations

import pytest

from schemas.otlp import OtlpSpan
from streams.core.otlp_traces import TraceAssembler
from streams.settings import CapsConfig, JoinConfig, OtlpConfig
from tests.support.captured_otlp import captured, stored_in_end_order, stored_record

STREAMS = ("stream", "stream2")


def _chat(spans: list[OtlpSpan]) -> OtlpSpan:
    (chat,) = [s for s in spans if s.name.startswith("chat ")]
    return chat


@pytest.mark.parametrize(
    "setup",
    [
        "java_spring_ai_spring_ai",
        "java_spring_ai_spring_ai_marked",
        "java_spring_ai11_spring_ai11",  # Spring AI 1.1 on Boot 3.5 (test_otlp_spring_ai11.py): the same keys
        "java_spring_ai11_spring_ai11_marked",
    ],
)
@pytest.mark.parametrize("case", ["stream", "non_stream", "stream2"])
def test_the_vector_store_search_is_the_retrieval_and_its_embedding_the_vector_recall(setup: str, case: str) -> None:
    _, spans = captured(setup)[case]
    record, _ = stored_record(spans)
    (search,) = [s for s in spans if s.attributes.get("spring.ai.kind") == "vector_store"]
    (embedding,) = [s for s in spans if s.name.startswith("embedding ")]
    assert record["retrieval_ms"] == pytest.approx((search.end_ns - search.start_ns) / 1e6, abs=0.01)
    assert record["vector_recall_ms"] == pytest.approx((embedding.end_ns - embedding.start_ns) / 1e6, abs=0.01)
    if setup.startswith("java_spring_ai_"):  # 1.1 writes "0" for a stream's unknown usage (test_otlp_spring_ai11.py)
        assert record["prompt_tokens"] == 812  # Micrometer's "812"


@pytest.mark.parametrize("case", STREAMS)
def test_alone_a_stream_is_no_first_chunk(case: str) -> None:
    _, spans = captured("java_spring_ai_spring_ai")[case]
    record, _ = stored_record(spans)
    assert record["status"] == "no_first_chunk" and record["missing_stages"] == ["llm_ttft", "first_token"]


def test_alone_a_plain_call_is_complete_a_few_ms_short() -> None:
    """The chat span's end is the answer; ChatClient's own work after it (advisors) is the caller's, in no span."""
    truth, spans = captured("java_spring_ai_spring_ai")["non_stream"]
    record, _ = stored_record(spans)
    root = next(s for s in spans if s.is_root)
    seen = (truth["first_chunk_ns"] - root.start_ns) / 1e6
    assert record["status"] == "complete" and 0 <= seen - record["ttft_ms"] < 15


@pytest.mark.parametrize("case", ["stream", "non_stream", "stream2"])
def test_marked_every_request_is_complete_and_exact_in_any_export_order(case: str) -> None:
    truth, spans = captured("java_spring_ai_spring_ai_marked")[case]
    root = next(s for s in spans if s.is_root)
    chat = _chat(spans)
    for record in (stored_record(spans)[0], stored_in_end_order(spans)):
        assert record["status"] == "complete", record["missing_stages"]
        assert record["ttft_ms"] == pytest.approx((truth["first_chunk_ns"] - root.start_ns) / 1e6, abs=0.2)
        if case in STREAMS:
            assert record["llm_ttft_ms"] == pytest.approx((truth["first_chunk_ns"] - chat.start_ns) / 1e6, abs=0.01)
        else:  # the mark comes after the chat span's end, the advisors' work: the plain call's whole duration
            assert record["llm_ttft_ms"] == pytest.approx((chat.end_ns - chat.start_ns) / 1e6, abs=0.01)


def test_the_http_client_span_of_a_stream_outside_the_request_makes_no_request() -> None:
    """Reactor Netty's span of the stream's POST is a trace of its own (no stage): nothing is stored of it."""
    import json
    import struct

    from schemas.otlp import parse_spans
    from tests.support.captured_otlp import DATA

    others = set(json.loads((DATA / "java_spring_ai_spring_ai.json").read_text())["other_traces"])
    raw, at = (DATA / "java_spring_ai_spring_ai.otlp").read_bytes(), 0
    asm = TraceAssembler(OtlpConfig(), JoinConfig(), CapsConfig(), "otlp_spans")
    seen = 0
    while at < len(raw):
        (size,) = struct.unpack_from(">I", raw, at)
        spans = parse_spans(raw[at + 4 : at + 4 + size], "otlp_proto")
        at += 4 + size
        if spans[0].trace_id in others:
            seen += 1
            assert [s.name for s in spans] == ["POST"]
            assert asm.add_message(spans, 0, 0, spans[0].end_ns / 1e6 + 60_000) == []
    assert seen == 2


def test_otel_check_names_spring_ais_search_and_the_mark_as_the_fix() -> None:
    from streams.cli.otel_check import report_lines
    from streams.core.otlp_check import FIRST_CHUNK_FIXES_BY_SCOPE, check_traces

    spans = [s for _, trace in captured("java_spring_ai_spring_ai").values() for s in trace]
    text = "\n".join(report_lines("capture", 0, *check_traces(spans)))
    assert "retrieval        spring.ai.kind = vector_store, db.operation.name = query (3)" in text
    assert "vector_recall    gen_ai.operation.name = embedding inside a retrieval span (3)" in text
    assert FIRST_CHUNK_FIXES_BY_SCOPE["org.springframework.boot"] in text


@pytest.mark.parametrize("case", ["stream", "non_stream"])
def test_on_boot_3_an_absent_stream_flag_tells_nothing(case: str) -> None:
    """Spring AI 1.1 (Boot 3, the scope's version) tags no stream on its chat model span: a stream without the tag
    read as a plain call would be stored complete at its last chunk. A chat model called without a ChatClient (no
    ``spring.ai.chat.client.stream`` above it) stays no_first_chunk, never a guess (test_otlp_spring_ai11.py: with
    one)."""
    from dataclasses import replace

    _, spans = captured("java_spring_ai_spring_ai")[case]
    boot3 = [
        replace(
            s,
            scope_version="3.5.7",
            attributes={
                k: v
                for k, v in s.attributes.items()
                if k not in ("gen_ai.request.stream", "spring.ai.chat.client.stream")
            },
        )
        if s.scope_name == "org.springframework.boot"
        else s
        for s in spans
    ]
    record, _ = stored_record(boot3)
    assert record["status"] == "no_first_chunk" and record["ttft_ms"] is None
