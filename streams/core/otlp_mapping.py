"""What one OTLP span says for the stage-event mapping (docs/design.md, "OpenTelemetry spans"), as plain data.

A span is read once, when it arrives, into a :class:`SpanNote`: the stage it maps to (if any), its first
chunk and whether it streamed for an LLM span (the conventions' names are in
:mod:`streams.core.otlp_conventions`), the well-known attrs it carries and the context attributes (request
id, tenant, version, rollout, route) found on it. The trace assembler (:mod:`streams.core.otlp_traces`) holds
the notes of a trace and, once the trace is resolved, turns them into stage-event dicts with
:func:`stage_event` and the trace's :class:`TraceContext`.

Attributes are read from the span first, then its resource (:class:`schemas.otlp.OtlpSpan` has merged
them so). A context value is taken, per event, from the span's own attributes, else from the trace: the
root span's, else the earliest-starting span's (ties by span id), so the result never depends on the
order in which the exporter sent the spans.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from schemas.otlp import AttrValue, OtlpSpan
from schemas.vocabulary import LLM_UNMEASURED
from streams.core.otlp_conventions import (
    EMBEDDING,
    FIRST_CHUNK_HIDDEN_BY_SCOPE,
    MODEL_ATTRS,
    PAST_END,
    TOOL_CALL,
    asked_for_tools,
    caller_streaming,
    first_chunk,
    is_retriever,
    model_of,
    not_a_stage,
    span_stage,
    span_streaming,
    token_attrs,
)

#: Context fields and, per field, the attributes that supply it, first match wins.
CONTEXT_ATTRS: Final[dict[str, tuple[str, ...]]] = {
    "request_id": ("ttft.request_id",),
    "tenant_id": ("ttft.tenant_id", "tenant.id"),
    "version_id": ("ttft.version_id", "service.version"),
    "rollout": ("ttft.rollout",),
    "route": ("ttft.route", *MODEL_ATTRS),
    "fallback_level": ("ttft.fallback_level",),
}
_TENANT_ATTRS: Final = CONTEXT_ATTRS["tenant_id"]
#: Context attributes read from every span; the model attributes only from LLM spans (an embeddings span
#: names its embedding model, which is no route).
_CONTEXT_NAMES: Final = frozenset(n for names in CONTEXT_ATTRS.values() for n in names) - frozenset(MODEL_ATTRS)
#: ``ttft.*`` attributes that are mapping inputs, not request attrs.
_NOT_ATTRS: Final = frozenset({"ttft.stage", *(n for n in _CONTEXT_NAMES if n.startswith("ttft."))})
#: Stages whose spans' token counts are read (the owners of ``prompt_tokens`` and ``cached_tokens``).
_TOKEN_STAGES: Final = frozenset({"llm_ttft", "prompt_assemble"})
#: What a derived ``prompt_assemble`` starts after: the end of the last of these before the LLM span.
_BEFORE_PROMPT: Final = frozenset({"retrieval", "rerank"})
#: The longest scope name, scope version or ignored-value note an ``llm_unmeasured`` event carries.
_UNMEASURED_ATTR_CHARS: Final = 128
#: What a held note keeps of a span's scope and of the first-chunk values it ignored (their reasons quote
#: the values): enough for the counters and the events, never the span's whole text.
_NOTE_TEXT_CHARS: Final = 512
#: The contract's longest tenant id (docs/design.md): a longer one is no tenant a trace can be keyed by.
MAX_TENANT_CHARS: Final = 64


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
    #: An LLM span's call streamed (True), did not (False), or the span does not say (None).
    streaming: bool | None = None
    #: The attribute or event that gave ``first_chunk_ns``, and what was ignored on the way (a reason).
    first_chunk_source: str = ""
    first_chunk_problem: str = ""
    #: The instrumentation scope that made the span (name, version).
    scope_name: str = ""
    scope_version: str = ""
    #: An LLM span whose turn ended by asking for tools (:func:`asked_for_tools`).
    tool_call: bool = False
    #: A caller's span that tells whether the LLM calls under it stream (:func:`caller_streaming`); not packed: the
    #: trace keeps it by span id (``TraceState.callers``).
    caller_stream: bool | None = None

    def pack(self) -> list[Any]:
        row = [
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
        if self.stage == "llm_ttft":  # the other spans leave these at their defaults: no bytes for them
            row += [
                self.streaming,
                self.first_chunk_source,
                self.first_chunk_problem,
                self.scope_name,
                self.scope_version,
            ]
            if self.tool_call:  # most LLM spans are not: no byte for them
                row.append(True)
        return row

    @classmethod
    def unpack(cls, row: list[Any]) -> SpanNote:
        """From :meth:`pack` (a row of the ten fields packed before the LLM fields existed reads too)."""
        return cls(*row)


def note_span(span: OtlpSpan, offset: int) -> SpanNote:
    """Read one span: its stage (or ``None``), first chunk, attrs and context attributes (never raises)."""
    a = span.attributes
    named = span_stage(a)
    stage = None if not_a_stage(span) else named
    context = {name: a[name] for name in _CONTEXT_NAMES if name in a}
    note = SpanNote(
        span_id=span.span_id,
        parent=span.parent_span_id,
        start_ns=span.start_ns,
        end_ns=span.end_ns,
        offset=offset,
        stage=stage,
        retriever=is_retriever(a, named),
        attrs=_request_attrs(a, stage),
        context=context,
        caller_stream=caller_streaming(a),
    )
    if stage == "llm_ttft":
        chunk = first_chunk(span)
        note.first_chunk_ns, note.first_chunk_source = chunk.at_ns, chunk.source
        note.first_chunk_problem = chunk.problem[:_NOTE_TEXT_CHARS]
        note.streaming = span_streaming(span)
        note.scope_name = span.scope_name[:_NOTE_TEXT_CHARS]
        note.scope_version = span.scope_version[:_NOTE_TEXT_CHARS]
        note.tool_call = asked_for_tools(a)
        context.update(model_of(a))
    return note


def own_tenant(context: dict[str, AttrValue]) -> str:
    """The tenant a span names itself (``ttft.tenant_id``, else ``tenant.id``, on the span or its resource),
    or ``""`` when it names none that is a tenant id of the contract (a string of 1 to 64 characters).
    The assembler keeps each tenant's spans of a trace apart by it."""
    for name in _TENANT_ATTRS:
        if name in context:
            value = context[name]
            return value if isinstance(value, str) and 0 < len(value) <= MAX_TENANT_CHARS else ""
    return ""


def _request_attrs(a: dict[str, AttrValue], stage: str | None) -> dict[str, AttrValue]:
    out: dict[str, AttrValue] = token_attrs(a) if stage in _TOKEN_STAGES else {}
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
    #: The tenant the trace is kept under (None: a trace of spans that name no tenant).
    tenant: str | None = None
    #: LLM spans that are an agent's steps before its answer (:func:`agent_steps`): no first token of theirs. Each
    #: maps to the ns of tool, retrieval and rerank work its span holds (not model time).
    agent_steps: Mapping[str, int] = field(default_factory=dict)
    #: Why a streamed call's first chunk is not the caller's first token in this trace (:func:`hidden_first_chunk`),
    #: empty when it is.
    hidden_first_chunk: str = ""
    #: The answering LLM span whose instrumentation tells no first chunk, and the ns of the service's own first-token
    #: mark inside it (:func:`marked_first_chunk`): its ``llm_ttft`` runs to the mark.
    marked_first_chunk: Mapping[str, int] = field(default_factory=dict)
    #: Spans that tell whether the LLM calls under them stream (span id -> streamed; ``caller_streaming``).
    callers: Mapping[str, bool] = field(default_factory=dict)

    @property
    def request_id(self) -> str:
        """``ttft.request_id`` if any span has it, else the trace id."""
        value = self.values.get("ttft.request_id")
        return value if isinstance(value, str) and value else self.trace_id

    def tenant_of(self, note: SpanNote) -> AttrValue | None:
        """The tenant of ``note``'s event: the span's own, else the tenant the trace is kept under (another
        tenant's span of the same trace id is another trace, so it never lends its tenant)."""
        if self.tenant is None:
            return self.lookup(note, "tenant_id")
        context = note.context
        for name in _TENANT_ATTRS:
            if name in context:
                return context[name]
        return self.tenant

    def lookup(self, note: SpanNote, field_name: str) -> AttrValue | None:
        """A context field for ``note``'s event: per attribute name, the span's own, else the trace's."""
        for name in CONTEXT_ATTRS[field_name]:
            if name in note.context:
                return note.context[name]
            if name in self.values:
                return self.values[name]
        return None

    def ancestors(self, note: SpanNote) -> Iterator[str]:
        """The span ids of ``note``'s parent chain, nearest first, as far as it is known (a cycle ends it)."""
        seen: set[str] = set()
        parent = note.parent
        while parent and parent not in seen:
            yield parent
            seen.add(parent)
            parent = self.parents.get(parent, "")

    def tell_streaming(self, notes: Iterable[SpanNote]) -> None:
        """Each LLM span of ``notes`` that does not say whether it streamed takes what its nearest caller says:
        Spring AI 1.1's chat model span under its ChatClient span."""
        if not self.callers:
            return
        for note in notes:
            if note.stage == "llm_ttft" and note.streaming is None:
                told = (self.callers[p] for p in self.ancestors(note) if p in self.callers)
                note.streaming = next(told, None)

    def inside_retriever(self, note: SpanNote) -> bool:
        """True when a retriever span encloses ``note`` (its parent chain, as far as it is known)."""
        return any(parent in self.retrievers for parent in self.ancestors(note))


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
    if note.stage == TOOL_CALL:
        return None
    return note.stage


def stage_events(note: SpanNote, stage: str, ctx: TraceContext) -> list[dict[str, Any]]:
    """The stage events of one stage span (an ``llm_ttft`` span also gives ``first_token``, unless a span
    of the trace sets it explicitly); raises :class:`Unmappable`."""
    ms = ns_to_ms(note.start_ns)
    if stage == "llm_ttft":
        return _llm_events(note, ctx, ms)
    if stage in ("request_start", "first_token"):
        return [_event(note, ctx, stage, ms, None)]
    return [_event(note, ctx, stage, ms, (note.end_ns - note.start_ns) / 1e6)]


def _llm_events(note: SpanNote, ctx: TraceContext, ms: float) -> list[dict[str, Any]]:
    """``llm_ttft`` up to the first chunk (and ``first_token`` there). A call that did not stream gets its
    whole duration (its answer came at once, at the span's end), marked ``streaming = false``. A streaming
    call without a first chunk, or one that says neither, is the reserved stage ``llm_unmeasured`` (see
    :func:`is_unmeasured`) over the whole span, with the instrumentation scope in its attrs."""
    held = ctx.agent_steps.get(note.span_id)
    if held is not None:  # a model turn before the answer: all its model time is LLM time before the first token
        duration = (max(note.end_ns, note.start_ns) - note.start_ns - held) / 1e6
        return [_event(note, ctx, "llm_ttft", ms, max(duration, 0.0), {"agent_step": True})]
    extra: dict[str, AttrValue] = {} if note.streaming is not False else {"streaming": False}
    first = note.first_chunk_ns
    if note.streaming and ctx.hidden_first_chunk:  # the framework shows the caller its first token later
        duration = (max(note.end_ns, note.start_ns) - note.start_ns) / 1e6
        attrs = {**unmeasured_attrs(note), "first_chunk_ignored": ctx.hidden_first_chunk[:_UNMEASURED_ATTR_CHARS]}
        return [_event(note, ctx, LLM_UNMEASURED, ms, duration, attrs)]
    if first is None and note.span_id in ctx.marked_first_chunk:
        first, extra = ctx.marked_first_chunk[note.span_id], {**extra, "first_chunk_from": "first_token"}
    if first is None:
        if note.streaming is not False:
            duration = (max(note.end_ns, note.start_ns) - note.start_ns) / 1e6
            return [_event(note, ctx, LLM_UNMEASURED, ms, duration, unmeasured_attrs(note))]
        first = max(note.end_ns, note.start_ns)
    events = [_event(note, ctx, "llm_ttft", ms, (first - note.start_ns) / 1e6, extra)]
    if not ctx.explicit_first_token:
        events.append(_event(note, ctx, "first_token", ns_to_ms(first), None))
    return events


#: What a step's output can feed before the next call: a tool, a retrieval (held spans' stages).
_FED_STAGES: Final = frozenset({TOOL_CALL, "retrieval", "rerank"})
#: How far before a call's end the next call may seem to start and still be after it: OpenTelemetry JS starts a span
#: at ``Date.now()``, in whole milliseconds, and ends it by ``performance.now()``. The Vercel AI SDK starts its next
#: turn within a millisecond of the last one's end: 0.01-1.5 ms on its captures, once 0.17 ms *before* it.
CLOCK_SLACK_NS: Final = 1_000_000


def agent_steps(notes: Sequence[SpanNote]) -> dict[str, int]:
    """The LLM spans among a trace's held spans ``notes`` (nests counted once) that are steps before its answer, each
    with the ns of work its span holds that is not the model's (below). A step is a turn with another LLM call
    starting after it ended (:data:`CLOCK_SLACK_NS`), that ended by asking for tools (``tool_call``, its finish
    reason) or whose output fed other work before that call: a tool's, retrieval or rerank span starting in between
    (Pydantic AI says ``stop`` for a Responses API turn that called a function; a question condensed or rewritten by
    a model before the retrieval); or a plain call that a streamed call follows (a router, a guard, a classifier:
    the user reads the stream). Its first chunk is not the first token the user sees, which the answering call
    gives. A tool-call turn that no call follows is the answer (structured output returned as a tool call) and keeps
    its first chunk. The Vercel AI SDK runs a streamed turn's tools before it ends that turn's span: the time of
    the tool, retrieval and rerank spans a step's span holds is theirs, not the model's. O(n log n) in the trace's
    spans (tools inside steps that overlap each other aside); the assembler and ``ttft otel check`` both decide by
    it."""
    llms = [n for n in notes if n.stage == "llm_ttft"]
    starts = sorted(n.start_ns for n in llms)
    if len(starts) < 2:
        return {}
    fed = sorted((n.start_ns, max(n.end_ns, n.start_ns)) for n in notes if n.stage in _FED_STAGES)
    tool_starts = [start for start, _ in fed]
    streamed_starts = sorted(n.start_ns for n in llms if n.streaming)
    steps: dict[str, int] = {}
    for note in llms:
        after = max(note.end_ns - CLOCK_SLACK_NS, note.start_ns + 1)  # a call is never after itself
        later = bisect_left(starts, after)
        if later == len(starts):
            continue  # no call after it: the answer
        if note.tool_call:
            steps[note.span_id] = 0
        elif note.streaming is False and bisect_left(streamed_starts, after) < len(streamed_starts):
            steps[note.span_id] = 0  # a plain call (a router, a guard, a classifier) before the streamed answer
        else:
            tool = bisect_left(tool_starts, after)
            if tool < len(tool_starts) and tool_starts[tool] <= starts[later]:
                steps[note.span_id] = 0
    if steps and fed:
        for note in llms:
            if note.span_id in steps:
                steps[note.span_id] = _held_ns(fed, tool_starts, note)
    return steps


def first_mark(notes: Iterable[SpanNote]) -> int | None:
    """The earliest first-token mark (a span ``ttft.stage = first_token``) among ``notes`` (ns), if any."""
    return min((n.start_ns for n in notes if n.stage == "first_token"), default=None)


def marked_first_chunk(notes: Sequence[SpanNote], steps: Mapping[str, int], mark: int | None) -> dict[str, int]:
    """The LLM span of ``notes`` (a trace's held spans, nests counted once; or one late span) whose ``llm_ttft`` runs
    to the service's first-token mark at ``mark`` (:func:`first_mark`): a span that tells no first chunk and may
    stream (not a step: ``steps``), the latest to start of those the mark falls in, up to :data:`CLOCK_SLACK_NS`
    after its end. OpenTelemetry's own Java (and Python) OpenAI instrumentation tells none; a service marking its
    first token then gets its ``llm_ttft`` too, not only its TTFT. Empty when no mark or no such span."""
    if mark is None:
        return {}
    found: SpanNote | None = None
    for note in notes:
        if (
            note.stage == "llm_ttft"
            and note.first_chunk_ns is None
            and note.streaming is not False
            and note.span_id not in steps
            and note.start_ns <= mark <= max(note.end_ns, note.start_ns) + CLOCK_SLACK_NS
            and (found is None or note.start_ns >= found.start_ns)
        ):
            found = note
    if found is None:
        return {}
    return {found.span_id: min(mark, max(found.end_ns, found.start_ns))}


def _held_ns(fed: Sequence[tuple[int, int]], fed_starts: Sequence[int], note: SpanNote) -> int:
    """The ns of ``note``'s span that the spans ``fed`` (sorted ``(start, end)``) cover, overlaps counted once."""
    held, reach = 0, note.start_ns
    for start, end in fed[bisect_left(fed_starts, note.start_ns) :]:
        if start >= note.end_ns:
            break
        start, end = max(start, reach), min(end, note.end_ns)
        if end > start:
            held += end - start
            reach = end
    return held


def hidden_first_chunk(notes: Iterable[SpanNote], explicit_first_token: bool) -> str:
    """Why the streamed calls of a trace with held spans ``notes`` tell no first token: a span of a framework of
    :data:`FIRST_CHUNK_HIDDEN_BY_SCOPE` is among them and the trace marks no first token of its own; else ``""``."""
    if explicit_first_token:
        return ""
    return next(
        (FIRST_CHUNK_HIDDEN_BY_SCOPE[n.scope_name] for n in notes if n.scope_name in FIRST_CHUNK_HIDDEN_BY_SCOPE), ""
    )


def is_unmeasured(note: SpanNote) -> bool:
    """An LLM span whose first chunk is unknown: streaming (or not saying) with no first-chunk signal."""
    return note.stage == "llm_ttft" and note.first_chunk_ns is None and note.streaming is not False


def unmeasured_attrs(note: SpanNote) -> dict[str, AttrValue]:
    """What an ``llm_unmeasured`` event says beside the span's own attrs: the instrumentation scope that made
    the span (``scope_name``, ``scope_version``), ``streaming`` when the span said so, and what was ignored
    on the way (``first_chunk_ignored``: a NaN, negative or past-the-end value), each cut to 128 characters."""
    cut = _UNMEASURED_ATTR_CHARS
    out: dict[str, AttrValue] = {"scope_name": note.scope_name[:cut], "scope_version": note.scope_version[:cut]}
    if note.streaming is not None:
        out["streaming"] = note.streaming
    if note.first_chunk_problem:
        out["first_chunk_ignored"] = note.first_chunk_problem[:cut]
    return out


def prompt_plan(notes: Iterable[SpanNote], ctx: TraceContext) -> tuple[SpanNote, int | None] | None:
    """Where a trace's derived ``prompt_assemble`` goes: its first LLM span after its last retrieval or rerank
    span (else its first LLM span) and the end (ns) of its last retrieval or rerank span before that span's start
    (None: nothing retrieved before it yet, a late span may bring it). ``None`` when the trace has a prompt span or
    no LLM span: nothing is derived. The event runs from that end to the LLM span's start
    (:func:`derived_prompt_at` of :func:`prompt_template`)."""
    staged = [(stage_of(n, ctx), n) for n in notes]
    if any(stage == "prompt_assemble" for stage, _ in staged):
        return None
    llms = [n for stage, n in staged if stage == "llm_ttft"]
    if not llms:
        return None
    # The first LLM call after the last retrieval: a call before it (a question condensed or rewritten, a query
    # routed) is a step whose output fed the retrieval, and the prompt is assembled from what was retrieved.
    last = max((n.end_ns for stage, n in staged if stage in _BEFORE_PROMPT), default=None)
    after = [n for n in llms if last is not None and n.start_ns >= last]
    llm = min(after or llms, key=lambda n: (n.start_ns, n.span_id))
    if made_after_its_stream(llm):
        return None
    ends = [n.end_ns for stage, n in staged if stage in _BEFORE_PROMPT and n.end_ns <= llm.start_ns]
    return llm, max(ends) if ends else None


def made_after_its_stream(llm: SpanNote) -> bool:
    """An LLM span made after its stream (OpenLIT): its start is not the call's, so no prompt assembly is derived
    up to it."""
    return llm.first_chunk_ns is None and PAST_END in llm.first_chunk_problem


def awaiting_llm(notes: Iterable[SpanNote], ctx: TraceContext) -> tuple[bool, int | None]:
    """Whether a trace resolved with ``notes`` still waits for an LLM span to derive its ``prompt_assemble`` (it has
    neither an LLM span nor a prompt span), and then the last retrieval or rerank end (ns) that prompt runs from
    (None: nothing retrieved yet)."""
    staged = [(stage_of(n, ctx), n) for n in notes]
    if any(stage in ("llm_ttft", "prompt_assemble") for stage, _ in staged):
        return False, None
    return True, max((n.end_ns for stage, n in staged if stage in _BEFORE_PROMPT), default=None)


def prompt_template(llm: SpanNote, ctx: TraceContext) -> dict[str, Any]:
    """The derived ``prompt_assemble`` event of the LLM span ``llm``, its time and duration not set yet:
    marked ``derived = true``, its event id the LLM span's id plus ``/prompt_assemble`` (a replay dedups).
    Raises :class:`Unmappable` (no tenant), like every event."""
    event = _event(llm, ctx, "prompt_assemble", 0.0, 0.0, {"derived": True}, own=False)
    event["event_id"] = f"{llm.span_id}/prompt_assemble"
    return event


def derived_prompt_at(template: dict[str, Any], llm_start_ns: int, retrieved_ns: int) -> dict[str, Any]:
    """The derived event from ``retrieved_ns`` (the last retrieval or rerank end) to the LLM span's start."""
    return {**template, "ts_ms": ns_to_ms(retrieved_ns), "duration_ms": (llm_start_ns - retrieved_ns) / 1e6}


def prompts_before(stage: str | None) -> bool:
    """A span of ``stage`` ends where a derived prompt assembly starts (retrieval, rerank)."""
    return stage in _BEFORE_PROMPT


def request_start_event(note: SpanNote, ctx: TraceContext) -> dict[str, Any]:
    """The ``request_start`` instant at the start of the root span ``note``."""
    return _event(note, ctx, "request_start", ns_to_ms(note.start_ns), None)


def _event(
    note: SpanNote,
    ctx: TraceContext,
    stage: str,
    ts_ms: float,
    duration_ms: float | None,
    extra: dict[str, AttrValue] | None = None,
    *,
    own: bool = True,
) -> dict[str, Any]:
    """A stage-event dict with exactly the fields :func:`streams.emit.event_json` writes; its attrs are
    the span's own (``own``), ``extra`` and the trace id."""
    tenant = ctx.tenant_of(note)
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
    event["attrs"] = {**(note.attrs if own else {}), **(extra or {}), "trace_id": ctx.trace_id}
    return event
