"""The mapping over spans that real OpenAI instrumentations exported (tests/data/otel_instrumentations: how
they were made and with which versions is in tests/data/README.md). Each library's RAG service made three
traces against a stub whose first chunk comes 120 ms after the request: streaming, non-streaming, and
streaming with a retried retrieval."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import orjson
import pytest

from schemas.dead_letter import DeadLetter
from schemas.otlp import OtlpSpan, parse_spans
from streams.core.otlp_outputs import ForwardedEvent, Output
from streams.core.otlp_traces import TraceAssembler
from streams.settings import CapsConfig, JoinConfig, OtlpConfig

DATA = Path(__file__).resolve().parents[1] / "data" / "otel_instrumentations"
LIBRARIES = ("openinference", "openllmetry", "openai_v2")
STUB_FIRST_CHUNK_MS = 120.0
#: The instrumentation sees a chunk before the client's loop does; both clocks are the same process's.
CLIENT_SLACK_MS = 5.0


def _messages(library: str) -> list[bytes]:
    raw = (DATA / f"{library}.otlp").read_bytes()
    out, at = [], 0
    while at < len(raw):
        (size,) = struct.unpack_from(">I", raw, at)
        out.append(raw[at + 4 : at + 4 + size])
        at += 4 + size
    return out


def _truth(library: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((DATA / f"{library}.json").read_text())
    return doc


def _spans(library: str, case: str) -> list[OtlpSpan]:
    trace_id = next(t["trace_id"] for t in _truth(library)["traces"] if t["case"] == case)
    for message in _messages(library):
        spans = parse_spans(message, "otlp_proto")
        if spans[0].trace_id == trace_id:
            return spans
    raise AssertionError(f"{library}: no trace {trace_id}")


def _run(library: str, case: str) -> tuple[TraceAssembler, list[Output]]:
    asm = TraceAssembler(OtlpConfig(), JoinConfig(), CapsConfig(), "otlp_spans")
    spans = _spans(library, case)
    now_ms = max(s.end_ns for s in spans) / 1e6 + 60_000
    return asm, asm.add_message(spans, 0, 0, now_ms)


def _events(outputs: list[Output]) -> dict[str, list[dict[str, Any]]]:
    by_stage: dict[str, list[dict[str, Any]]] = {}
    for o in outputs:
        if isinstance(o, ForwardedEvent):
            event = orjson.loads(o.value)
            by_stage.setdefault(event["stage"], []).append(event)
    for events in by_stage.values():
        events.sort(key=lambda e: e["ts_ms"])
    return by_stage


def _span(spans: list[OtlpSpan], name: str) -> OtlpSpan:
    (span,) = [s for s in spans if s.name == name]
    return span


def _trace(library: str, case: str) -> dict[str, Any]:
    trace: dict[str, Any] = next(t for t in _truth(library)["traces"] if t["case"] == case)
    return trace


def test_the_captures_are_what_the_readme_says() -> None:
    for library in LIBRARIES:
        truth = _truth(library)
        assert [t["case"] for t in truth["traces"]] == ["stream", "non_stream", "retried"]
        assert len(_messages(library)) == 3
        spans = _spans(library, "stream")
        assert {s.attributes["tenant.id"] for s in spans} == {"acme"}  # the resource attribute, on every span
    assert _truth("openinference")["versions"]["openinference-instrumentation-openai"] == "0.1.66"
    assert _truth("openllmetry")["versions"]["opentelemetry-instrumentation-openai"] == "0.62.4"
    assert _truth("openai_v2")["versions"]["opentelemetry-instrumentation-openai-v2"] == "2.4b0"


@pytest.mark.parametrize(
    ("library", "llm_span", "source"),
    [
        ("openinference", "ChatCompletion", "First Token Stream Event"),
        ("openllmetry", "openai.chat", "gen_ai.content.completion.chunk"),
    ],
)
def test_streaming_request_is_complete_and_llm_ttft_is_what_the_span_says(
    library: str, llm_span: str, source: str
) -> None:
    asm, out = _run(library, "stream")
    assert not [o for o in out if isinstance(o, DeadLetter)]
    events = _events(out)
    assert set(events) == {
        "request_start",
        "retrieval",
        "vector_recall",
        "prompt_assemble",
        "llm_ttft",
        "first_token",
    } | ({"rerank"} if library == "openinference" else set())
    spans = _spans(library, "stream")
    llm = _span(spans, llm_span)
    first_chunk_ns = min(e.time_ns for e in llm.events if e.name == source)
    (ttft,) = events["llm_ttft"]
    assert ttft["duration_ms"] == (first_chunk_ns - llm.start_ns) / 1e6
    assert ttft["attrs"] == {"prompt_tokens": 812, "cached_tokens": 512, "trace_id": llm.trace_id}
    assert ttft["route"] == "gpt-4o-mini" and ttft["version_id"] == "1.4.2" and ttft["tenant_id"] == "acme"
    assert ttft["duration_ms"] >= STUB_FIRST_CHUNK_MS
    truth = _trace(library, "stream")
    client_ms = (truth["first_chunk_ns"] - llm.start_ns) / 1e6
    assert 0 <= client_ms - ttft["duration_ms"] <= CLIENT_SLACK_MS
    (first,) = events["first_token"]
    assert first["ts_ms"] == pytest.approx(first_chunk_ns / 1e6, abs=1e-3)
    assert asm.counters.no_first_chunk == {}


@pytest.mark.parametrize("library", ["openinference", "openllmetry"])
def test_derived_prompt_assembly_is_the_gap_from_the_last_retrieval_to_the_llm_span(library: str) -> None:
    _, out = _run(library, "stream")
    events = _events(out)
    (prompt,) = events["prompt_assemble"]
    (ttft,) = events["llm_ttft"]
    last_end = max(e["ts_ms"] + e["duration_ms"] for e in events["retrieval"] + events.get("rerank", []))
    assert prompt["attrs"] == {"derived": True, "trace_id": ttft["attrs"]["trace_id"]}
    assert prompt["ts_ms"] == pytest.approx(last_end, abs=1e-3)
    assert prompt["ts_ms"] + prompt["duration_ms"] == pytest.approx(ttft["ts_ms"], abs=1e-3)
    assert prompt["duration_ms"] >= 20.0  # the service's 25 ms of prompt work, no span of its own


@pytest.mark.parametrize(("library", "llm_span"), [("openinference", "ChatCompletion"), ("openllmetry", "openai.chat")])
def test_non_streaming_call_gives_its_duration_marked_streaming_false(library: str, llm_span: str) -> None:
    _, out = _run(library, "non_stream")
    assert not [o for o in out if isinstance(o, DeadLetter)]
    events = _events(out)
    llm = _span(_spans(library, "non_stream"), llm_span)
    (ttft,) = events["llm_ttft"]
    assert ttft["duration_ms"] == (llm.end_ns - llm.start_ns) / 1e6
    assert ttft["attrs"]["streaming"] is False
    (first,) = events["first_token"]
    assert first["ts_ms"] == pytest.approx(llm.end_ns / 1e6, abs=1e-3)


@pytest.mark.parametrize("library", ["openinference", "openllmetry", "openai_v2"])
def test_retried_retrieval_is_two_events_that_sum(library: str) -> None:
    _, out = _run(library, "retried")
    events = _events(out)
    retrievals = events["retrieval"]
    assert len(retrievals) == 2 and len({e["event_id"] for e in retrievals}) == 2
    assert len(events["vector_recall"]) == 2  # one embeddings call inside each attempt
    if library == "openinference":
        (rerank,) = events["rerank"]  # the reranker under the second attempt
        second = retrievals[1]
        assert second["ts_ms"] <= rerank["ts_ms"] <= second["ts_ms"] + second["duration_ms"]


def test_openai_v2_has_no_first_chunk_so_its_llm_span_is_unmeasured_and_counted_by_scope() -> None:
    for case in ("stream", "non_stream"):  # the span says nothing of streaming: the two look alike
        asm, out = _run("openai_v2", case)
        assert not [o for o in out if isinstance(o, DeadLetter)]
        llm = _span(_spans("openai_v2", case), "chat gpt-4o-mini")
        (unmeasured,) = _events(out)["llm_unmeasured"]
        assert unmeasured["event_id"] == llm.span_id
        assert unmeasured["duration_ms"] == (llm.end_ns - llm.start_ns) / 1e6
        assert unmeasured["attrs"]["scope_name"] == "opentelemetry.util.genai.handler"
        assert "streaming" not in unmeasured["attrs"]
        assert asm.counters.no_first_chunk == {("opentelemetry.util.genai.handler", "1.1b0"): 1}
        # the request's other stages still go through
        assert set(_events(out)) == {"request_start", "retrieval", "vector_recall", "prompt_assemble", "llm_unmeasured"}
