"""The trace assembler: OTLP spans in, stage events (and dead letters) out, per trace (pure; no Kafka).

Spans are exported when they end, so a trace arrives in several messages, children first and the LLM and
root spans last. The assembler holds each trace's stage spans and the context any of its spans carries
(:mod:`streams.core.otlp_state`) until the trace is *resolved*:

- when its root span (no parent) arrives, at the end of the message that carried it; or
- when its tenant's watermark on the input partition passes the trace's last span end plus the join's
  grace, once a span told the first token; a trace whose LLM span has not come yet (it ends, and is
  exported, only when it stops streaming) waits until the join's request timeout after its first span
  start, when the join would call it timed out anyway. Each tenant's watermark is the latest end of its
  spans on the partition, moved on by an idle tick (wall time) when the partition has no backlog, as the
  join's are (:mod:`streams.core.otlp_tenants`); no span moves it further than the join's lead past the
  clock.

**Tenants.** A trace is kept per tenant (``ttft.tenant_id``, else ``tenant.id``, of the span or its
resource): another tenant's spans with the same trace id are another trace, with their own clock, caps and
context, so they cannot re-key, resolve early, suppress or evict a tenant's spans. Spans that name no
tenant belong to the tenant whose spans share their trace id when exactly one tenant's do (its context,
e.g. a tenant set on the root span only, then applies); until then they are held apart, under the bare
trace id, and taken over by the first tenant's trace of that id that arrives while they are held; with
none (or several), their stage spans are dead-lettered ``missing_tenant`` when they resolve.

**Bad spans.** Every span is checked when it arrives (:mod:`streams.core.otlp_bounds`: times in the
contract's range and not past the clock's skew limit, kept numbers finite, kept attributes bounded in
bytes); one that fails is dead-lettered whole with its trace and span ids and nothing of it is kept. Each
trace's changelog value stays within ``otlp.max_trace_state_bytes``; an exception while folding one span
dead-letters that span (``schema``) and the others go on.

Resolving maps every held stage span (docs/design.md table, :mod:`streams.core.otlp_mapping`) and validates
each event as the join will (:func:`schemas.decode.decode_stage_event`). A stage span that cannot map is
dead-lettered with its trace and span ids; spans that are no stage are only counted. A resolved trace is
remembered until its tenant's watermark passes its last span end plus the join's ``forget_after_ms``: a
late span is mapped with the remembered context and forwarded (the join handles lateness), a replayed one
(same span id) is recognised and skipped. Held and remembered traces are capped per tenant
(``otlp.max_traces_per_tenant``: the tenant's oldest is resolved early or forgotten) and in all
(``otlp.max_traces``: the oldest of the tenant holding the most), as are spans per trace
(``otlp.max_spans_per_trace``), counted.

Outputs are independent of how the trace's spans were split over messages and of their order within a
message, as long as the root comes last (the exporter's end-time order).
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable
from functools import partial
from typing import Final

import orjson

from schemas.dead_letter import DeadLetter
from schemas.decode import decode_stage_event
from schemas.otlp import OtlpSpan
from streams.core.join_state import exact_bytes
from streams.core.otlp_bounds import (
    CALLER_FLAG_BYTES,
    FIXED_TRACE_BYTES,
    SPAN_LINK_BYTES,
    link_bytes,
    note_bytes,
    note_problem,
    span_problem,
)
from streams.core.otlp_conventions import EMBEDDING, TOOL_CALL
from streams.core.otlp_mapping import (
    SpanNote,
    TraceContext,
    Unmappable,
    agent_steps,
    awaiting_llm,
    derived_prompt_at,
    first_mark,
    hidden_first_chunk,
    is_unmeasured,
    made_after_its_stream,
    marked_first_chunk,
    note_span,
    own_tenant,
    prompt_plan,
    prompt_template,
    prompts_before,
    stage_events,
    stage_of,
)
from streams.core.otlp_mapping import request_start_event as root_event
from streams.core.otlp_nesting import INSTANTS, late_nested, nested_duplicates
from streams.core.otlp_outputs import (
    AssemblerCounters,
    ForwardedEvent,
    Output,
    SpanLetters,
    exc_text,
    unmappable_reason,
)
from streams.core.otlp_state import MAX_STAGE_EXTENTS, TraceState, extent_note, extent_of, trace_key
from streams.core.otlp_tenants import PartitionClocks, TenantClock, TraceCounts
from streams.settings import CapsConfig, JoinConfig, OtlpConfig

log = logging.getLogger("ttft.otlp")

_NS_PER_MS: Final = 1_000_000
#: Why a first-token mark that is its trace's root is dead-lettered (:meth:`TraceAssembler._lost_mark`).
LOST_MARK_DETAIL: Final = (
    "a first-token mark (ttft.stage = first_token) with no parent span: the service marked it where the request's "
    "context was lost (an async callback, another thread), so it is no request; its request stays without a first "
    "token. Start the mark with the request's context as its parent (Java: spanBuilder.setParent(context) with "
    "the Context taken before the callback; Python and Node: mark inside the request's context)"
)
_OVER_SPAN_CAP: Final = "trace over otlp.max_spans_per_trace"
_OVER_STATE_BYTES: Final = "trace over otlp.max_trace_state_bytes"
#: A changelog value past this is never produced (the producer's batch is 1 MiB): the trace is dropped,
#: counted and logged instead. The byte budget keeps every trace far below it; this is the last guard.
_MAX_PACKED_BYTES: Final = 1_000_000


class TraceAssembler:
    """Folds decoded spans into traces and emits their stage events (see the module docstring)."""

    def __init__(self, otlp: OtlpConfig, join: JoinConfig, caps: CapsConfig, topic: str) -> None:
        self.otlp, self.join, self.caps, self.topic = otlp, join, caps, topic
        self.counters = AssemblerCounters()
        self._letters = SpanLetters(topic, caps)
        self._traces: dict[str, TraceState] = {}
        self._partitions: dict[int, PartitionClocks] = {}
        self._counts = TraceCounts()
        #: Trace id -> the tenants (never "") that have a trace of that id.
        self._claims: dict[str, list[str]] = {}
        self._dirty: dict[str, int] = {}
        #: What a trace's notes and span links may take of its changelog value.
        self._budget = otlp.max_trace_state_bytes - FIXED_TRACE_BYTES

    # --- queries ----------------------------------------------------------------------------------

    @property
    def held_traces(self) -> int:
        """Traces waiting for their root or the watermark (a scan: read once per batch, for the gauge)."""
        return sum(1 for t in self._traces.values() if not t.resolved)

    @property
    def held_spans(self) -> int:
        """Span notes held in those traces."""
        return sum(len(t.notes) + (t.root is not None) for t in self._traces.values() if not t.resolved)

    def trace(self, tenant: str, trace_id: str) -> TraceState | None:
        """The trace of ``trace_id`` kept for ``tenant`` ("" : its spans that name no tenant)."""
        return self._traces.get(trace_key(tenant, trace_id))

    def watermark_ns(self, partition: int, tenant: str) -> int:
        """The watermark ``tenant``'s traces on ``partition`` resolve by (0 before its first span there)."""
        part = self._partitions.get(partition)
        clock = None if part is None else part.tenants.get(tenant)
        return 0 if part is None or clock is None else part.effective_ns(clock, self.join.max_tenant_lag_ms)

    def dirty(self) -> dict[str, tuple[int, bytes | None]]:
        """Trace key -> (partition, packed state or ``None`` for a forgotten trace) changed since the last
        call; the caller writes them to the changelog. A state that cannot pack, or packs past what a
        producer can send, is dropped (a tombstone), counted and logged: never a failed batch."""
        out: dict[str, tuple[int, bytes | None]] = {}
        dropped: list[str] = []
        for key, partition in self._dirty.items():
            state = self._traces.get(key)
            packed: bytes | None = None
            if state is not None:
                try:
                    packed = state.pack()
                    if len(packed) > _MAX_PACKED_BYTES:
                        raise ValueError(f"{len(packed)} bytes")
                except Exception:
                    log.exception("OTLP trace state %r cannot be written; dropped", key[:160])
                    self.counters.caps["otlp_trace_state_dropped"] += 1
                    packed = None
                    dropped.append(key)
            out[key] = (partition, packed)
        self._dirty.clear()
        for key in dropped:
            self._drop(key)
        return out

    def has_dirty(self) -> bool:
        """Some trace changed since :meth:`dirty` was last called."""
        return bool(self._dirty)

    # --- folding ----------------------------------------------------------------------------------

    def add_message(self, spans: list[OtlpSpan], partition: int, offset: int, now_ms: float) -> list[Output]:
        """Fold the spans of one message; traces whose root it carried are resolved after all its spans, and
        the late spans of resolved traces are mapped once the message's parent links are known (an embedding
        span sent before its retriever in the same message is still ``vector_recall``). Never raises: a span
        that fails is dead-lettered with its ids, and the message's other spans go on."""
        out: list[Output] = []
        roots: list[str] = []
        late: list[tuple[TraceState, SpanNote, bool]] = []
        for span in spans:
            try:
                self._add_span(span, partition, offset, now_ms, out, roots, late)
            except Exception as exc:
                out.append(self._span_failed(span, partition, offset, now_ms, exc))
        for state, note, is_root in late:  # parent links first, within the trace's caps
            if note.span_id not in state.handled and self._late_fits(state, link_bytes(note)):
                state.size_bytes += link_bytes(note)
                state.learn(note, is_root)
        # A message's prompt spans first: one cancels the prompt assembly its trace would derive at a late LLM span of
        # the same message, whatever their order in it.
        late.sort(key=lambda item: item[1].stage != "prompt_assemble")
        nested, steps = self._late_plan(late) if late else (set(), {})
        for state, note, is_root in late:
            plan = note.span_id in nested, steps.get(id(state), {})
            out.extend(self._guarded(state, note, now_ms, partial(self._late, state, note, is_root, now_ms, *plan)))
        if late:
            out.extend(self._adopt_orphans(late, now_ms))
            out.extend(self._late_prompts(late, now_ms))
        for key in roots:
            rooted = self._traces.get(key)
            if rooted is not None and not rooted.resolved:
                out.extend(self._resolve(rooted, now_ms))
        return out

    def advance(self, partition: int, now_ms: float, caught_up: bool = True) -> list[Output]:
        """Apply the idle tick to ``partition`` (``caught_up``: nothing is left to read there) and resolve (or
        forget) the traces each tenant's watermark passed; a tenant left without traces there loses its clock."""
        part = self._partitions.get(partition)
        if part is None:
            return []
        if caught_up:
            part.tick(now_ms, self.join.idle_tick_ms)
        else:
            part.hold_idle()
        out: list[Output] = []
        for tenant, clock in list(part.tenants.items()):
            watermark = part.effective_ns(clock, self.join.max_tenant_lag_ms)
            heap = clock.deadlines
            while heap and heap[0][0] <= watermark:
                deadline, key = heapq.heappop(heap)
                state = self._traces.get(key)
                if state is None or state.deadline_ns != deadline or state.partition != partition:
                    continue
                if state.resolved:
                    self._forget(key)
                else:
                    out.extend(self._resolve(state, now_ms))
            if not heap:
                del part.tenants[tenant]
        return out

    def hold_idle(self, partition: int) -> None:
        """The partition is not known to be caught up (a backlog, or no answer from the broker): its tenants'
        idle clocks start again once it is (:meth:`PartitionClocks.hold_idle`)."""
        part = self._partitions.get(partition)
        if part is not None:
            part.hold_idle()

    def _partition(self, partition: int) -> PartitionClocks:
        part = self._partitions.get(partition)
        if part is None:
            part = self._partitions[partition] = PartitionClocks()
        return part

    def _add_span(
        self,
        span: OtlpSpan,
        partition: int,
        offset: int,
        now_ms: float,
        out: list[Output],
        roots: list[str],
        late: list[tuple[TraceState, SpanNote, bool]],
    ) -> None:
        problem = span_problem(span, now_ms, self.caps)
        if problem is None:
            note = note_span(span, offset)
            problem = note_problem(note, self.caps)
        if problem is not None:
            self.counters.spans["dead_letter"] += 1
            out.append(self._letters.of_span(span, partition, offset, now_ms, *problem))
            return
        tenant = own_tenant(note.context)
        # A span moves its own tenant's clock only (spans without a tenant: theirs, never past the clock).
        self._partition(partition).raise_to(tenant, note.end_ns, now_ms, self.join.max_watermark_lead_ms)
        state = self._trace_for(span.trace_id, tenant, partition, out, now_ms)
        if state.resolved:
            late.append((state, note, span.is_root))
        elif self._hold(state, note, span.is_root, out, now_ms) and span.is_root:
            roots.append(state.key)

    def _trace_for(self, trace_id: str, tenant: str, partition: int, out: list[Output], now_ms: float) -> TraceState:
        """The trace a span of ``tenant`` joins: its tenant's; for a span that names no tenant, the one tenant's
        that has the trace id, else the trace of such spans (bare trace id)."""
        if not tenant:
            claims = self._claims.get(trace_id)
            if claims is not None and len(claims) == 1:
                return self._traces[trace_key(claims[0], trace_id)]
        state = self._traces.get(trace_key(tenant, trace_id))
        return state if state is not None else self._new_trace(trace_id, tenant, partition, out, now_ms)

    def _new_trace(self, trace_id: str, tenant: str, partition: int, out: list[Output], now_ms: float) -> TraceState:
        """A new trace, after the caps made room: the tenant's own oldest past its cap, else the oldest of the
        tenant holding the most. A tenant's first trace of an id takes over the held spans of that id that
        named no tenant, unless another tenant has a trace of the id."""
        per_tenant = min(self.otlp.max_traces_per_tenant, self.otlp.max_traces)
        while self._counts.count(tenant) >= per_tenant:
            self.counters.caps["otlp_traces_per_tenant"] += 1
            self._evict(self._counts.oldest(tenant), out, now_ms)
        while self._counts.total >= self.otlp.max_traces:
            largest = self._counts.largest()
            self._evict(self._counts.oldest(largest), out, now_ms)
        state = TraceState(trace_id, partition, tenant)
        self._register(state)
        if tenant and self._claims[trace_id] == [tenant]:
            waiting = self._traces.get(trace_id)
            if waiting is not None and not waiting.resolved:
                state.adopt(waiting)
                self._forget(trace_id)
                self._schedule(state)
        return state

    def _register(self, state: TraceState) -> None:
        key = state.key
        self._traces[key] = state
        self._counts.add(state.tenant, key)
        if state.tenant:
            claims = self._claims.setdefault(state.trace_id, [])
            if state.tenant not in claims:
                claims.append(state.tenant)

    def _evict(self, key: str, out: list[Output], now_ms: float) -> None:
        """Make room: a held trace is resolved now, without the spans still to come; a remembered one goes."""
        state = self._traces[key]
        if state.resolved:
            self.counters.caps["otlp_remembered_traces"] += 1
        else:
            self.counters.caps["otlp_held_traces"] += 1
            out.extend(self._resolve(state, now_ms))
        self._forget(key)

    def _hold(self, state: TraceState, note: SpanNote, is_root: bool, out: list[Output], now_ms: float) -> bool:
        """Keep ``note`` in a held trace; False when the per-trace caps (spans, bytes) refused it."""
        if note.span_id in state.handled:  # a replayed span that is no stage
            self.counters.spans["replayed"] += 1
            return False
        held = state.notes.get(note.span_id)
        if held is None and state.root is not None and state.root.span_id == note.span_id:
            held = state.root
        copies = (note.stage is not None) + is_root  # a root that is a stage is packed twice
        cost = note_bytes(note) * copies if copies else 0
        if held is None:
            cost += link_bytes(note)
        else:  # a replayed held span: only what its new copy adds
            cost -= note_bytes(held) * ((held.stage is not None) + (held is state.root))
        over_spans = held is None and state.span_count >= self.otlp.max_spans_per_trace
        if over_spans or (cost > 0 and state.size_bytes + cost > self._budget):
            cap, detail = (
                ("otlp_spans_per_trace", _OVER_SPAN_CAP) if over_spans else ("otlp_trace_bytes", _OVER_STATE_BYTES)
            )
            self.counters.caps[cap] += 1
            if note.stage is not None and note.stage != TOOL_CALL:
                self.counters.spans["dead_letter"] += 1
                out.append(self._letters.of_note(state, note, "too_many_events", detail, now_ms))
            else:
                self.counters.spans["not_stage"] += 1
            return False
        state.size_bytes += cost
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
        self._schedule(state)
        return True

    def _schedule(self, state: TraceState) -> None:
        """(Re)place a held trace's deadline on its tenant's clock of its home partition (the partition it
        was first seen on: the Collector partitions by trace id)."""
        due = resolve_due_ns(state.first_start_ns, state.last_end_ns, state.first_token_known, self.join)
        clock = self._partition(state.partition).clock(state.tenant)
        if due != state.deadline_ns:
            state.deadline_ns = due
            heapq.heappush(clock.deadlines, (due, state.key))
        self._touch(state, clock)

    def _touch(self, state: TraceState, clock: TenantClock) -> None:
        state.watermark_ns = clock.watermark_ns
        self._dirty[state.key] = state.partition

    # --- resolution -------------------------------------------------------------------------------

    def _resolve(self, state: TraceState, now_ms: float) -> list[Output]:
        """Map every held span of ``state``, then remember it (context, handled span ids) until forgotten."""
        ctx = state.trace_context()
        out: list[Output] = []
        notes = sorted(state.notes.values(), key=lambda n: (n.start_ns, n.span_id))
        ctx.tell_streaming(notes)
        root, waiting = state.root, None
        if root is not None and root.stage == "first_token":  # a mark that lost its request: no request of its own
            out.append(self._lost_mark(state, root, ctx, now_ms))
            notes = [n for n in notes if n.span_id != root.span_id]
            root = None
        staged = [(stage, n) for n in notes if (stage := stage_of(n, ctx)) is not None]
        state.staged = state.staged or bool(staged)
        if root is not None and ctx.request_start_span == root.span_id:
            if state.staged:
                out.extend(self._guarded(state, root, now_ms, partial(self._start_events, state, root, ctx, now_ms)))
            else:  # no stage span (a health check, a start-up job): no request, unless a late stage span comes
                waiting = root
        nested = self._nested(state, staged)
        kept = [n for n in notes if n.span_id not in nested]
        ctx.agent_steps = agent_steps(kept)
        ctx.hidden_first_chunk = hidden_first_chunk(notes, ctx.explicit_first_token)
        if ctx.explicit_first_token:
            mark = first_mark(kept)
            ctx.marked_first_chunk = marked_first_chunk(kept, ctx.agent_steps, mark)
            state.mark_ns = None if ctx.marked_first_chunk else mark
        for note in kept:
            out.extend(self._guarded(state, note, now_ms, partial(self._map, state, note, ctx, now_ms)))
        try:
            out.extend(self._derived_prompt(state, kept, ctx, now_ms))
        except Exception:
            log.exception("OTLP trace %s: deriving prompt_assemble failed; none derived", state.trace_id)
        state.awaits_llm, state.retrieved_ns = awaiting_llm(kept, ctx)
        if state.root is not None:
            # A root that waits for a stage span is counted when its fate is known: a stage once a stage span
            # starts its request, not_stage if its trace is forgotten first (_forget).
            if state.root.span_id not in state.handled and waiting is None:
                self.counters.spans["not_stage"] += 1
            state.handled.add(state.root.span_id)
        state.first_token_explicit = ctx.explicit_first_token
        self.counters.cut_off += starts_at_stage(root, notes, bool(state.parents))
        state.resolved = True
        state.notes.clear()
        state.root = waiting
        state.size_bytes = SPAN_LINK_BYTES * (len(state.handled) + len(state.parents))
        state.size_bytes += CALLER_FLAG_BYTES * len(state.callers)
        if waiting is not None:
            state.size_bytes += note_bytes(waiting)
        if state.prompt_due is not None:
            state.size_bytes += len(state.prompt_due[1])
        for span_id, row in list(state.extents.items()):
            cost = extent_bytes(span_id, row)
            if state.size_bytes + cost <= self._budget:
                state.size_bytes += cost
            else:
                del state.extents[span_id]
        for note in list(state.orphans.values()):
            cost = note_bytes(note)
            if state.size_bytes + cost <= self._budget:
                state.size_bytes += cost
            else:
                del state.orphans[note.span_id]
                self.counters.spans["not_stage"] += 1
        clock = self._partition(state.partition).clock(state.tenant)
        state.deadline_ns = max(state.last_end_ns, clock.watermark_ns) + self.join.forget_after_ms * _NS_PER_MS
        heapq.heappush(clock.deadlines, (state.deadline_ns, state.key))
        self._touch(state, clock)
        return out

    def _guarded(
        self, state: TraceState, note: SpanNote, now_ms: float, step: Callable[[], list[Output]]
    ) -> list[Output]:
        """``step``'s outputs for one span; an exception dead-letters that span (``schema``) instead of failing
        the batch."""
        try:
            return step()
        except Exception as exc:
            log.exception("OTLP trace %s span %s: mapping failed; dead-lettered", state.trace_id, note.span_id)
            state.handled.add(note.span_id)
            self.counters.spans["dead_letter"] += 1
            self.counters.caps["otlp_span_errors"] += 1
            return [self._letters.of_note(state, note, "schema", f"the mapping failed: {exc_text(exc)}", now_ms)]

    def _late_fits(self, state: TraceState, cost: int = SPAN_LINK_BYTES) -> bool:
        """One more late span (adding ``cost`` bytes besides its note) fits the trace's caps (spans, bytes)."""
        return state.span_count < self.otlp.max_spans_per_trace and state.size_bytes + cost <= self._budget

    def _late(
        self,
        state: TraceState,
        note: SpanNote,
        is_root: bool,
        now_ms: float,
        nested: bool = False,
        steps: dict[str, int] | None = None,
    ) -> list[Output]:
        """A span of a remembered trace: skipped if already handled, else mapped with the kept context (``nested``:
        it measures what a forwarded span of its stage did: counted, not forwarded; ``steps``: the message's late LLM
        spans that are steps before the trace's answer; both from :meth:`_late_plan`)."""
        if note.span_id in state.handled:
            self.counters.spans["replayed"] += 1
            return []
        if not self._late_fits(state, link_bytes(note)):
            over_spans = state.span_count >= self.otlp.max_spans_per_trace
            cap, detail = (
                ("otlp_spans_per_trace", _OVER_SPAN_CAP) if over_spans else ("otlp_trace_bytes", _OVER_STATE_BYTES)
            )
            self.counters.caps[cap] += 1
            if note.stage is None or note.stage == TOOL_CALL:
                self.counters.spans["not_stage"] += 1
                return []
            self.counters.spans["dead_letter"] += 1
            return [self._letters.of_note(state, note, "too_many_events", detail, now_ms)]
        state.size_bytes += link_bytes(note)
        state.learn(note, is_root)
        ctx = state.trace_context()
        ctx.tell_streaming([note])
        ctx.agent_steps = steps or {}
        out: list[Output] = []
        stage = stage_of(note, ctx)
        if nested or (stage == "prompt_assemble" and state.prompt_derived and not is_root):
            # Another span of its stage already counted the work this one measures (a derived prompt assembly: from
            # the last retrieval end to the LLM span's start): forwarded too, the join would add the two.
            state.handled.add(note.span_id)
            self.counters.spans["nested"] += 1
            self._touch(state, self._partition(state.partition).clock(state.tenant))
            return []
        state.staged = state.staged or stage is not None
        starts = not state.started and (stage == "request_start" or (is_root and state.staged))
        waits = not starts and is_root and not state.started
        if starts:
            out.extend(self._start_events(state, note, ctx, now_ms))
        elif waits:  # a late root of a trace with no stage span yet: waits for one (counted as the root above)
            state.root = note
            state.size_bytes += note_bytes(note)
        elif stage is not None and not state.started and state.root is not None:  # the root that waited
            waited, state.root = state.root, None
            out.extend(self._start_events(state, waited, ctx, now_ms))
        if state.mark_ns is not None and stage == "llm_ttft":  # a late answer to the mark held at resolution
            ctx.marked_first_chunk = marked_first_chunk([note], {}, state.mark_ns)
            state.mark_ns = None if ctx.marked_first_chunk else state.mark_ns
        if state.awaits_llm and stage in ("llm_ttft", "prompt_assemble"):
            out.extend(self._late_llm_prompt(state, note, stage, ctx, now_ms))
        elif state.awaits_llm and prompts_before(stage):
            state.retrieved_ns = max(state.retrieved_ns or note.end_ns, note.end_ns)
        if stage not in (None, "request_start"):
            out.extend(self._map(state, note, ctx, now_ms))
        elif stage is None and not is_root and waits_for_retrieval(note) and self._late_fits(state, note_bytes(note)):
            state.orphans[note.span_id] = note  # its retrieval span may come in a later message
            state.size_bytes += note_bytes(note)
        elif not starts and not waits:
            self.counters.spans["not_stage"] += 1
        state.handled.add(note.span_id)
        self._touch(state, self._partition(state.partition).clock(state.tenant))
        return out

    def _start_events(self, state: TraceState, note: SpanNote, ctx: TraceContext, now_ms: float) -> list[Output]:
        """The request_start instant at ``note``'s start (the root, or a ``ttft.stage = request_start`` span)."""
        state.started = True
        state.handled.add(note.span_id)
        try:
            event = root_event(note, ctx)
        except Unmappable as exc:
            self.counters.spans["dead_letter"] += 1
            return [self._letters.of_note(state, note, unmappable_reason(exc.reason), str(exc), now_ms, ctx)]
        return self._validated(state, note, [event], ctx, now_ms)

    def _lost_mark(self, state: TraceState, note: SpanNote, ctx: TraceContext, now_ms: float) -> Output:
        """A first-token mark that is its trace's root: the service marked it where the request's context was
        lost (an async callback, another thread). Mapped, it would be a request of its own with a TTFT of 0 ms in
        the sketches; it is dead-lettered ``schema`` with what to fix."""
        state.handled.add(note.span_id)
        self.counters.spans["dead_letter"] += 1
        return self._letters.of_note(state, note, "schema", LOST_MARK_DETAIL, now_ms, ctx)

    def _nested(self, state: TraceState, staged: list[tuple[str, SpanNote]]) -> set[str]:
        """The held stage spans that measure what another one does (:mod:`streams.core.otlp_nesting`): handled
        and counted (``nested``), never mapped. A failure here drops nothing."""
        try:
            nested = nested_duplicates(staged, state.parents)
        except Exception:
            log.exception("OTLP trace %s: finding nested stage spans failed; none dropped", state.trace_id)
            return set()
        state.handled |= nested
        self.counters.spans["nested"] += len(nested)
        return nested

    def _derived_prompt(
        self, state: TraceState, notes: list[SpanNote], ctx: TraceContext, now_ms: float
    ) -> list[Output]:
        """The derived ``prompt_assemble`` of a trace without a prompt span (no span of its own: not counted
        as one; a trace without a tenant has its spans dead-lettered already)."""
        try:
            plan = prompt_plan(notes, ctx)
            if plan is None:
                return []
            llm, retrieved_ns = plan
            template = prompt_template(llm, ctx)
        except Unmappable:
            return []
        if retrieved_ns is None:  # an LLM span with nothing retrieved before it yet: a late span may bring it
            state.prompt_due = llm.start_ns, orjson.dumps(template).decode()
            return []
        return self._derived(state, llm, derived_prompt_at(template, llm.start_ns, retrieved_ns), ctx, now_ms)

    def _late_llm_prompt(
        self, state: TraceState, note: SpanNote, stage: str, ctx: TraceContext, now_ms: float
    ) -> list[Output]:
        """The derived ``prompt_assemble`` of a trace resolved without its LLM span and without a prompt span, at its
        first late LLM span: from the last retrieval or rerank end known (``retrieved_ns``) to the span's start;
        with nothing retrieved yet, it waits in ``prompt_due`` for a late retrieval (:meth:`_late_prompts`). Once;
        a late prompt span cancels it."""
        retrieved, state.retrieved_ns, state.awaits_llm = state.retrieved_ns, None, False
        if stage != "llm_ttft" or made_after_its_stream(note) or (retrieved is not None and retrieved > note.start_ns):
            return []
        try:
            template = prompt_template(note, ctx)
        except Unmappable:
            return []
        if retrieved is None:
            state.prompt_due = note.start_ns, orjson.dumps(template).decode()
            state.size_bytes += len(state.prompt_due[1])
            return []
        return self._derived(state, note, derived_prompt_at(template, note.start_ns, retrieved), ctx, now_ms)

    def _late_plan(self, late: list[tuple[TraceState, SpanNote, bool]]) -> tuple[set[str], dict[int, dict[str, int]]]:
        """Decided for one message's late stage spans before any is mapped, so that their order in it does not
        matter: those that measure what another stage span of their trace does (this message's or one already
        forwarded: ``otlp_nesting.late_nested``), and, per trace, its late LLM spans that are steps before its answer
        (``agent_steps`` among them and the forwarded ones: a question condensed by a model inside a retrieval
        service's export gives no first token). A failure here drops nothing."""
        nested: set[str] = set()
        steps: dict[int, dict[str, int]] = {}
        groups: dict[int, tuple[TraceState, list[SpanNote]]] = {}
        for state, note, is_root in late:
            if not is_root and note.stage is not None and note.span_id not in state.handled:
                groups.setdefault(id(state), (state, []))[1].append(note)
        for key, (state, notes) in groups.items():
            try:
                ctx = state.trace_context()
                staged = [(stage, n) for n in notes if (stage := stage_of(n, ctx)) not in (None, "request_start")]
                if not staged:
                    continue
                nested |= late_nested(_near(state, staged), staged, state.parents)
                if any(stage == "llm_ttft" for stage, _ in staged):
                    forwarded = [extent_note(state, span_id) for span_id in state.extents]
                    kept = forwarded + [n for n in notes if n.span_id not in nested]
                    ours = {n.span_id for n in notes}
                    steps[key] = {k: v for k, v in agent_steps(kept).items() if k in ours}
            except Exception:
                log.exception("OTLP trace %s: finding nested late spans failed; none dropped", state.trace_id)
        return nested, steps

    def _keep_extent(self, state: TraceState, note: SpanNote, stage: str) -> None:
        """Remember what a forwarded stage span covered (:attr:`TraceState.extents`): the first ``MAX_STAGE_EXTENTS``,
        within the trace's byte cap once it is mapped (while it is being mapped, :meth:`_resolve` counts them after)."""
        row = extent_of(note, stage)
        if len(state.extents) >= MAX_STAGE_EXTENTS:
            return
        if state.resolved:
            cost = extent_bytes(note.span_id, row)
            if state.size_bytes + cost > self._budget:
                return
            state.size_bytes += cost
        state.extents[note.span_id] = row

    def _adopt_orphans(self, late: list[tuple[TraceState, SpanNote, bool]], now_ms: float) -> list[Output]:
        """The ``vector_recall`` events of embedding spans kept without their retrieval span, once a late message
        brought a retrieval span that encloses them (its parent links and retriever flags are learnt by now)."""
        out: list[Output] = []
        for state in {id(s): s for s, _, _ in late if s.orphans}.values():
            ctx = state.trace_context()
            for note in sorted(state.orphans.values(), key=lambda n: (n.start_ns, n.span_id)):
                if ctx.inside_retriever(note):
                    del state.orphans[note.span_id]
                    state.size_bytes -= note_bytes(note)
                    out.extend(self._guarded(state, note, now_ms, partial(self._map, state, note, ctx, now_ms)))
        return out

    def _late_prompts(self, late: list[tuple[TraceState, SpanNote, bool]], now_ms: float) -> list[Output]:
        """The derived ``prompt_assemble`` of resolved traces that were waiting for a retrieval or rerank span
        (a retrieval service exporting after the root's service): from the latest such end of this message
        before the LLM span's start; once per trace (a late prompt span cancels it)."""
        out: list[Output] = []
        for state in {id(s): s for s, _, _ in late if s.prompt_due is not None}.values():
            try:
                out.extend(self._late_prompt(state, [n for s, n, _ in late if s is state], now_ms))
            except Exception:
                log.exception("OTLP trace %s: deriving prompt_assemble failed; none derived", state.trace_id)
        return out

    def _late_prompt(self, state: TraceState, notes: list[SpanNote], now_ms: float) -> list[Output]:
        due = state.prompt_due
        if due is None:
            return []
        ctx = state.trace_context()
        stages = [(stage_of(n, ctx), n) for n in notes if n.span_id in state.handled]
        if any(stage == "prompt_assemble" for stage, _ in stages):
            state.prompt_due = None
            return []
        ends = [(n.end_ns, n.span_id, n) for stage, n in stages if prompts_before(stage) and n.end_ns <= due[0]]
        if not ends:
            return []
        end, _, note = max(ends, key=lambda e: (e[0], e[1]))
        state.prompt_due = None
        self._touch(state, self._partition(state.partition).clock(state.tenant))
        return self._derived(state, note, derived_prompt_at(orjson.loads(due[1]), due[0], end), ctx, now_ms)

    def _derived(
        self, state: TraceState, note: SpanNote, event: dict[str, object], ctx: TraceContext, now_ms: float
    ) -> list[Output]:
        """A derived ``prompt_assemble`` event, validated; once it goes out, a later prompt span is ``nested``."""
        out = self._validated(state, note, [event], ctx, now_ms, span=False)
        state.prompt_derived = state.prompt_derived or any(isinstance(o, ForwardedEvent) for o in out)
        return out

    def _map(self, state: TraceState, note: SpanNote, ctx: TraceContext, now_ms: float) -> list[Output]:
        """The events of one held or late span (nothing for a span that turns out to be no stage)."""
        state.handled.add(note.span_id)
        stage = stage_of(note, ctx)
        if stage is None and waits_for_retrieval(note):
            # Its retrieval span may come later: kept (within the cap: _resolve), counted when its fate is known.
            state.orphans[note.span_id] = note
            return []
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
            return [self._letters.of_note(state, note, unmappable_reason(exc.reason), str(exc), now_ms, ctx)]
        out = self._validated(state, note, events, ctx, now_ms)
        if stage not in INSTANTS and any(isinstance(o, ForwardedEvent) for o in out):
            self._keep_extent(state, note, stage)
        return out

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
            value = exact_bytes(event)  # held until the batch is produced
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

    def _span_failed(self, span: OtlpSpan, partition: int, offset: int, now_ms: float, exc: Exception) -> DeadLetter:
        log.exception("OTLP trace %s span %s: folding failed; dead-lettered", span.trace_id, span.span_id)
        self.counters.spans["dead_letter"] += 1
        self.counters.caps["otlp_span_errors"] += 1
        return self._letters.of_span(span, partition, offset, now_ms, "schema", f"the mapping failed: {exc_text(exc)}")

    def _forget(self, key: str) -> None:
        state = self._drop(key)
        if state is not None:
            if state.root is not None and not state.started:  # a root that waited for a stage span in vain
                self.counters.spans["not_stage"] += 1
            self.counters.spans["not_stage"] += len(state.orphans)  # embedding spans whose retrieval never came
            self._dirty[key] = state.partition

    def _drop(self, key: str) -> TraceState | None:
        """Remove a trace from memory (and from its tenant's count and its id's claims)."""
        state = self._traces.pop(key, None)
        if state is None:
            return None
        self._counts.remove(state.tenant, key)
        if state.tenant:
            claims = self._claims.get(state.trace_id)
            if claims is not None and state.tenant in claims:
                claims.remove(state.tenant)
                if not claims:
                    del self._claims[state.trace_id]
        return state

    # --- ownership --------------------------------------------------------------------------------

    def restore(self, key: str, packed: bytes, partition: int) -> None:
        """Load one trace from the changelog; its tenant's watermark on the partition starts from the state's.
        A format 1 value (keyed by trace id alone) is re-keyed by its tenant: written under the new key and
        its old key deleted at the next checkpoint. Raises ``ValueError`` on an unreadable value."""
        try:
            state = TraceState.unpack(packed, partition)
        except ValueError:
            raise
        except Exception as exc:
            raise ValueError(f"unreadable trace state: {exc_text(exc)}") from None
        new_key = state.key
        if new_key != key and new_key in self._traces:  # restored under its new key already: that one is newer
            self._dirty[key] = partition  # the old key's tombstone
            return
        self._drop(new_key)  # (a re-keyed format 1 value restored first: this one is newer)
        self._register(state)
        part = self._partition(partition)
        clock = part.clock(state.tenant)
        clock.watermark_ns = max(clock.watermark_ns, state.watermark_ns)
        clock.last_wall_ms = None
        part.lead_ns = max(part.lead_ns, clock.watermark_ns)
        heapq.heappush(clock.deadlines, (state.deadline_ns, new_key))
        if new_key != key:
            self._dirty[new_key] = partition  # the new key first, then the old key's tombstone
            self._dirty[key] = partition

    def revoke(self, partitions: set[int]) -> None:
        """Drop the traces of partitions this worker no longer owns (their state is in the changelog)."""
        for key in [k for k, s in self._traces.items() if s.partition in partitions]:
            self._drop(key)
        self._dirty = {k: p for k, p in self._dirty.items() if p not in partitions}
        for partition in partitions:
            self._partitions.pop(partition, None)


#: Root stages that start a request or mark its end: a trace starting there is no part cut off.
_NOT_CUT_OFF: Final = frozenset({None, "request_start", "first_token"})


def _near(state: TraceState, staged: list[tuple[str, SpanNote]]) -> list[tuple[str, SpanNote]]:
    """The forwarded stage spans of ``state`` that could nest with the late ones ``staged``: of their stages, and
    overlapping them in time (a span that holds another, or sits in it, overlaps it; a parent link alone, with
    the child outside its parent's time, is not looked for). What bounds a late message's work on a big trace."""
    stages = {stage for stage, _ in staged}
    low = min(n.start_ns for _, n in staged)
    high = max(max(n.end_ns, n.first_chunk_ns or 0) for _, n in staged)
    return [
        (row[0], extent_note(state, span_id))
        for span_id, row in state.extents.items()
        if row[0] in stages and row[1] <= high and max(row[2], row[3] or 0) >= low
    ]


def extent_bytes(span_id: str, row: list[object]) -> int:
    """What one stage extent adds to its trace's changelog value (with its separator)."""
    return len(orjson.dumps({span_id: row}))


def waits_for_retrieval(note: SpanNote) -> bool:
    """An embedding span with a parent: ``vector_recall`` once a retrieval span is known to enclose it."""
    return note.stage == EMBEDDING and bool(note.parent)


def starts_at_stage(root: SpanNote | None, notes: list[SpanNote], linked: bool) -> bool:
    """A resolved trace starts at a stage span (``AssemblerCounters.cut_off``; ``ttft otel check``'s ``LONE_SPAN``):
    its root is one and it is alone (``linked``: some span has a parent), or it is no LLM span and the trace has
    none."""
    if root is None or root.stage in _NOT_CUT_OFF:
        return False
    return not linked or not any(n.stage == "llm_ttft" for n in notes)


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
