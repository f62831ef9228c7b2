"""What the trace assembler (:mod:`streams.core.otlp_traces`) emits and counts: forwarded stage events, and
the dead letters of spans, built here so the assembler keeps to holding and resolving traces (pure; no Kafka).

A span refused on arrival is dead-lettered as decoded (:func:`span_dead_letter`); a held or late span that
cannot map, as the mapping read it (:func:`note_dead_letter`). Both carry the span's trace and span ids.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Final

import orjson

from schemas.dead_letter import DeadLetter, DeadLetterReason, make_dead_letter
from schemas.otlp import OtlpSpan
from streams.core.otlp_mapping import SpanNote, TraceContext, own_tenant
from streams.core.otlp_state import TraceState
from streams.settings import CapsConfig

#: Span outcomes counted by :attr:`AssemblerCounters.spans`.
SPAN_OUTCOMES: Final = ("stage", "not_stage", "nested", "dead_letter", "replayed")
#: Instrumentation scopes counted apart in :attr:`AssemblerCounters.no_first_chunk` (scope names come from the
#: input: the rest are counted as one, :data:`OTHER_SCOPE`, so a metric label cannot grow without bound).
MAX_SCOPES: Final = 64
OTHER_SCOPE: Final = ("__other__", "")
_SCOPE_CHARS: Final = 128


@dataclass(frozen=True, slots=True)
class ForwardedEvent:
    """A validated stage event for ``ttft.stage-events``: Kafka key = ``request_id``, value = ``value``."""

    request_id: str
    value: bytes


Output = ForwardedEvent | DeadLetter


@dataclass(slots=True)
class AssemblerCounters:
    """Monotonic counts: spans by outcome, tripped caps, and LLM spans without a first chunk (forwarded as
    ``llm_unmeasured``) per instrumentation scope ``(name, version)``: what a team must fix, and in which
    library."""

    spans: Counter[str] = field(default_factory=Counter)
    caps: Counter[str] = field(default_factory=Counter)
    no_first_chunk: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: Traces resolved that start at a stage span: one span alone, or a retrieval (rerank, embedding) root without an
    #: LLM span. A request's part cut off by lost context is one (``ttft otel check``: "a trace that starts at a stage
    #: span"); so is a batch job's single call.
    cut_off: int = 0

    def count_no_first_chunk(self, scope_name: str, scope_version: str) -> None:
        """One more LLM span of this scope without a first chunk (past :data:`MAX_SCOPES`: :data:`OTHER_SCOPE`)."""
        scope = (scope_name[:_SCOPE_CHARS], scope_version[:_SCOPE_CHARS])
        if scope not in self.no_first_chunk and len(self.no_first_chunk) >= MAX_SCOPES:
            scope = OTHER_SCOPE
        self.no_first_chunk[scope] += 1


@dataclass(frozen=True, slots=True)
class SpanLetters:
    """Where the assembler's dead letters point (the OTLP topic) and how much of the original they keep."""

    topic: str
    caps: CapsConfig

    def of_note(
        self,
        state: TraceState,
        note: SpanNote,
        reason: DeadLetterReason,
        detail: str,
        now_ms: float,
        ctx: TraceContext | None = None,
    ) -> DeadLetter:
        """A dead letter for a held or late span of ``state``; its ``original`` is the span as the mapping read
        it (JSON)."""
        trace_id = state.trace_id
        tenant = None if ctx is None else ctx.tenant_of(note)
        original = orjson.dumps(
            {
                "trace_id": trace_id,
                "span_id": note.span_id,
                "parent_span_id": note.parent,
                "start_time_unix_nano": note.start_ns,
                "end_time_unix_nano": note.end_ns,
                "stage": note.stage,
                "first_chunk_unix_nano": note.first_chunk_ns,
                "streaming": note.streaming,
                "scope": [note.scope_name, note.scope_version],
                "context_attributes": note.context,
                "attrs": note.attrs,
            }
        )
        return make_dead_letter(
            reason,
            f"trace {trace_id} span {note.span_id}: {detail}",
            original,
            topic=self.topic,
            partition=state.partition,
            offset=note.offset,
            kafka_timestamp_ms=None,
            max_original_bytes=self.caps.dead_letter_bytes,
            received_at_ms=now_ms,
            request_id=None if ctx is None else ctx.request_id,
            tenant_id=tenant if isinstance(tenant, str) else None,
            trace_id=trace_id,
            span_id=note.span_id,
        )

    def of_span(
        self, span: OtlpSpan, partition: int, offset: int, now_ms: float, reason: DeadLetterReason, detail: str
    ) -> DeadLetter:
        """A dead letter for a span refused on arrival; its ``original`` is the span as decoded (JSON)."""
        try:
            original = orjson.dumps(
                {
                    "trace_id": span.trace_id,
                    "span_id": span.span_id,
                    "parent_span_id": span.parent_span_id,
                    "name": span.name[:256],
                    "start_time_unix_nano": span.start_ns,
                    "end_time_unix_nano": span.end_ns,
                    "scope": [span.scope_name[:256], span.scope_version[:256]],
                    "attributes": span.attributes,
                }
            )
        except Exception:
            original = b""
        tenant = own_tenant(span.attributes)
        return make_dead_letter(
            reason,
            f"trace {span.trace_id} span {span.span_id}: {detail}",
            original,
            topic=self.topic,
            partition=partition,
            offset=offset,
            kafka_timestamp_ms=None,
            max_original_bytes=self.caps.dead_letter_bytes,
            received_at_ms=now_ms,
            tenant_id=tenant or None,
            trace_id=span.trace_id,
            span_id=span.span_id,
        )


def unmappable_reason(code: str) -> DeadLetterReason:
    """A reason code of :class:`streams.core.otlp_mapping.Unmappable` as the dead letter's type."""
    if code == "missing_tenant":
        return "missing_tenant"
    raise ValueError(f"unknown unmappable reason {code!r}")


def exc_text(exc: BaseException) -> str:
    """An exception as a dead letter's detail: its type and the first 200 characters of its message."""
    return f"{type(exc).__name__}: {str(exc)[:200]}"
