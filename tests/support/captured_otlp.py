"""The captured spans of real instrumentations (tests/data/otel_instrumentations), read and run through the
bridge's assembler and the join as the pipeline stores them."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from schemas.decode import decode_stage_event
from schemas.otlp import OtlpSpan, parse_spans
from streams.core.join import RequestJoin
from streams.core.otlp_outputs import ForwardedEvent
from streams.core.otlp_traces import TraceAssembler
from streams.settings import CapsConfig, JoinConfig, OtlpConfig

DATA = Path(__file__).resolve().parents[1] / "data" / "otel_instrumentations"
Capture = dict[str, tuple[dict[str, Any], list[OtlpSpan]]]


def _messages(library: str) -> list[list[OtlpSpan]]:
    """The spans of ``<library>.otlp``, a message (a trace) each."""
    raw, messages, at = (DATA / f"{library}.otlp").read_bytes(), [], 0
    while at < len(raw):
        (size,) = struct.unpack_from(">I", raw, at)
        messages.append(parse_spans(raw[at + 4 : at + 4 + size], "otlp_proto"))
        at += 4 + size
    return messages


def read_capture(library: str) -> list[OtlpSpan]:
    """Every span of ``<library>.otlp``: the requests' traces and the others."""
    return [span for spans in _messages(library) for span in spans]


def captured(library: str) -> Capture:
    """Case -> (what the service saw, the trace's spans) of ``<library>.json`` and ``<library>.otlp``."""
    truth = json.loads((DATA / f"{library}.json").read_text())["traces"]
    by_id = {spans[0].trace_id: spans for spans in _messages(library)}
    return {t["case"]: (t, by_id[t["trace_id"]]) for t in truth}


def stored_in_end_order(spans: list[OtlpSpan], restore: bool = False) -> dict[str, Any]:
    """The record of one trace whose spans come as an exporter sends them, one message each, by end (the root not
    last: a Spring AI stream's chat span ends after it at times); ``restore``: the trace state packed and restored
    between messages (a restart)."""
    asm = TraceAssembler(OtlpConfig(), JoinConfig(), CapsConfig(), "otlp_spans")
    join = RequestJoin(JoinConfig(), 60_000)
    now = max(s.end_ns for s in spans) / 1e6 + 60_000
    for offset, span in enumerate(sorted(spans, key=lambda s: (s.end_ns, s.span_id))):
        if restore:
            packed = {key: value for key, (_, value) in asm.dirty().items() if value is not None}
            asm = TraceAssembler(OtlpConfig(), JoinConfig(), CapsConfig(), "otlp_spans")
            for key, value in packed.items():
                asm.restore(key, value, 0)
        for out in asm.add_message([span], 0, offset, now):
            assert isinstance(out, ForwardedEvent), out
            event = decode_stage_event(out.value, out.request_id.encode(), "otlp_spans", 0, 0, None, CapsConfig(), now)
            join.add(event, 0, now)  # type: ignore[arg-type]
    (record,) = join.advance(0, now + 10_000_000)
    return record


def stored_record(spans: list[OtlpSpan]) -> tuple[dict[str, Any], TraceAssembler]:
    """The request record one trace becomes (the exporter's order: by end, the root last), and the assembler."""
    asm = TraceAssembler(OtlpConfig(), JoinConfig(), CapsConfig(), "otlp_spans")
    now = max(s.end_ns for s in spans) / 1e6 + 60_000
    ordered = sorted(spans, key=lambda s: (s.is_root, s.end_ns, s.span_id))
    join = RequestJoin(JoinConfig(), 60_000)
    for out in asm.add_message(ordered, 0, 0, now):
        assert isinstance(out, ForwardedEvent), out
        event = decode_stage_event(out.value, out.request_id.encode(), "otlp_spans", 0, 0, None, CapsConfig(), now)
        join.add(event, 0, now)  # type: ignore[arg-type]
    (record,) = join.advance(0, now + 10_000_000)
    return record, asm


def span_ms(spans: list[OtlpSpan], name: str) -> float:
    """The duration of the one span named ``name``."""
    (span,) = [s for s in spans if s.name == name]
    return (span.end_ns - span.start_ns) / 1e6


def first_event_ms(spans: list[OtlpSpan], name: str) -> float:
    """Milliseconds from the start of the span named ``name`` to its first event."""
    (span,) = [s for s in spans if s.name == name]
    return (min(e.time_ns for e in span.events) - span.start_ns) / 1e6
