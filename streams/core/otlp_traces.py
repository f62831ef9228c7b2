"""The trace assembler: OTLP spans in, stage events (and dead letters) out, per trace (pure; no Kafka).

Spans are exported when they end, so a trace arrives in several messages, children first and the LLM and
root spans last. The assembler holds each trace's stage spans and the context any of its spans carries
(:mod:`streams.core.otlp_state`) until the trace is *resolved*:

- when its root span (no parent) arrives, at the end of the message that carried it; or
- when the input partition's watermark passes the trace's last span end plus the join's grace, once a
  span told the first token; a trace whose LLM span has not come yet (it ends, and is exported, only when
  it stops streaming) waits until the join's request timeout after its first span start, when the join
  would call it timed out anyway. The watermark is the latest span end seen on the partition, moved on
  by an idle tick (wall time) when the partition has no backlog, as the join does; no span moves it
  further than the join's lead past the clock.

Resolving maps every held stage span (docs/design.md table, :mod:`streams.core.otlp_mapping`) and validates
each event as the join will (:func:`schemas.decode.decode_stage_event`). A stage span that cannot map is
dead-lettered with its trace and span ids; spans that are no stage are only counted. A resolved trace is
remembered until the watermark passes its last span end plus the join's ``forget_after_ms``: a late span
is mapped with the remembered context and forwarded (the join handles lateness), a replayed one (same
span id) is recognised and skipped. Held and remembered traces are capped (``otlp.max_traces``: the
oldest is resolved early or forgotten) as are spans per trace (``otlp.max_spans_per_trace``), counted.

Outputs are independent of how the trace's spans were split over messages and of their order within a
message, as long as the root comes last (the exporter's end-time order).
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from typing import Final

import orjson

from schemas.dead_letter import DeadLetter, DeadLetterReason, make_dead_letter
from schemas.decode import decode_stage_event
from schemas.otlp import OtlpSpan
from streams.core.otlp_mapping import (
    SpanNote,
    TraceContext,
    Unmappable,
    derived_prompt_assemble,
    is_unmeasured,
    note_span,
    stage_events,
    stage_of,
)
from streams.core.otlp_mapping import request_start_event as root_event
from streams.core.otlp_state import TraceState
from streams.settings import CapsConfig, JoinConfig, OtlpConfig

_NS_PER_MS: Final = 1_000_000
#: Span outcomes counted by :attr:`AssemblerCounters.spans`.
SPAN_OUTCOMES: Final = ("stage", "not_stage", "dead_letter", "replayed")
#: Instrumentation scopes counted apart in :attr:`AssemblerCounters.no_first_chunk` (scope names come from the
#: input: the rest are counted as one, :data:`OTHER_SCOPE`, so a metric label cannot grow without bound).
MAX_SCOPES: Final = 64
OTHER_SCOPE: Final = ("__other__", "")
_SCOPE_CHARS: Final = 128
_OVER_SPAN_CAP: Final = "trace over otlp.max_spans_per_trace"


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

    def count_no_first_chunk(self, scope_name: str, scope_version: str) -> None:
        """One more LLM span of this scope without a first chunk (past :data:`MAX_SCOPES`: :data:`OTHER_SCOPE`)."""
        scope = (scope_name[:_SCOPE_CHARS], scope_version[:_SCOPE_CHARS])
        if scope not in self.no_first_chunk and len(self.no_first_chunk) >= MAX_SCOPES:
            scope = OTHER_SCOPE
        self.no_first_chunk[scope] += 1


@dataclass(slots=True)
class _Partition:
    watermark_ns: int = 0
    idle_base_ns: int = 0
    last_wall_ms: float | None = None
    deadlines: list[tuple[int, str]] = field(default_factory=list)


class TraceAssembler:
    """Folds decoded spans into traces and emits their stage events (see the module docstring)."""

    def __init__(self, otlp: OtlpConfig, join: JoinConfig, caps: CapsConfig, topic: str) -> None:
        self.otlp, self.join, self.caps, self.topic = otlp, join, caps, topic
        self.counters = AssemblerCounters()
        self._traces: dict[str, TraceState] = {}
        self._partitions: dict[int, _Partition] = {}
        self._dirty: dict[str, int] = {}

    # --- queries ----------------------------------------------------------------------------------

    @property
    def held_traces(self) -> int:
        """Traces waiting for their root or the watermark (a scan: read once per batch, for the gauge)."""
        return sum(1 for t in self._traces.values() if not t.resolved)

    @property
    def held_spans(self) -> int:
        """Span notes held in those traces."""
        return sum(len(t.notes) + (t.root is not None) for t in self._traces.values() if not t.resolved)

    def dirty(self) -> dict[str, tuple[int, bytes | None]]:
        """Trace id -> (partition, packed state or ``None`` for a forgotten trace) changed since the last
        call; the caller writes them to the changelog."""
        out: dict[str, tuple[int, bytes | None]] = {}
        for trace_id, partition in self._dirty.items():
            state = self._traces.get(trace_id)
            out[trace_id] = (partition, None if state is None else state.pack())
        self._dirty.clear()
        return out

    def has_dirty(self) -> bool:
        """Some trace changed since :meth:`dirty` was last called."""
        return bool(self._dirty)

    # --- folding ----------------------------------------------------------------------------------

    def add_message(self, spans: list[OtlpSpan], partition: int, offset: int, now_ms: float) -> list[Output]:
        """Fold the spans of one message; traces whose root it carried are resolved after all its spans, and
        the late spans of resolved traces are mapped once the message's parent links are known (an embedding
        span sent before its retriever in the same message is still ``vector_recall``)."""
        part = self._partition(partition)
        out: list[Output] = []
        roots: list[str] = []
        late: list[tuple[TraceState, SpanNote, bool]] = []
        for span in spans:
            note = note_span(span, offset)
            self._raise(part, note.end_ns, now_ms)
            state = self._traces.get(span.trace_id)
            if state is None:
                state = self._new_trace(span.trace_id, partition, out, now_ms)
            elif state.resolved:
                late.append((state, note, span.is_root))
                continue
            if self._hold(state, note, span.is_root, out, now_ms) and span.is_root:
                roots.append(span.trace_id)
        for state, note, is_root in late:
            state.learn(note, is_root)
        for state, note, is_root in late:
            out.extend(self._late(state, note, is_root, now_ms))
        for trace_id in roots:
            state = self._traces.get(trace_id)
            if state is not None and not state.resolved:
                out.extend(self._resolve(state, now_ms))
        return out

    def advance(self, partition: int, now_ms: float) -> list[Output]:
        """Apply the idle tick to ``partition`` and resolve (or forget) the traces its watermark passed."""
        part = self._partitions.get(partition)
        if part is None:
            return []
        if part.last_wall_ms is None:
            part.last_wall_ms, part.idle_base_ns = now_ms, part.watermark_ns
        elif now_ms - part.last_wall_ms >= self.join.idle_tick_ms:
            ticked = part.idle_base_ns + round((now_ms - part.last_wall_ms) * _NS_PER_MS)
            part.watermark_ns = max(part.watermark_ns, ticked)
        out: list[Output] = []
        heap = part.deadlines
        while heap and heap[0][0] <= part.watermark_ns:
            deadline, trace_id = heapq.heappop(heap)
            state = self._traces.get(trace_id)
            if state is None or state.deadline_ns != deadline or state.partition != partition:
                continue
            if state.resolved:
                self._forget(trace_id)
            else:
                out.extend(self._resolve(state, now_ms))
        return out

    def _partition(self, partition: int) -> _Partition:
        part = self._partitions.get(partition)
        if part is None:
            part = self._partitions[partition] = _Partition()
        return part

    def _raise(self, part: _Partition, end_ns: int, now_ms: float) -> None:
        lead_ns = round((now_ms + self.join.max_watermark_lead_ms) * _NS_PER_MS)
        part.watermark_ns = max(part.watermark_ns, min(end_ns, lead_ns))
        part.idle_base_ns, part.last_wall_ms = part.watermark_ns, now_ms

    def _new_trace(self, trace_id: str, partition: int, out: list[Output], now_ms: float) -> TraceState:
        while len(self._traces) >= self.otlp.max_traces:
            oldest = self._traces[next(iter(self._traces))]
            if oldest.resolved:
                self.counters.caps["otlp_remembered_traces"] += 1
                self._forget(oldest.trace_id)
            else:
                self.counters.caps["otlp_held_traces"] += 1
                out.extend(self._resolve(oldest, now_ms))
                self._forget(oldest.trace_id)
        state = self._traces[trace_id] = TraceState(trace_id, partition)
        return state

    def _hold(self, state: TraceState, note: SpanNote, is_root: bool, out: list[Output], now_ms: float) -> bool:
        """Keep ``note`` in a held trace; False when the per-trace cap refused it."""
        if note.span_id in state.handled:  # a replayed span that is no stage
            self.counters.spans["replayed"] += 1
            return False
        known = note.span_id in state.notes or (state.root is not None and state.root.span_id == note.span_id)
        if not known and state.span_count >= self.otlp.max_spans_per_trace:
            self.counters.caps["otlp_spans_per_trace"] += 1
            if note.stage is not None:
                self.counters.spans["dead_letter"] += 1
                out.append(self._dead_letter(state, note, "too_many_events", _OVER_SPAN_CAP, now_ms))
            else:
                self.counters.spans["not_stage"] += 1
            return False
        state.learn(note, is_root)
        if is_root:
            state.root = note
        if note.stage is not None:
            state.notes[note.span_id] = note
        elif not is_root:
            self.counters.spans["not_stage"] += 1
            state.handled.add(note.span_id)
        state.last_end_ns = max(state.last_end_ns, note.end_ns)
        state.first_start_ns = min(state.first_start_ns or note.start_ns, note.start_ns)
        due = self._due(state)
        # A trace lives on the partition it was first seen on (the Collector partitions by trace id).
        home = self._partition(state.partition)
        if due != state.deadline_ns:
            state.deadline_ns = due
            heapq.heappush(home.deadlines, (due, state.trace_id))
        self._touch(state, home)
        return True

    def _due(self, state: TraceState) -> int:
        return resolve_due_ns(state.first_start_ns, state.last_end_ns, state.first_token_known, self.join)

    def _touch(self, state: TraceState, part: _Partition) -> None:
        state.watermark_ns = part.watermark_ns
        self._dirty[state.trace_id] = state.partition

    # --- resolution -------------------------------------------------------------------------------

    def _resolve(self, state: TraceState, now_ms: float) -> list[Output]:
        """Map every held span of ``state``, then remember it (context, handled span ids) until forgotten."""
        ctx = state.trace_context()
        out: list[Output] = []
        root = state.root
        if root is not None and ctx.request_start_span == root.span_id:
            out.extend(self._start_events(state, root, ctx, now_ms))
        for note in sorted(state.notes.values(), key=lambda n: (n.start_ns, n.span_id)):
            out.extend(self._map(state, note, ctx, now_ms))
        out.extend(self._derived_prompt(state, ctx, now_ms))
        if state.root is not None:
            if state.root.span_id not in state.handled:
                self.counters.spans["not_stage"] += 1
            state.handled.add(state.root.span_id)
        state.first_token_explicit = ctx.explicit_first_token
        state.resolved = True
        state.notes.clear()
        state.root = None
        part = self._partition(state.partition)
        state.deadline_ns = max(state.last_end_ns, part.watermark_ns) + self.join.forget_after_ms * _NS_PER_MS
        heapq.heappush(part.deadlines, (state.deadline_ns, state.trace_id))
        self._touch(state, part)
        return out

    def _late(self, state: TraceState, note: SpanNote, is_root: bool, now_ms: float) -> list[Output]:
        """A span of a remembered trace: skipped if already handled, else mapped with the kept context."""
        if note.span_id in state.handled:
            self.counters.spans["replayed"] += 1
            return []
        if state.span_count >= self.otlp.max_spans_per_trace:
            self.counters.caps["otlp_spans_per_trace"] += 1
            if note.stage is None:
                self.counters.spans["not_stage"] += 1
                return []
            self.counters.spans["dead_letter"] += 1
            return [self._dead_letter(state, note, "too_many_events", _OVER_SPAN_CAP, now_ms)]
        state.learn(note, is_root)
        ctx = state.trace_context()
        out: list[Output] = []
        starts = (is_root or note.stage == "request_start") and not state.started
        if starts:
            out.extend(self._start_events(state, note, ctx, now_ms))
        if note.stage not in (None, "request_start"):
            out.extend(self._map(state, note, ctx, now_ms))
        elif not starts:
            self.counters.spans["not_stage"] += 1
        state.handled.add(note.span_id)
        self._touch(state, self._partition(state.partition))
        return out

    def _start_events(self, state: TraceState, note: SpanNote, ctx: TraceContext, now_ms: float) -> list[Output]:
        """The request_start instant at ``note``'s start (the root, or a ``ttft.stage = request_start`` span)."""
        state.started = True
        state.handled.add(note.span_id)
        try:
            event = root_event(note, ctx)
        except Unmappable as exc:
            self.counters.spans["dead_letter"] += 1
            return [self._dead_letter(state, note, _reason(exc.reason), str(exc), now_ms, ctx)]
        return self._validated(state, note, [event], ctx, now_ms)

    def _derived_prompt(self, state: TraceState, ctx: TraceContext, now_ms: float) -> list[Output]:
        """The derived ``prompt_assemble`` of a trace without a prompt span (no span of its own: not counted
        as one; a trace without a tenant has its spans dead-lettered already)."""
        try:
            derived = derived_prompt_assemble(state.notes.values(), ctx)
        except Unmappable:
            return []
        if derived is None:
            return []
        llm, event = derived
        return self._validated(state, llm, [event], ctx, now_ms, span=False)

    def _map(self, state: TraceState, note: SpanNote, ctx: TraceContext, now_ms: float) -> list[Output]:
        """The events of one held or late span (nothing for a span that turns out to be no stage)."""
        state.handled.add(note.span_id)
        stage = stage_of(note, ctx)
        if stage is None:
            self.counters.spans["not_stage"] += 1
            return []
        if stage == "request_start":
            return [] if state.started else self._start_events(state, note, ctx, now_ms)
        if is_unmeasured(note):  # forwarded as llm_unmeasured; the scope is what a team must fix
            self.counters.count_no_first_chunk(note.scope_name, note.scope_version)
        try:
            events = stage_events(note, stage, ctx)
        except Unmappable as exc:
            self.counters.spans["dead_letter"] += 1
            return [self._dead_letter(state, note, _reason(exc.reason), str(exc), now_ms, ctx)]
        return self._validated(state, note, events, ctx, now_ms)

    def _validated(
        self,
        state: TraceState,
        note: SpanNote,
        events: list[dict[str, object]],
        ctx: TraceContext,
        now_ms: float,
        *,
        span: bool = True,
    ) -> list[Output]:
        """Each event as the join will decode it; one that fails is dead-lettered with the span's ids. The
        span counts as a stage span, or as dead-lettered when any of its events failed (``span`` false: the
        events are derived from the trace, and count as no span)."""
        out: list[Output] = []
        for event in events:
            value = orjson.dumps(event)
            key = ctx.request_id.encode()
            decoded = decode_stage_event(value, key, self.topic, state.partition, note.offset, None, self.caps, now_ms)
            if isinstance(decoded, DeadLetter):
                out.append(decoded.model_copy(update={"trace_id": state.trace_id, "span_id": note.span_id}))
            else:
                out.append(ForwardedEvent(ctx.request_id, value))
        if span:
            failed = any(isinstance(o, DeadLetter) for o in out)
            self.counters.spans["dead_letter" if failed else "stage"] += 1
        return out

    def _dead_letter(
        self,
        state: TraceState,
        note: SpanNote,
        reason: DeadLetterReason,
        detail: str,
        now_ms: float,
        ctx: TraceContext | None = None,
    ) -> DeadLetter:
        """A dead letter for one span; its ``original`` is the span as the mapping read it (JSON)."""
        tenant = None if ctx is None else ctx.lookup(note, "tenant_id")
        original = orjson.dumps(
            {
                "trace_id": state.trace_id,
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
            f"trace {state.trace_id} span {note.span_id}: {detail}",
            original,
            topic=self.topic,
            partition=state.partition,
            offset=note.offset,
            kafka_timestamp_ms=None,
            max_original_bytes=self.caps.dead_letter_bytes,
            received_at_ms=now_ms,
            request_id=None if ctx is None else ctx.request_id,
            tenant_id=tenant if isinstance(tenant, str) else None,
            trace_id=state.trace_id,
            span_id=note.span_id,
        )

    def _forget(self, trace_id: str) -> None:
        state = self._traces.pop(trace_id, None)
        if state is not None:
            self._dirty[trace_id] = state.partition

    # --- ownership --------------------------------------------------------------------------------

    def restore(self, trace_id: str, packed: bytes, partition: int) -> None:
        """Load one trace from the changelog; its partition's watermark starts from the state's."""
        state = TraceState.unpack(packed, partition)
        state.trace_id = trace_id
        self._traces[trace_id] = state
        part = self._partition(partition)
        part.watermark_ns = max(part.watermark_ns, state.watermark_ns)
        part.last_wall_ms = None
        heapq.heappush(part.deadlines, (state.deadline_ns, trace_id))

    def revoke(self, partitions: set[int]) -> None:
        """Drop the traces of partitions this worker no longer owns (their state is in the changelog)."""
        for trace_id in [t for t, s in self._traces.items() if s.partition in partitions]:
            del self._traces[trace_id]
            self._dirty.pop(trace_id, None)
        for partition in partitions:
            self._partitions.pop(partition, None)


def resolve_due_ns(first_start_ns: int, last_end_ns: int, first_token_known: bool, join: JoinConfig) -> int:
    """When a partition's watermark resolves a held trace without its root (the trace resolves once the
    watermark is at or past it): its last span end plus the join's grace once the first token is known.
    Before that (its LLM span may still be streaming, and spans are exported when they end) no earlier than
    the join's request timeout after its first start: the join would call the request timed out then
    anyway."""
    due = last_end_ns + join.grace_ms * _NS_PER_MS
    if first_token_known:
        return due
    return max(due, first_start_ns + join.request_timeout_ms * _NS_PER_MS)


def _reason(code: str) -> DeadLetterReason:
    """A reason code of :class:`streams.core.otlp_mapping.Unmappable` as the dead letter's type."""
    if code == "missing_tenant":
        return "missing_tenant"
    raise ValueError(f"unknown unmappable reason {code!r}")
