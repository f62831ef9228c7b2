"""OTLP test traces with ground truth computed from the test's own timings, never by the mapping code.

A :class:`TraceSpec` is one request as a traced service would run it: a root span, retrieval (possibly
retried, each with an embedding child), a rerank, a prompt-assembly span, an LLM span that streams on after
its first chunk, plus HTTP and tool spans that are no stage. It renders as OTLP spans (OpenInference or
GenAI semantic-convention shape) split over several exports in end-time order, as the stage events the
emitter would send for the same request, and as the ``requests`` row docs/design.md's join semantics demand.
"""

from __future__ import annotations

import base64
import random
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from streams.emit import event_json

Shape = Literal["openinference", "gen_ai"]
US = 1_000  # ns per microsecond


@dataclass
class SpanSpec:
    span_id: bytes
    parent: bytes
    name: str
    start_us: int
    end_us: int
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, int]] = field(default_factory=list)  # (name, time_us)


@dataclass
class TraceSpec:
    trace_id: bytes
    tenant: str
    request_id: str | None
    version: str
    shape: Shape
    start_us: int
    retrievals: list[tuple[int, int, int]]  # (start, end, embedding duration) per attempt
    rerank: tuple[int, int]
    prompt: tuple[int, int]
    llm: tuple[int, int, int] | None  # (start, first chunk, end)
    prompt_tokens: int
    ttfc_as_event: bool
    tenant_on_resource: bool
    spans: list[SpanSpec] = field(default_factory=list)
    #: (start, end) of an LLM span that tells no first chunk (its request is ``no_first_chunk``).
    unmeasured: tuple[int, int] | None = None
    ids: dict[str, str] = field(default_factory=dict)

    @property
    def rid(self) -> str:
        return self.request_id or self.trace_id.hex()

    @property
    def end_us(self) -> int:
        return max(s.end_us for s in self.spans)


def build_trace(rng: random.Random, i: int, start_us: int, *, shape: Shape, tenant: str) -> TraceSpec:
    attempts = 2 if rng.random() < 0.2 else 1
    t = start_us + rng.randrange(500, 3_000)
    retrievals = []
    for _ in range(attempts):
        dur = rng.randrange(50_000, 400_000)
        retrievals.append((t, t + dur, rng.randrange(10_000, dur // 2)))
        t += dur + rng.randrange(100, 2_000)
    rerank = (t, t + rng.randrange(10_000, 80_000))
    t = rerank[1] + rng.randrange(100, 1_000)
    prompt = (t, t + rng.randrange(10_000, 150_000))
    t = prompt[1] + rng.randrange(100, 3_000)
    llm = None
    if rng.random() >= 0.1:
        first = t + rng.randrange(300_000, 1_500_000)
        llm = (t, first, first + rng.randrange(500_000, 5_000_000))
    spec = TraceSpec(
        trace_id=rng.randbytes(16),
        tenant=tenant,
        request_id=f"otel-{i:05d}" if i % 3 else None,
        version=("v1", "v2")[i % 2],
        shape=shape,
        start_us=start_us,
        retrievals=retrievals,
        rerank=rerank,
        prompt=prompt,
        llm=llm,
        prompt_tokens=rng.randrange(100, 4_000),
        ttfc_as_event=rng.random() < 0.5,
        tenant_on_resource=i % 2 == 0,
    )
    _add_spans(spec, rng)
    return spec


def _add_spans(spec: TraceSpec, rng: random.Random) -> None:
    root_id = rng.randbytes(8)
    http = rng.randbytes(8)
    end = (spec.llm[2] if spec.llm else spec.prompt[1]) + rng.randrange(1_000, 20_000)
    root_attrs: dict[str, Any] = {"ttft.version_id": spec.version, "ttft.route": "main"}
    if spec.request_id:
        root_attrs["ttft.request_id"] = spec.request_id
    if not spec.tenant_on_resource:
        root_attrs["ttft.tenant_id"] = spec.tenant
    kind = "openinference.span.kind"
    root = SpanSpec(root_id, b"", "POST /ask", spec.start_us, end, root_attrs)
    spans = [root, SpanSpec(http, root_id, "GET /profile", spec.start_us + 100, spec.start_us + 400)]
    for start, stop, embed in spec.retrievals:
        rid = rng.randbytes(8)
        spans.append(SpanSpec(rid, root_id, "retrieve", start, stop, {kind: "RETRIEVER"}))
        spans.append(SpanSpec(rng.randbytes(8), rid, "embed", start + 10, start + 10 + embed, {kind: "EMBEDDING"}))
    spans.append(SpanSpec(rng.randbytes(8), root_id, "rerank", *spec.rerank, {kind: "RERANKER"}))
    spans.append(SpanSpec(rng.randbytes(8), root_id, "tool", *spec.rerank, {kind: "TOOL"}))
    spans.append(SpanSpec(rng.randbytes(8), root_id, "assemble", *spec.prompt, {"ttft.stage": "prompt_assemble"}))
    if spec.llm is not None:
        start, first, stop = spec.llm
        attrs: dict[str, Any] = {"gen_ai.usage.input_tokens": spec.prompt_tokens}
        if spec.shape == "openinference":
            attrs[kind] = "LLM"
        else:
            attrs["gen_ai.operation.name"] = "chat"
            attrs["gen_ai.request.model"] = "gpt-x"
        events: list[tuple[str, int]] = []
        if spec.ttfc_as_event or spec.shape == "openinference":
            name = "First Token Stream Event" if spec.shape == "openinference" else "gen_ai.first_chunk"
            events.append((name, first))
        else:
            attrs["gen_ai.response.time_to_first_chunk"] = (first - start) / 1e6
        spans.append(SpanSpec(rng.randbytes(8), root_id, "llm", start, stop, attrs, events))
    spec.spans = spans


def resource_attrs(spec: TraceSpec) -> dict[str, Any]:
    attrs: dict[str, Any] = {"service.name": "rag-api", "service.version": "ignored-by-ttft-version"}
    if spec.tenant_on_resource:
        attrs["tenant.id"] = spec.tenant
    return attrs


def exports(spec: TraceSpec, rng: random.Random, pieces: int) -> list[list[SpanSpec]]:
    """The trace's spans in end-time order, cut into ``pieces`` exports (the root always in the last)."""
    ordered = sorted(spec.spans, key=lambda s: (s.end_us, s.parent == b""))
    if pieces <= 1:
        return [ordered]
    cuts = sorted(rng.sample(range(1, len(ordered)), min(pieces - 1, len(ordered) - 1)))
    return [ordered[a:b] for a, b in zip([0, *cuts], [*cuts, len(ordered)], strict=True)]


def request_message(spec: TraceSpec, spans: list[SpanSpec]) -> ExportTraceServiceRequest:
    msg = ExportTraceServiceRequest()
    rs = ResourceSpans()
    rs.resource.attributes.extend(_kvs(resource_attrs(spec)))
    scope = ScopeSpans()
    for s in spans:
        span = Span(
            trace_id=spec.trace_id,
            span_id=s.span_id,
            parent_span_id=s.parent,
            name=s.name,
            start_time_unix_nano=s.start_us * US,
            end_time_unix_nano=s.end_us * US,
        )
        span.attributes.extend(_kvs(s.attributes))
        for name, at in s.events:
            event = span.events.add()
            event.name, event.time_unix_nano = name, at * US
        scope.spans.append(span)
    rs.scope_spans.append(scope)
    msg.resource_spans.append(rs)
    return msg


def otlp_json(msg: ExportTraceServiceRequest) -> bytes:
    """OTLP/JSON as the Collector writes it: camelCase, hex ids, int64 as strings, enums as integers."""
    doc = json_format.MessageToDict(msg, use_integers_for_enums=True)
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return orjson.dumps(doc)


def _kvs(attrs: dict[str, Any]) -> list[KeyValue]:
    out = []
    for key, value in attrs.items():
        if isinstance(value, bool):
            v = AnyValue(bool_value=value)
        elif isinstance(value, int):
            v = AnyValue(int_value=value)
        elif isinstance(value, float):
            v = AnyValue(double_value=value)
        else:
            v = AnyValue(string_value=str(value))
        out.append(KeyValue(key=key, value=v))
    return out


def _span(spec: TraceSpec, name: str) -> list[SpanSpec]:
    return [s for s in spec.spans if s.name == name]


def emitter_events(spec: TraceSpec) -> list[tuple[bytes, bytes]]:
    """The same request as the emitter would publish it (event ids = the span ids, times from the spec)."""
    rid, trace = spec.rid, spec.trace_id.hex()
    common: dict[str, Any] = {"version_id": spec.version, "route": "main", "rollout": "stable"}

    def ev(stage: str, span: SpanSpec, ts_us: int, dur_us: int | None, attrs: dict[str, Any]) -> bytes:
        return event_json(
            rid,
            spec.tenant,
            stage,
            ts_us / 1000,
            None if dur_us is None else dur_us / 1000,
            event_id=span.span_id.hex(),
            attrs={**attrs, "trace_id": trace},
            **common,
        )

    root = _span(spec, "POST /ask")[0]
    out = [ev("request_start", root, root.start_us, None, {})]
    for s in _span(spec, "retrieve"):
        out.append(ev("retrieval", s, s.start_us, s.end_us - s.start_us, {}))
    for s in _span(spec, "embed"):
        out.append(ev("vector_recall", s, s.start_us, s.end_us - s.start_us, {}))
    for s in _span(spec, "rerank"):
        out.append(ev("rerank", s, s.start_us, s.end_us - s.start_us, {}))
    for s in _span(spec, "assemble"):
        out.append(ev("prompt_assemble", s, s.start_us, s.end_us - s.start_us, {}))
    if spec.llm is not None:
        s = _span(spec, "llm")[0]
        start, first, _ = spec.llm
        out.append(ev("llm_ttft", s, start, first - start, {"prompt_tokens": spec.prompt_tokens}))
        out.append(ev("first_token", s, first, None, {"prompt_tokens": spec.prompt_tokens}))
    elif spec.unmeasured is not None:
        s = _span(spec, "llm")[0]
        start, end = spec.unmeasured
        out.append(ev("llm_unmeasured", s, start, end - start, {"prompt_tokens": spec.prompt_tokens}))
    return [(rid.encode(), value) for value in out]


def truth_row(spec: TraceSpec) -> dict[str, Any]:
    """The ``requests`` row the join must store for this trace (docs/design.md join semantics)."""
    retrieval = sum(b - a for a, b, _ in spec.retrievals) / 1000
    prompt = (spec.prompt[1] - spec.prompt[0]) / 1000
    row: dict[str, Any] = {
        "request_id": spec.rid,
        "tenant_id": spec.tenant,
        "version_id": spec.version,
        "route": "main",
        "rollout": "stable",
        "started_at": spec.start_us / 1000,
        "retrieval_ms": retrieval,
        "vector_recall_ms": sum(e for _, _, e in spec.retrievals) / 1000,
        "rerank_ms": (spec.rerank[1] - spec.rerank[0]) / 1000,
        "prompt_assemble_ms": prompt,
        "trace_id": spec.trace_id.hex(),
    }
    if spec.llm is None and spec.unmeasured is not None:
        start, end = spec.unmeasured
        row.update(status="no_first_chunk", first_token_at=None, ttft_ms=None, llm_ttft_ms=None)
        row.update(llm_unmeasured_ms=(end - start) / 1000, prompt_tokens=spec.prompt_tokens)
        return row
    if spec.llm is None:
        row.update(status="timed_out", first_token_at=None, ttft_ms=None, llm_ttft_ms=None, prompt_tokens=None)
        return row
    start, first, _ = spec.llm
    ttft = (first - spec.start_us) / 1000
    llm = (first - start) / 1000
    row.update(
        status="complete",
        missing_stages=[],
        first_token_at=first / 1000,
        ttft_ms=ttft,
        llm_ttft_ms=llm,
        other_ms=ttft - (retrieval + prompt + llm),
        prompt_tokens=spec.prompt_tokens,
    )
    return row
