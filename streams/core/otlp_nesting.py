"""Stage spans that measure the same work twice, found by ancestry and by time (pure).

A framework's instrumentation and its model client's often both trace one call. OpenInference's LangChain
instrumentor gives each ``ChatOpenAI`` call an ``LLM`` span and its OpenAI instrumentor the ``ChatCompletion``
span of the same call inside it; LangChain's ``EnsembleRetriever`` is a ``RETRIEVER`` around its own retrievers;
OpenInference's LlamaIndex instrumentor nests ``OpenAI.stream_chat`` in ``OpenAI.stream`` and
``VectorIndexRetriever._retrieve`` in ``.retrieve``. Summed as retries, each nest would count its stage twice
(or more), so one span of each counts:

* ``llm_ttft``: the call measured closest to the model. An LLM span that tells no first chunk (forwarded as
  ``llm_unmeasured``) is dropped when it holds, or sits inside, one that does (by their whole extents: start
  to end, or to the first chunk when that is later); of the rest, a span that holds another is dropped (the
  innermost counts: the wrapper's own time goes to the gap, ``other_ms``);
* every other stage: the outermost (a retrieval span around retrievals is the whole retrieval; its parts are
  inside it). Instants (``request_start``, ``first_token``) are never dropped.

One span *holds* another of its stage when it is its ancestor (the parent links, up to :data:`MAX_DEPTH`), or
when its extent holds the other's: it starts no later and ends no earlier (of two with the same extent, the one
with the smaller span id holds the other). Time matters because two instrumentors do not link their spans: the
client's span has whatever OpenTelemetry's context held as its parent, often the root. A span's extent is its
start to its end, except for an LLM span that tells its first chunk: its start to that chunk, the part it
measures (a wrapper sees the first chunk after the client does; a client span that runs on to the end of the
stream, or a LlamaIndex span closed before its stream began, still nests by it).

Spans in sequence (a retried retrieval, two LLM calls) or that only overlap hold nothing and all count. The time
sweeps sort once: O(n log n) in a trace's stage spans, plus at most :data:`MAX_DEPTH` parent links each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final, NamedTuple

from streams.core.otlp_mapping import SpanNote, is_unmeasured

#: Stages that are instants: never a nest.
INSTANTS: Final = frozenset({"request_start", "first_token"})
#: Parent links followed up from a stage span when looking for its ancestors of the same stage.
MAX_DEPTH: Final = 64


class Extent(NamedTuple):
    """What a stage span covers, for nesting by time: ``[start_ns, end_ns]``."""

    start_ns: int
    end_ns: int
    span_id: str

    def outer_first(self) -> tuple[int, int, str]:
        """The order in which an extent comes before every extent it holds."""
        return self.start_ns, -self.end_ns, self.span_id


def extent(note: SpanNote) -> Extent:
    """A span's extent (module docstring): to its first chunk for an LLM span that tells one."""
    end = note.first_chunk_ns if note.stage == "llm_ttft" and note.first_chunk_ns is not None else note.end_ns
    return Extent(note.start_ns, max(end, note.start_ns), note.span_id)


def whole_extent(note: SpanNote) -> Extent:
    """A span's start to its end, or to its first chunk when that comes later (a span closed before its stream)."""
    return Extent(note.start_ns, max(note.end_ns, note.first_chunk_ns or 0, note.start_ns), note.span_id)


def holds(outer: Extent, inner: Extent) -> bool:
    """``outer`` holds ``inner`` by time (an extent never holds itself)."""
    return (
        outer.span_id != inner.span_id
        and outer.start_ns <= inner.start_ns
        and inner.end_ns <= outer.end_ns
        and outer.outer_first() < inner.outer_first()
    )


def _marked(queried: Iterable[Extent], by: Iterable[Extent]) -> list[tuple[Extent, bool, bool]]:
    """Each extent once, with whether it is queried and whether it is one of ``by``, outer first."""
    marks: dict[str, tuple[Extent, bool, bool]] = {e.span_id: (e, True, False) for e in queried}
    for e in by:
        found, is_queried, _ = marks.get(e.span_id, (e, False, False))
        marks[e.span_id] = (found, is_queried, True)
    return sorted(marks.values(), key=lambda m: m[0].outer_first())


def held_by(queried: Iterable[Extent], by: Iterable[Extent]) -> set[str]:
    """The span ids of ``queried`` whose extent another of ``by`` holds."""
    out: set[str] = set()
    reach: int | None = None  # the latest end of the ``by`` extents seen (each starts no later)
    for e, is_queried, is_by in _marked(queried, by):
        if is_queried and reach is not None and reach >= e.end_ns:
            out.add(e.span_id)
        if is_by:
            reach = e.end_ns if reach is None else max(reach, e.end_ns)
    return out


def holding(queried: Iterable[Extent], by: Iterable[Extent]) -> set[str]:
    """The span ids of ``queried`` whose extent holds another of ``by``."""
    out: set[str] = set()
    floor: int | None = None  # the earliest end of the ``by`` extents seen (each starts no earlier)
    for e, is_queried, is_by in reversed(_marked(queried, by)):
        if is_queried and floor is not None and floor <= e.end_ns:
            out.add(e.span_id)
        if is_by:
            floor = e.end_ns if floor is None else min(floor, e.end_ns)
    return out


def ancestors(notes: Sequence[SpanNote], parents: Mapping[str, str]) -> dict[str, set[str]]:
    """Span id -> the span ids of ``notes`` among its ancestors (``parents``: the trace's parent links, beside
    each note's own), following at most :data:`MAX_DEPTH` links; two spans that are each other's ancestors
    (links in a loop) are neither's."""
    ids = {n.span_id for n in notes}
    out: dict[str, set[str]] = {}
    for note in notes:
        found: set[str] = set()
        seen = {note.span_id}
        parent = note.parent
        for _ in range(MAX_DEPTH):
            if not parent or parent in seen:
                break
            if parent in ids:
                found.add(parent)
            seen.add(parent)
            parent = parents.get(parent, "")
        out[note.span_id] = found
    looped = [(span_id, a) for span_id, found in out.items() for a in found if span_id in out[a]]
    for span_id, a in looped:  # links in a loop (a bad trace) say nothing
        out[span_id].discard(a)
    return out


class _Nests:
    """The "holds" relation over one stage's spans: by ancestry or by extent."""

    def __init__(
        self,
        notes: Sequence[SpanNote],
        ancestry: dict[str, set[str]],
        extent_of: Callable[[SpanNote], Extent] = extent,
    ) -> None:
        self.extents = {n.span_id: extent_of(n) for n in notes}
        self.ancestors = ancestry

    def held_by(self, queried: Sequence[SpanNote], by: Sequence[SpanNote]) -> set[str]:
        by_ids = {n.span_id for n in by}
        out = held_by([self.extents[n.span_id] for n in queried], [self.extents[n.span_id] for n in by])
        return out | {n.span_id for n in queried if self.ancestors[n.span_id] & (by_ids - {n.span_id})}

    def holding(self, queried: Sequence[SpanNote], by: Sequence[SpanNote]) -> set[str]:
        queried_ids = {n.span_id for n in queried}
        out = holding([self.extents[n.span_id] for n in queried], [self.extents[n.span_id] for n in by])
        for n in by:
            out |= (self.ancestors[n.span_id] & queried_ids) - {n.span_id}
        return out


def nested_duplicates(staged: Sequence[tuple[str, SpanNote]], parents: Mapping[str, str] | None = None) -> set[str]:
    """The span ids of the stage spans ``(stage, note)`` of one trace that do not count (module docstring)."""
    by_stage: dict[str, list[SpanNote]] = {}
    for stage, note in staged:
        if stage not in INSTANTS:
            by_stage.setdefault(stage, []).append(note)
    dropped: set[str] = set()
    for stage, notes in by_stage.items():
        if len(notes) < 2:
            continue
        ancestry = ancestors(notes, parents or {})
        nests = _Nests(notes, ancestry)
        if stage != "llm_ttft":
            dropped |= nests.held_by(notes, notes)
            continue
        unmeasured = [n for n in notes if is_unmeasured(n)]
        if unmeasured and len(unmeasured) < len(notes):
            measured = [n for n in notes if not is_unmeasured(n)]
            whole = _Nests(notes, ancestry, whole_extent)  # the whole calls: one that tells no chunk
            dropped |= whole.held_by(unmeasured, measured) | whole.holding(unmeasured, measured)
        rest = [n for n in notes if n.span_id not in dropped]
        dropped |= nests.holding(rest, rest)
    return dropped


def partner(note: SpanNote, others: Sequence[SpanNote], parents: Mapping[str, str] | None = None) -> str | None:
    """The span id of a span of ``others`` that ``note`` holds or sits in, and "around" or "inside" (for
    ``ttft otel check``), as ``"around:<id>"`` / ``"inside:<id>"``; None when there is none."""
    group = [note, *[o for o in others if o.span_id != note.span_id]]
    nests = _Nests(group, ancestors(group, parents or {}))
    mine = nests.extents[note.span_id]
    for other in group[1:]:
        theirs = nests.extents[other.span_id]
        if holds(mine, theirs) or note.span_id in nests.ancestors[other.span_id]:
            return f"around:{other.span_id}"
        if holds(theirs, mine) or other.span_id in nests.ancestors[note.span_id]:
            return f"inside:{other.span_id}"
    return None


def late_nested(
    forwarded: Sequence[tuple[str, SpanNote]], late: Sequence[tuple[str, SpanNote]], parents: Mapping[str, str]
) -> set[str]:
    """The span ids of the late stage spans ``late`` (one message's, of a trace already mapped) that do not count:
    those the rule above drops among them and the trace's ``forwarded`` stage spans, and those that nest with a
    forwarded span of their stage (its events went out and stand), except an LLM span that tells its first chunk
    where the forwarded ones it nests with do not (``llm_unmeasured``): its ``llm_ttft`` is the measurement. A few
    sweeps per stage, O(n log n) in its spans."""
    out: set[str] = set()
    for stage in {stage for stage, _ in late if stage not in INSTANTS}:
        theirs = [n for s, n in forwarded if s == stage]
        ours = [n for s, n in late if s == stage]
        group = [*theirs, *ours]
        if len(group) < 2:
            continue
        out |= nested_duplicates([(stage, n) for n in group], parents) & {n.span_id for n in ours}
        if not theirs:
            continue
        nests = _Nests(group, ancestors(group, parents))
        with_forwarded = nests.held_by(ours, theirs) | nests.holding(ours, theirs)
        if stage == "llm_ttft":  # a measured call that nests only with unmeasured forwarded ones counts
            measured = [n for n in theirs if not is_unmeasured(n)]
            with_measured = nests.held_by(ours, measured) | nests.holding(ours, measured) if measured else set()
            with_forwarded = {i for i in with_forwarded if i in with_measured or is_unmeasured(_note(ours, i))}
        out |= with_forwarded
    return out


def _note(notes: Sequence[SpanNote], span_id: str) -> SpanNote:
    return next(n for n in notes if n.span_id == span_id)
