"""The state of one trace in the OTLP assembler (:class:`TraceState`), and its changelog form.

While a trace is *held* it keeps the notes of its stage spans (and of its root), the parent links and
retriever spans needed to place an ``EMBEDDING`` span, and the best value seen of every context
attribute. Once *resolved* its notes are gone: it keeps the context it was mapped with and the ids of
the spans already handled, so a late span is mapped alike and a replayed one is not forwarded twice, until
the partition's watermark passes its forget time. One trace packs to one orjson value (a few hundred bytes
plus its notes) keyed by trace id in a compacted changelog.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from schemas.otlp import AttrValue
from streams.core.otlp_mapping import SpanNote, TraceContext

#: Serialised-form version: bump it when :meth:`TraceState.pack` changes.
STATE_FORMAT: Final = 1
#: A context value's rank: (0 for the root span, else 1; start ns; span id); the smallest wins.
Rank = tuple[int, int, str]


@dataclass(slots=True)
class TraceState:
    """One trace: held (``resolved`` false) or remembered after its events were forwarded."""

    trace_id: str
    partition: int
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
        )

    def pack(self) -> bytes:
        """The changelog value of this trace."""
        return orjson.dumps(
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
            ]
        )

    @classmethod
    def unpack(cls, packed: bytes, partition: int) -> TraceState:
        """Rebuild a trace from :meth:`pack`; raises ``ValueError`` on an unreadable value."""
        try:
            row: list[Any] = orjson.loads(packed)
            if row[0] != STATE_FORMAT:
                raise ValueError(f"unknown trace state format {row[0]!r}")
            notes = [SpanNote.unpack(n) for n in row[6]]
            return cls(
                trace_id=row[1],
                partition=partition,
                last_end_ns=row[2],
                deadline_ns=row[3],
                resolved=row[4],
                root=None if row[5] is None else SpanNote.unpack(row[5]),
                notes={n.span_id: n for n in notes},
                parents=dict(row[7]),
                retrievers=set(row[8]),
                context={name: ((r[0], r[1], r[2]), value) for name, (r, value) in row[9].items()},
                handled=set(row[10]),
                watermark_ns=row[11],
                first_token_explicit=row[12],
                started=row[13],
                first_start_ns=row[14],
            )
        except (IndexError, KeyError, TypeError, orjson.JSONDecodeError) as exc:
            raise ValueError(f"unreadable trace state: {exc}") from None
