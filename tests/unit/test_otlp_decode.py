from __future__ import annotations

import random

import orjson
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from schemas.dead_letter import DeadLetter
from schemas.otlp import OtlpSpan, decode_otlp_message
from streams.settings import CapsConfig
from tests.support.otlp_traffic import build_trace, otlp_json, request_message

CAPS = CapsConfig()
START_US = 1_764_000_000_000_000


def _decode(raw: bytes, encoding: str = "otlp_proto") -> list[OtlpSpan] | DeadLetter:
    return decode_otlp_message(
        raw,
        encoding,  # type: ignore[arg-type]
        topic="otlp_spans",
        partition=3,
        offset=17,
        kafka_timestamp_ms=1_764_000_000_000,
        caps=CAPS,
        received_at_ms=1_764_000_000_000.0,
    )


def _trace() -> tuple[bytes, list[bytes]]:
    spec = build_trace(random.Random(1), 1, START_US, shape="gen_ai", tenant="acme")
    msg = request_message(spec, spec.spans)
    return msg.SerializeToString(), [s.span_id for s in spec.spans]


def _otlp_json(raw: bytes) -> bytes:
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(raw)
    return otlp_json(msg)


def test_proto_message_decodes_to_flat_spans() -> None:
    raw, ids = _trace()
    spans = _decode(raw)
    assert isinstance(spans, list)
    assert [s.span_id for s in spans] == [i.hex() for i in ids]
    root = next(s for s in spans if s.is_root)
    assert root.name == "POST /ask" and len(root.trace_id) == 32 and root.trace_id == root.trace_id.lower()
    assert root.attributes["service.name"] == "rag-api"  # the resource's, under the span's own
    llm = next(s for s in spans if s.name == "llm")
    assert llm.attributes["gen_ai.operation.name"] == "chat"
    assert llm.attributes["gen_ai.usage.input_tokens"] > 0
    assert llm.end_ns > llm.start_ns > 1_700_000_000 * 10**9


def test_span_attributes_win_over_resource_attributes() -> None:
    raw, _ = _trace()
    spans = _decode(raw)
    assert isinstance(spans, list)
    assert all(s.attributes["service.version"] == "ignored-by-ttft-version" for s in spans)


def test_otlp_json_with_hex_ids_decodes_like_proto() -> None:
    raw, _ = _trace()
    assert _decode(_otlp_json(raw), "otlp_json") == _decode(raw)


def test_otlp_json_accepts_snake_case_and_numeric_int64() -> None:
    trace_id, span_id = "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174"
    doc = {
        "resource_spans": [
            {
                "resource": {"attributes": [{"key": "tenant.id", "value": {"stringValue": "acme"}}]},
                "scope_spans": [
                    {
                        "spans": [
                            {
                                "trace_id": trace_id,
                                "span_id": span_id,
                                "name": "root",
                                "kind": 2,
                                "start_time_unix_nano": 1764000000000000000,
                                "end_time_unix_nano": "1764000000500000000",
                                "attributes": [{"key": "n", "value": {"intValue": "42"}}],
                            }
                        ]
                    }
                ],
            }
        ]
    }
    spans = _decode(orjson.dumps(doc), "otlp_json")
    assert isinstance(spans, list)
    (span,) = spans
    assert (span.trace_id, span.span_id, span.parent_span_id) == (trace_id, span_id, "")
    assert span.end_ns - span.start_ns == 500_000_000
    assert span.attributes == {"tenant.id": "acme", "n": 42}


@pytest.mark.parametrize(
    ("raw", "encoding"),
    [
        (b"\xff\xff\xff not protobuf", "otlp_proto"),
        (b"{not json", "otlp_json"),
        (b"[1, 2]", "otlp_json"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": "00"}]}]}]}', "otlp_json"),
        (b'{"resourceSpans": "nope"}', "otlp_json"),
    ],
)
def test_malformed_payload_is_one_dead_letter(raw: bytes, encoding: str) -> None:
    dl = _decode(raw, encoding)
    assert isinstance(dl, DeadLetter)
    assert dl.reason_code == "otlp_decode"
    assert (dl.source_topic, dl.source_partition, dl.source_offset) == ("otlp_spans", 3, 17)
    assert dl.original == raw and dl.detail.startswith(encoding)


def test_span_with_a_zero_or_short_trace_id_dead_letters_the_message() -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    msg = ExportTraceServiceRequest()
    span = msg.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = bytes(16), b"12345678", "bad"
    dl = _decode(msg.SerializeToString())
    assert isinstance(dl, DeadLetter) and "trace_id" in dl.detail
    span.trace_id = b"short"
    assert isinstance(_decode(msg.SerializeToString()), DeadLetter)


def test_empty_message_has_no_spans() -> None:
    assert _decode(b"") == []
    assert _decode(b"{}", "otlp_json") == []
