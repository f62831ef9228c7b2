"""What one OTLP span says for the stage-event mapping (DESIGN.md, "OpenTelemetry spans"), as plain data.

A span is read once, when it arrives, into a :class:`SpanNote`: the stage it maps to (if any), its time to
first chunk for an LLM span, the well-known attrs it carries and the context attributes (request id,
tenant, version, rollout, route) found on it. The trace assembler (:mod:`streams.core.otlp_traces`) holds
the notes of a trace and, once the trace is resolved, turns them into stage-event dicts with
:func:`stage_event` and the trace's :class:`TraceContext`.

Attributes are read from the span first, then its resource (:class:`schemas.otlp.OtlpSpan` has merged
them so). A context value is taken, per event, from the span's own attributes, else from the trace: the
root span's, else the earliest-starting span's (ties by span id), so the result never depends on the
order in which the exporter sent the spans.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from schemas.otlp import AttrValue, OtlpSpan
from schemas.vocabulary import is_stage_name

#: Context fields and, per field, the attributes that supply it, first match wins.
CONTEXT_ATTRS: Final[dict[str, tuple[str, ...]]] = {
    "request_id": ("ttft.request_id",),
    "tenant_id": ("ttft.tenant_id", "tenant.id"),
    "version_id": ("ttft.version_id", "service.version"),
    "rollout": ("ttft.rollout",),
    "route": ("ttft.route", "gen_ai.request.model"),
    "fallback_level": ("ttft.fallback_level",),
}
_CONTEXT_NAMES: Final = frozenset(name for names in CONTEXT_ATTRS.values() for name in names)
#: ``ttft.*`` attributes that are mapping inputs, not request attrs.
_NOT_ATTRS: Final = frozenset({"ttft.stage", *(n for n in _CONTEXT_NAMES if n.startswith("ttft."))})
#: ``openinference.span.kind`` -> stage (``EMBEDDING`` only inside a retriever, see :data:`EMBEDDING`).
OPENINFERENCE_STAGES: Final[dict[str, str]] = {"RETRIEVER": "retrieval", "RERANKER": "rerank", "LLM": "llm_ttft"}
GEN_AI_LLM_OPERATIONS: Final = frozenset({"chat", "text_completion", "generate_content"})
FIRST_CHUNK_EVENTS: Final = frozenset({"gen_ai.first_chunk", "First Token Stream Event"})
#: The provisional stage of an ``EMBEDDING`` span: ``vector_recall`` if a retriever span encloses it.
EMBEDDING: Final = "~embedding"
RETRIEVER_KIND: Final = "RETRIEVER"
#: Token-count attributes -> the request attrs they fill, first match wins.
_TOKEN_ATTRS: Final[dict[str, tuple[str, ...]]] = {
    "prompt_tokens": ("gen_ai.usage.input_tokens",),
    "cached_tokens": ("gen_ai.usage.cache_read_input_tokens", "gen_ai.usage.cached_tokens"),
}


@dataclass(slots=True)
class SpanNote:
    """One span, reduced to what the mapping needs (packed into the trace's changelog state)."""

    span_id: str
    parent: str
    start_ns: int
    end_ns: int
    offset: int
    stage: str | None
    retriever: bool = False
    first_chunk_ns: int | None = None
    attrs: dict[str, AttrValue] = field(default_factory=dict)
    context: dict[str, AttrValue] = field(default_factory=dict)

    def pack(self) -> list[Any]:
        return [
            self.span_id,
            self.parent,
            self.start_ns,
            self.end_ns,
            self.offset,
            self.stage,
            self.retriever,
            self.first_chunk_ns,
            self.attrs,
            self.context,
        ]

    @classmethod
    def unpack(cls, row: list[Any]) -> SpanNote:
        return cls(*row)


def note_span(span: OtlpSpan, offset: int) -> SpanNote:
    """Read one span: its stage (or ``None``), first chunk, attrs and context attributes."""
    a = span.attributes
    stage = _stage_of(a)
    first_chunk = _first_chunk_ns(span) if stage == "llm_ttft" else None
    context = {name: a[name] for name in _CONTEXT_NAMES if name in a}
    return SpanNote(
        span_id=span.span_id,
        parent=span.parent_span_id,
        start_ns=span.start_ns,
        end_ns=span.end_ns,
        offset=offset,
        stage=stage,
        retriever=a.get("openinference.span.kind") == RETRIEVER_KIND,
        first_chunk_ns=first_chunk,
        attrs=_request_attrs(a),
        context=context,
    )


def _stage_of(a: dict[str, AttrValue]) -> str | None:
    explicit = a.get("ttft.stage")
    if isinstance(explicit, str) and is_stage_name(explicit):
        return explicit
    kind = a.get("openinference.span.kind")
    if isinstance(kind, str):
        if kind == "EMBEDDING":
            return EMBEDDING
        if kind in OPENINFERENCE_STAGES:
            return OPENINFERENCE_STAGES[kind]
    if a.get("gen_ai.operation.name") in GEN_AI_LLM_OPERATIONS:
        return "llm_ttft"
    return None


def _first_chunk_ns(span: OtlpSpan) -> int | None:
    """When the first chunk came: ``gen_ai.response.time_to_first_chunk`` (seconds after the start), else
    the earliest first-chunk span event; ``None`` when the span says neither."""
    seconds = span.attributes.get("gen_ai.response.time_to_first_chunk")
    if isinstance(seconds, int | float) and not isinstance(seconds, bool):
        return span.start_ns + round(seconds * 1e9)
    times = [e.time_ns for e in span.events if e.name in FIRST_CHUNK_EVENTS]
    return min(times) if times else None


def _request_attrs(a: dict[str, AttrValue]) -> dict[str, AttrValue]:
    out: dict[str, AttrValue] = {}
    for target, names in _TOKEN_ATTRS.items():
        for name in names:
            if name in a:
                out[target] = a[name]
                break
    for name, value in a.items():
        if name.startswith("ttft.") and name not in _NOT_ATTRS:
            out[name[5:]] = value
    return out


@dataclass(slots=True)
class TraceContext:
    """What the trace as a whole says: context values, the request's start and how first_token is told."""

    trace_id: str
    values: dict[str, AttrValue]
    request_start_span: str | None
    explicit_first_token: bool
    retrievers: frozenset[str]
    parents: dict[str, str]

    @property
    def request_id(self) -> str:
        """``ttft.request_id`` if any span has it, else the trace id."""
        value = self.values.get("ttft.request_id")
        return value if isinstance(value, str) and value else self.trace_id

    def lookup(self, note: SpanNote, field_name: str) -> AttrValue | None:
        """A context field for ``note``'s event: per attribute name, the span's own, else the trace's."""
        for name in CONTEXT_ATTRS[field_name]:
            if name in note.context:
                return note.context[name]
            if name in self.values:
                return self.values[name]
        return None

    def inside_retriever(self, note: SpanNote) -> bool:
        """True when a retriever span encloses ``note`` (its parent chain, as far as it is known)."""
        seen: set[str] = set()
        parent = note.parent
        while parent and parent not in seen:
            if parent in self.retrievers:
                return True
            seen.add(parent)
            parent = self.parents.get(parent, "")
        return False


def ns_to_ms(ns: int) -> float:
    """Epoch ns as epoch ms, rounded once (``ns / 1e6`` would first round ns, past 2**53, to 256 ns)."""
    return ns // 1_000_000 + (ns % 1_000_000) / 1e6


class Unmappable(ValueError):
    """A stage span that cannot become a stage event; ``reason`` is its dead-letter reason code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def stage_of(note: SpanNote, ctx: TraceContext) -> str | None:
    """The stage ``note`` maps to in its trace, or ``None`` for a span that is no stage."""
    if note.stage == EMBEDDING:
        return "vector_recall" if ctx.inside_retriever(note) else None
    return note.stage


def stage_events(note: SpanNote, stage: str, ctx: TraceContext) -> list[dict[str, Any]]:
    """The stage events of one stage span (an ``llm_ttft`` span also gives ``first_token``, unless a span
    of the trace sets it explicitly); raises :class:`Unmappable`."""
    ms = ns_to_ms(note.start_ns)
    if stage == "llm_ttft":
        if note.first_chunk_ns is None:
            raise Unmappable("no_first_chunk", "LLM span without time_to_first_chunk or a first-chunk event")
        ttfc = (note.first_chunk_ns - note.start_ns) / 1e6
        events = [_event(note, ctx, stage, ms, ttfc)]
        if not ctx.explicit_first_token:
            events.append(_event(note, ctx, "first_token", ns_to_ms(note.first_chunk_ns), None))
        return events
    if stage in ("request_start", "first_token"):
        return [_event(note, ctx, stage, ms, None)]
    return [_event(note, ctx, stage, ms, (note.end_ns - note.start_ns) / 1e6)]


def request_start_event(note: SpanNote, ctx: TraceContext) -> dict[str, Any]:
    """The ``request_start`` instant at the start of the root span ``note``."""
    return _event(note, ctx, "request_start", ns_to_ms(note.start_ns), None)


def _event(note: SpanNote, ctx: TraceContext, stage: str, ts_ms: float, duration_ms: float | None) -> dict[str, Any]:
    """A stage-event dict with exactly the fields :func:`streams.emit.event_json` writes."""
    tenant = ctx.lookup(note, "tenant_id")
    if not isinstance(tenant, str) or not tenant:
        raise Unmappable("missing_tenant", "no ttft.tenant_id or tenant.id on the span, its resource or its trace")
    event: dict[str, Any] = {"request_id": ctx.request_id, "tenant_id": tenant, "stage": stage, "ts_ms": ts_ms}
    if duration_ms is not None:
        event["duration_ms"] = duration_ms
    version = ctx.lookup(note, "version_id")
    if version is not None:
        event["version_id"] = version
    route = ctx.lookup(note, "route")
    if route is not None:
        event["route"] = route
    rollout = ctx.lookup(note, "rollout")
    event["rollout"] = "stable" if rollout is None else rollout
    fallback = ctx.lookup(note, "fallback_level")
    if fallback is not None:
        event["fallback_level"] = fallback
    event["event_id"] = note.span_id
    event["attrs"] = {**note.attrs, "trace_id": ctx.trace_id}
    return event
