"""The state of one trace in the OTLP assembler (:class:`TraceState`), and its changelog form.

While a trace is *held* it keeps the notes of its stage spans (and of its root), the parent links and
retriever spans needed to place an ``EMBEDDING`` span, and the best value seen of every context
attribute. Once *resolved* its notes are gone: it keeps the context it was mapped with and the ids of
the spans already handled, so a late span is mapped alike and a replayed one is not forwarded twice, until
the watermark passes its forget time. One trace packs to one orjson value (a few hundred bytes plus its
notes) in a compacted changelog.

A trace is kept per tenant: the spans of one trace id that name tenant A and those that name tenant B are
two traces, keyed ``A NUL trace id`` and ``B NUL trace id`` (:func:`trace_key`), so one tenant's spans never
re-key, resolve or suppress another's. Spans that name no tenant are kept under the bare trace id until a
tenant's span of the trace arrives (:mod:`streams.core.otlp_traces`). Format 1 values (before tenants, keyed
by trace id) still restore: :meth:`TraceState.unpack` reads their tenant from their context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from schemas.otlp import AttrValue
from streams.core.join_state import exact_bytes
from streams.core.otlp_mapping import SpanNote, TraceContext, own_tenant

#: Serialised-form version: bump it when :meth:`TraceState.pack` changes in a way older readers cannot skip
#: (2: the tenant, last; a 17th element, the pending derived prompt, an 18th, whether the trace had a stage span,
#: a 19th and 20th, the held mark and retrieval end, a 21st, the caller stream flags, a 22nd, whether the trace
#: waits for its LLM span, a 23rd, whether a prompt assembly was derived, a 24th, the embedding spans
#: waiting for their retrieval span, and a 25th, the forwarded stage spans' extents, are optional and ignored by
#: them).
STATE_FORMAT: Final = 2
_READABLE_FORMATS: Final = (1, 2)
#: Stage extents a trace keeps (:attr:`TraceState.extents`): each late message's spans are checked against them,
#: so they bound that work. The captured real traces forward at most 6 stage spans each.
MAX_STAGE_EXTENTS: Final = 32
#: A context value's rank: (0 for the root span, else 1; start ns; span id); the smallest wins.
Rank = tuple[int, int, str]


@dataclass(slots=True)
class TraceState:
    """One trace: held (``resolved`` false) or remembered after its events were forwarded."""

    trace_id: str
    partition: int
    #: The tenant its spans name ("" for spans that name none).
    tenant: str = ""
    last_end_ns: int = 0
    #: The earliest span start seen (0: none yet): a trace without its first token waits from here.
    first_start_ns: int = 0
    #: Held: when the watermark resolves it; remembered: when it is forgotten (epoch ns).
    deadline_ns: int = 0
    resolved: bool = False
    root: SpanNote | None = None
    notes: dict[str, SpanNote] = field(default_factory=dict)
    parents: dict[str, str] = field(default_factory=dict)
    retrievers: set[str] = field(default_factory=set)
    context: dict[str, tuple[Rank, AttrValue]] = field(default_factory=dict)
    #: Spans whose outcome went out (events, a dead letter, or counted as no stage), so a replay is skipped.
    handled: set[str] = field(default_factory=set)
    #: The partition's watermark when the state was last changed: the floor a restore starts from.
    watermark_ns: int = 0
    #: Set at resolution: a span set ``ttft.stage = first_token`` (no first_token derived from LLM spans).
    first_token_explicit: bool = False
    #: A request_start event went out (from the root or a ``ttft.stage = request_start`` span).
    started: bool = False
    #: A bound on the packed size, kept as spans are added (not packed; a restore starts from the value's).
    size_bytes: int = 0
    #: Resolved with an LLM span but no prompt span and nothing retrieved before it: the LLM span's start (ns)
    #: and its derived ``prompt_assemble`` event (JSON text: a few hundred bytes per remembered trace),
    #: filled in once by a late retrieval or rerank span.
    prompt_due: tuple[int, str] | None = None
    #: Set at resolution: the first-token mark's time (ns) while no LLM span has taken it, so that a late LLM span
    #: that tells no first chunk still runs its ``llm_ttft`` to it (``otlp_mapping.marked_first_chunk``).
    mark_ns: int | None = None
    #: Set at resolution of a trace with retrieval or rerank spans but no LLM span and no prompt span: their last
    #: end (ns), from which a late LLM span's derived ``prompt_assemble`` runs (Spring AI ends a stream's chat span
    #: when its Flux completes, at times after the root).
    retrieved_ns: int | None = None
    #: Set at resolution of a trace with neither an LLM span nor a prompt span: its first late LLM span gets the
    #: derived ``prompt_assemble``, from ``retrieved_ns`` (moved on by late retrieval and rerank spans) or, with
    #: nothing retrieved before it yet, through ``prompt_due``. Cleared by that span or by a late prompt span.
    awaits_llm: bool = False
    #: A stage span was held or mapped: the trace is a request (a trace without one, e.g. a health check, is not,
    #: and its root waits in ``root`` for a late stage span).
    staged: bool = False
    #: Spans that tell whether the LLM calls under them stream (span id -> streamed; ``SpanNote.caller_stream``).
    callers: dict[str, bool] = field(default_factory=dict)
    #: A derived ``prompt_assemble`` went out: a prompt span that arrives later measures what it counted, and is
    #: counted ``nested`` instead of forwarded (the join would add the two).
    prompt_derived: bool = False
    #: Resolved: embedding spans no known retrieval span encloses yet (their retrieval span may come in a later
    #: message: a retrieval service exporting after the root's), mapped as ``vector_recall`` when it does.
    orphans: dict[str, SpanNote] = field(default_factory=dict)
    #: Resolved: what each forwarded stage span (not an instant) covered, ``[stage, start ns, end ns, first chunk
    #: ns, streaming]``, so that a late span of its stage that measures the same work (``otlp_nesting``) is counted
    #: ``nested`` rather than added to it.
    extents: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """Its key in the assembler and the changelog."""
        return trace_key(self.tenant, self.trace_id)

    @property
    def first_token_known(self) -> bool:
        """A held span tells the first token (an LLM span, or ``ttft.stage = first_token``)."""
        return any(n.stage in ("llm_ttft", "first_token") for n in self.notes.values())

    @property
    def span_count(self) -> int:
        """Spans held or handled, for the per-trace cap."""
        return len(self.notes) + len(self.handled) + (1 if self.root is not None else 0)

    def learn(self, note: SpanNote, is_root: bool) -> None:
        """Keep ``note``'s parent link, retriever flag and, while held, its context values (the best-ranked
        value wins; a resolved trace keeps the context its events went out with)."""
        if note.parent:
            self.parents[note.span_id] = note.parent
        if note.retriever:
            self.retrievers.add(note.span_id)
        if note.caller_stream is not None:
            self.callers[note.span_id] = note.caller_stream
        if self.resolved:
            return
        rank: Rank = (0 if is_root else 1, note.start_ns, note.span_id)
        for name, value in note.context.items():
            held = self.context.get(name)
            if held is None or rank < held[0]:
                self.context[name] = (rank, value)

    def trace_context(self) -> TraceContext:
        """The context the trace's events are mapped with."""
        held = self.notes.values()
        explicit_start = [n for n in held if n.stage == "request_start"]
        start = min(explicit_start, key=lambda n: (n.start_ns, n.span_id)) if explicit_start else self.root
        return TraceContext(
            trace_id=self.trace_id,
            values={name: value for name, (_, value) in self.context.items()},
            request_start_span=None if start is None else start.span_id,
            explicit_first_token=self.first_token_explicit
            or any(n.stage == "first_token" for n in self.notes.values()),
            retrievers=frozenset(self.retrievers),
            parents=self.parents,
            tenant=self.tenant or None,
            callers=self.callers,
        )

    def pack(self) -> bytes:
        """The changelog value of this trace (held until the checkpoint: see ``exact_bytes``)."""
        return exact_bytes(
            [
                STATE_FORMAT,
                self.trace_id,
                self.last_end_ns,
                self.deadline_ns,
                self.resolved,
                None if self.root is None else self.root.pack(),
                [n.pack() for n in self.notes.values()],
                self.parents,
                sorted(self.retrievers),
                {name: [list(rank), value] for name, (rank, value) in self.context.items()},
                sorted(self.handled),
                self.watermark_ns,
                self.first_token_explicit,
                self.started,
                self.first_start_ns,
                self.tenant,
                None if self.prompt_due is None else list(self.prompt_due),
                self.staged,
                self.mark_ns,
                self.retrieved_ns,
                self.callers,
                self.awaits_llm,
                self.prompt_derived,
                [n.pack() for n in self.orphans.values()],
                self.extents,
            ]
        )

    @classmethod
    def unpack(cls, packed: bytes, partition: int) -> TraceState:
        """Rebuild a trace from :meth:`pack`; raises ``ValueError`` on an unreadable value."""
        try:
            row: list[Any] = orjson.loads(packed)
            if row[0] not in _READABLE_FORMATS:
                raise ValueError(f"unknown trace state format {row[0]!r}")
            notes = [SpanNote.unpack(n) for n in row[6]]
            context = {name: ((r[0], r[1], r[2]), value) for name, (r, value) in row[9].items()}
            state = cls(
                trace_id=row[1],
                partition=partition,
                last_end_ns=row[2],
                deadline_ns=row[3],
                resolved=row[4],
                root=None if row[5] is None else SpanNote.unpack(row[5]),
                notes={n.span_id: n for n in notes},
                parents=dict(row[7]),
                retrievers=set(row[8]),
                context=context,
                handled=set(row[10]),
                watermark_ns=row[11],
                first_token_explicit=row[12],
                started=row[13],
                first_start_ns=row[14],
                # Format 1 kept every tenant's spans of a trace id together: the trace's best-ranked tenant.
                tenant=row[15] if row[0] >= 2 else own_tenant({n: v for n, (_, v) in context.items()}),
                size_bytes=len(packed),
                prompt_due=_prompt_due(row[16]) if len(row) > 16 else None,
                # Before this element every trace was mapped as a request: one restored without it still is.
                staged=bool(row[17]) if len(row) > 17 else True,
                mark_ns=row[18] if len(row) > 18 and isinstance(row[18], int) else None,
                retrieved_ns=row[19] if len(row) > 19 and isinstance(row[19], int) else None,
                callers=_callers(row[20]) if len(row) > 20 else {},
                # Before this element only a trace resolved with retrieval (``retrieved_ns``) waited for its LLM span.
                awaits_llm=bool(row[21]) if len(row) > 21 else len(row) > 19 and isinstance(row[19], int),
                # Before this element a late prompt span was forwarded beside a derived one: it still is.
                prompt_derived=bool(row[22]) if len(row) > 22 else False,
                orphans={n.span_id: n for n in (SpanNote.unpack(v) for v in row[23])} if len(row) > 23 else {},
                extents=_extents(row[24]) if len(row) > 24 else {},
            )
        except (IndexError, KeyError, TypeError, ValueError, AttributeError, orjson.JSONDecodeError) as exc:
            raise ValueError(f"unreadable trace state: {exc}") from None
        if not isinstance(state.tenant, str) or not isinstance(state.trace_id, str):
            raise ValueError("unreadable trace state: tenant and trace id must be strings")
        return state

    def adopt(self, other: TraceState) -> None:
        """Take over the held spans of ``other``, a held trace of the same trace id whose spans named no
        tenant (their context values rank as they did there)."""
        self.notes.update(other.notes)
        if other.root is not None and self.root is None:
            self.root = other.root
        self.parents.update(other.parents)
        self.retrievers |= other.retrievers
        self.callers.update(other.callers)
        self.handled |= other.handled
        for name, (rank, value) in other.context.items():
            held = self.context.get(name)
            if held is None or rank < held[0]:
                self.context[name] = (rank, value)
        self.last_end_ns = max(self.last_end_ns, other.last_end_ns)
        if other.first_start_ns:
            self.first_start_ns = min(self.first_start_ns or other.first_start_ns, other.first_start_ns)
        self.size_bytes += other.size_bytes
        self.staged = self.staged or other.staged


def extent_note(state: TraceState, span_id: str) -> SpanNote:
    """A forwarded stage span rebuilt from its extent, as much as nesting reads (parent link, times, stage)."""
    stage, start_ns, end_ns, first_chunk_ns, streaming = state.extents[span_id]
    parent = state.parents.get(span_id, "")
    return SpanNote(span_id, parent, start_ns, end_ns, 0, stage, first_chunk_ns=first_chunk_ns, streaming=streaming)


def extent_of(note: SpanNote, stage: str) -> list[Any]:
    """The extent kept of a forwarded stage span (:attr:`TraceState.extents`)."""
    return [stage, note.start_ns, note.end_ns, note.first_chunk_ns, note.streaming]


def _extents(value: Any) -> dict[str, list[Any]]:
    if not isinstance(value, dict) or not all(isinstance(v, list) and len(v) == 5 for v in value.values()):
        raise ValueError("unreadable stage extents")
    return dict(value)


def _callers(value: Any) -> dict[str, bool]:
    if not isinstance(value, dict) or not all(isinstance(v, bool) for v in value.values()):
        raise ValueError("unreadable caller stream flags")
    return dict(value)


def _prompt_due(value: Any) -> tuple[int, str] | None:
    if value is None:
        return None
    start, event = value
    if not isinstance(start, int) or not isinstance(event, str):
        raise ValueError("unreadable pending prompt")
    return start, event


def trace_key(tenant: str, trace_id: str) -> str:
    """A trace's key: ``tenant NUL trace id``, or the bare trace id for spans that name no tenant (the key
    every trace had in format 1)."""
    return f"{tenant}\x00{trace_id}" if tenant else trace_id
