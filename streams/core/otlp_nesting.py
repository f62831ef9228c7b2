"""Stage spans that measure the same work twice, found by time (pure).

A framework's instrumentation and its model client's often both trace one call. OpenInference's LangChain
instrumentor gives each ``ChatOpenAI`` call an ``LLM`` span and its OpenAI instrumentor the ``ChatCompletion``
span of the same call inside it; LangChain's ``EnsembleRetriever`` is a ``RETRIEVER`` around its own retrievers.
The two instrumentors do not link their spans (the inner one's parent is the span that was current in
OpenTelemetry's context, often the root), so only time says that one holds the other. Summed as retries, such
a pair would count the stage twice (``llm_ttft`` and ``llm_unmeasured`` of one call, or a retrieval and its
parts), so one of each nest counts:

* ``llm_ttft``: the call measured closest to the model. An LLM span that tells no first chunk (forwarded as
  ``llm_unmeasured``) is dropped when it holds, or sits inside, one that does; of the rest, a span that holds
  another is dropped (the innermost counts: the wrapper's own time goes to the gap, ``other_ms``);
* every other stage: the outermost (a retrieval span around retrievals is the whole retrieval; its parts are
  inside it). Instants (``request_start``, ``first_token``) are never dropped.

One span *holds* another when it starts no later and ends no earlier; of two with the same times, the one with
the smaller span id holds the other. Sequential spans (a retried retrieval, two LLM calls) hold nothing and all
count. Each sweep sorts once: O(n log n) in a trace's stage spans.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from streams.core.otlp_mapping import SpanNote, is_unmeasured

#: Stages that are instants: never a nest.
INSTANTS: Final = frozenset({"request_start", "first_token"})


def _outer_first(note: SpanNote) -> tuple[int, int, str]:
    """The order in which a span comes before every span it holds."""
    return note.start_ns, -note.end_ns, note.span_id


def _marked(queried: Iterable[SpanNote], by: Iterable[SpanNote]) -> list[tuple[SpanNote, bool, bool]]:
    """Each span once, with whether it is queried and whether it is one of ``by``, outer first."""
    marks: dict[str, tuple[SpanNote, bool, bool]] = {n.span_id: (n, True, False) for n in queried}
    for n in by:
        note, is_queried, _ = marks.get(n.span_id, (n, False, False))
        marks[n.span_id] = (note, is_queried, True)
    return sorted(marks.values(), key=lambda m: _outer_first(m[0]))


def held_by(queried: Iterable[SpanNote], by: Iterable[SpanNote]) -> set[str]:
    """The span ids of ``queried`` that another span of ``by`` holds."""
    out: set[str] = set()
    reach: int | None = None  # the latest end of the ``by`` spans seen (each starts no later)
    for note, is_queried, is_by in _marked(queried, by):
        if is_queried and reach is not None and reach >= note.end_ns:
            out.add(note.span_id)
        if is_by:
            reach = note.end_ns if reach is None else max(reach, note.end_ns)
    return out


def holding(queried: Iterable[SpanNote], by: Iterable[SpanNote]) -> set[str]:
    """The span ids of ``queried`` that hold another span of ``by``."""
    out: set[str] = set()
    floor: int | None = None  # the earliest end of the ``by`` spans seen (each starts no earlier)
    for note, is_queried, is_by in reversed(_marked(queried, by)):
        if is_queried and floor is not None and floor <= note.end_ns:
            out.add(note.span_id)
        if is_by:
            floor = note.end_ns if floor is None else min(floor, note.end_ns)
    return out


def nested_duplicates(staged: Sequence[tuple[str, SpanNote]]) -> set[str]:
    """The span ids of the stage spans ``(stage, note)`` of one trace that do not count (module docstring)."""
    by_stage: dict[str, list[SpanNote]] = {}
    for stage, note in staged:
        if stage not in INSTANTS:
            by_stage.setdefault(stage, []).append(note)
    dropped: set[str] = set()
    for stage, notes in by_stage.items():
        if len(notes) < 2:
            continue
        if stage != "llm_ttft":
            dropped |= held_by(notes, notes)
            continue
        unmeasured = [n for n in notes if is_unmeasured(n)]
        if unmeasured and len(unmeasured) < len(notes):
            measured = [n for n in notes if not is_unmeasured(n)]
            dropped |= held_by(unmeasured, measured) | holding(unmeasured, measured)
        rest = [n for n in notes if n.span_id not in dropped]
        dropped |= holding(rest, rest)
    return dropped


def holds(outer: SpanNote, inner: SpanNote) -> bool:
    """``outer`` holds ``inner`` (module docstring; a span never holds itself)."""
    return (
        outer.span_id != inner.span_id
        and outer.start_ns <= inner.start_ns
        and inner.end_ns <= outer.end_ns
        and _outer_first(outer) < _outer_first(inner)
    )
