"""``ttft otel check`` on each real instrumentation's captured traces (tests/data/otel_instrumentations) and on
traces that lack what the pipeline needs: what it names as found, what as missing, and the fix."""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from schemas.otlp import AttrValue, OtlpSpan, parse_spans
from streams.cli.otel_check import last_traces, read_span_file
from streams.core.otlp_check import ANY_CHUNK, FIXES, check_traces

DATA = Path(__file__).resolve().parents[1] / "data" / "otel_instrumentations"
T0 = 1_764_000_000_000_000_000
MS = 1_000_000


def _messages(library: str) -> list[bytes]:
    raw = (DATA / f"{library}.otlp").read_bytes()
    out, at = [], 0
    while at < len(raw):
        (size,) = struct.unpack_from(">I", raw, at)
        out.append(raw[at + 4 : at + 4 + size])
        at += 4 + size
    return out


def ttft(*args: str) -> Result:
    from streams.cli.main import main

    return CliRunner().invoke(main, list(args), terminal_width=200)


def _check_json(path: Path) -> tuple[int, dict[str, Any]]:
    result = ttft("otel", "check", "--file", str(path), "--json")
    doc: dict[str, Any] = json.loads(result.stdout)
    return result.exit_code, doc


@pytest.mark.parametrize(
    ("library", "scope", "first_chunk"),
    [
        ("openinference", "openinference.instrumentation.openai", "event 'First Token Stream Event'"),
        ("openllmetry", "opentelemetry.instrumentation.openai.v1", "event 'gen_ai.content.completion.chunk'"),
    ],
)
def test_a_library_that_tells_the_first_chunk_gives_complete_requests(
    library: str, scope: str, first_chunk: str
) -> None:
    code, doc = _check_json(DATA / f"{library}.otlp")
    assert code == 0 and doc["traces"] == doc["complete"] == 3
    (report,) = doc["scopes"]
    assert report["scope"] == scope and report["complete"] == 3 and report["missing"] == []
    stages = report["stages"]
    rerank = ["rerank"] if library == "openinference" else []
    assert list(stages) == [
        "request_start",
        "retrieval",
        "vector_recall",
        *rerank,
        "prompt_assemble",
        "llm_ttft",
        "first_token",
    ]
    llm = stages["llm_ttft"]
    # these instrumentations mark the first chunk of any kind, and the check says so
    assert sum(n for source, n in llm.items() if source.endswith(f"first chunk from {first_chunk}{ANY_CHUNK}")) == 2
    assert sum(n for source, n in llm.items() if source.endswith("the span's end (not streaming)")) == 1
    assert stages["prompt_assemble"] == {"derived: from the last retrieval or rerank end to the LLM span's start": 3}
    assert stages["request_start"] == {"the root span": 3}
    assert report["tenant"] == {"tenant.id": 3}


def test_openai_v2_is_no_first_chunk_and_the_fix_says_which_attribute_to_set() -> None:
    code, doc = _check_json(DATA / "openai_v2.otlp")
    assert code == 1 and doc["traces"] == 3 and doc["complete"] == 0
    (report,) = doc["scopes"]
    assert (report["scope"], report["statuses"]) == ("opentelemetry.util.genai.handler", {"no_first_chunk": 3})
    assert report["stages"]["llm_unmeasured"] == {
        "gen_ai.operation.name = chat, no first chunk (streaming: not told)": 3
    }
    assert set(report["stages"]) == {"request_start", "retrieval", "vector_recall", "prompt_assemble", "llm_unmeasured"}
    missing = {m["what"]: m for m in report["missing"]}
    assert set(missing) == {"first chunk", "stream flag"}
    assert missing["first chunk"]["traces"] == 3
    assert "gen_ai.response.time_to_first_chunk" in missing["first chunk"]["fix"]
    text = ttft("otel", "check", "--file", str(DATA / "openai_v2.otlp"))
    assert text.exit_code == 1
    assert "0 complete (no_first_chunk 3)" in text.stdout
    assert f"fix: {FIXES['first chunk']}" in text.stdout


def test_otlp_json_lines_and_a_single_protobuf_message_read_alike(tmp_path: Path) -> None:
    messages = _messages("openinference")
    lines = tmp_path / "spans.json"
    docs = [_hex_ids(json_format.MessageToDict(ExportTraceServiceRequest.FromString(m))) for m in messages]
    lines.write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    one = tmp_path / "one.pb"
    one.write_bytes(messages[0])
    assert read_span_file(lines) == read_span_file(DATA / "openinference.otlp")
    assert read_span_file(one) == parse_spans(messages[0], "otlp_proto")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json\n")
    result = ttft("otel", "check", "--file", str(bad))
    assert result.exit_code == 1 and "bad.json:1" in result.output


def _hex_ids(doc: Any) -> Any:
    """OTLP/JSON as the Collector writes it: ids in hex (protobuf's JSON has them in base64)."""
    if isinstance(doc, dict):
        return {
            k: base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId") else _hex_ids(v)
            for k, v in doc.items()
        }
    if isinstance(doc, list):
        return [_hex_ids(v) for v in doc]
    return doc


def _span(span_id: str, parent: str, start_ms: float, end_ms: float, **attrs: AttrValue) -> OtlpSpan:
    return OtlpSpan(
        trace_id="ab" * 16,
        span_id=span_id,
        parent_span_id=parent,
        name=span_id,
        start_ns=T0 + round(start_ms * MS),
        end_ns=T0 + round(end_ms * MS),
        attributes=dict(attrs),
        events=(),
        scope_name="my.llm.lib",
        scope_version="1.0",
    )


ROOT = "01" * 8
RETRIEVAL: dict[str, AttrValue] = {"gen_ai.operation.name": "retrieval"}
CHAT: dict[str, AttrValue] = {"gen_ai.operation.name": "chat", "gen_ai.response.time_to_first_chunk": 0.2}
TENANT: dict[str, AttrValue] = {"tenant.id": "acme"}


def test_what_is_missing_is_named_with_its_fix() -> None:
    no_tenant = [
        _span(ROOT, "", 0, 900),
        _span("02" * 8, ROOT, 1, 50, **RETRIEVAL),
        _span("03" * 8, ROOT, 60, 800, **CHAT),
    ]
    reports, (finding,) = check_traces(no_tenant)
    assert finding.status == "not stored" and finding.missing == ["tenant"] and finding.tenant == ""
    assert reports[0].to_json()["missing"] == [
        {"what": "tenant", "traces": 1, "fix": FIXES["tenant"], "examples": [finding.trace_id]}
    ]

    no_retrieval = [_span(ROOT, "", 0, 900, **TENANT), _span("03" * 8, ROOT, 60, 800, **CHAT, **TENANT)]
    _, (finding,) = check_traces(no_retrieval)
    assert finding.status == "missing_stage" and finding.missing == ["retrieval", "prompt_assemble"]
    assert finding.stages["llm_ttft"] == (
        "gen_ai.operation.name = chat, first chunk from attribute gen_ai.response.time_to_first_chunk"
    )

    _, (finding,) = check_traces([s for s in no_retrieval if s.parent_span_id])
    assert finding.status == "orphan" and "request_start" in finding.missing

    retriever = {"openinference.span.kind": "RETRIEVER", **TENANT}
    no_llm = [_span(ROOT, "", 0, 900, **TENANT), _span("02" * 8, ROOT, 1, 50, **retriever)]
    reports, (finding,) = check_traces(no_llm)
    assert finding.status == "timed_out" and finding.missing == ["prompt_assemble", "llm_ttft"]
    assert reports[0].scope == ("(no LLM span)", "")

    bad = {**CHAT, "gen_ai.request.stream": True, "gen_ai.response.time_to_first_chunk": -1.0, **TENANT}
    _, (finding,) = check_traces([no_retrieval[0], _span("03" * 8, ROOT, 60, 800, **bad)])
    assert finding.status == "no_first_chunk" and finding.missing[0] == "first chunk"
    assert finding.missing[-1].startswith("first chunk ignored: gen_ai.response.time_to_first_chunk = -1.0")
    assert "stream flag" not in finding.missing


def test_the_last_traces_are_the_most_recent_by_span_end() -> None:
    def spans(trace: str, end_ms: float) -> list[OtlpSpan]:
        return [replace(_span(ROOT, "", 0, end_ms), trace_id=trace * 32)]

    messages = [spans("a", 10), spans("b", 20), spans("d", 40), spans("a", 30), spans("c", 25)]
    assert [s.trace_id[0] for s in last_traces(messages, 2)] == ["a", "d", "a"]
    assert [s.trace_id[0] for s in last_traces(messages, 3)] == ["a", "d", "a", "c"]
    assert [s.trace_id[0] for s in last_traces(messages, 3, cut={"a" * 32})] == ["b", "d", "c"]
