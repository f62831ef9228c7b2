"""Stage spans that measure the same work twice (streams/core/otlp_nesting.py): which one of a nest counts."""

from __future__ import annotations

from streams.core.otlp_mapping import SpanNote
from streams.core.otlp_nesting import extent, held_by, holding, holds, nested_duplicates


def _note(span_id: str, start: int, end: int, stage: str = "retrieval", first_chunk: int | None = None) -> SpanNote:
    note = SpanNote(span_id, "", start, end, 0, stage, first_chunk_ns=first_chunk)
    if stage == "llm_ttft":
        note.streaming = True
    return note


def test_a_span_holds_what_starts_no_earlier_and_ends_no_later() -> None:
    outer, inner, after = (extent(n) for n in (_note("a", 0, 100), _note("b", 10, 90), _note("c", 50, 150)))
    assert holds(outer, inner) and not holds(inner, outer)
    assert not holds(outer, after) and not holds(after, outer)
    assert not holds(outer, outer)


def test_of_two_spans_with_the_same_times_the_smaller_id_holds_the_other() -> None:
    a, b = extent(_note("a", 0, 100)), extent(_note("b", 0, 100))
    assert holds(a, b) and not holds(b, a)
    assert held_by([a, b], [a, b]) == {"b"} and holding([a, b], [a, b]) == {"a"}


def test_sweeps_agree_with_the_pairwise_definition() -> None:
    notes = [_note(f"s{i}", (i * 37) % 50, (i * 37) % 50 + (i * 53) % 70) for i in range(40)]
    notes += [_note("t0", 5, 30), _note("t1", 5, 30), _note("t2", 5, 31)]
    spans = [extent(n) for n in notes]
    pairwise_held = {b.span_id for b in spans if any(holds(a, b) for a in spans)}
    pairwise_holding = {a.span_id for a in spans if any(holds(a, b) for b in spans)}
    assert held_by(spans, spans) == pairwise_held
    assert holding(spans, spans) == pairwise_holding


def test_a_measured_llm_span_extends_to_its_first_chunk() -> None:
    assert extent(_note("c", 10, 300, "llm_ttft", first_chunk=130)) == (10, 130, "c")
    assert extent(_note("l", 10, 30, "llm_ttft", first_chunk=200)) == (10, 200, "l")  # closed before its stream
    assert extent(_note("r", 10, 300)) == (10, 300, "r")


def test_an_ancestor_of_the_same_stage_holds_whatever_the_times() -> None:
    """LlamaIndex: OpenAI.stream is the parent of OpenAI.stream_chat, and ended long before its first chunk."""
    stream = _note("s", 52, 74, "llm_ttft")
    stream.streaming = False  # LlamaIndex's invocation parameters have no stream key
    stream_chat = _note("c", 53, 74, "llm_ttft", first_chunk=205)
    stream_chat.parent = "s"
    client = _note("x", 76, 328, "llm_ttft", first_chunk=204)  # the OpenAI instrumentor's, a sibling
    assert nested_duplicates([("llm_ttft", n) for n in (stream, stream_chat, client)]) == {"s", "c"}
    # the parent link may go through spans of no stage
    retrieve, inner = _note("r", 0, 50), _note("i", 1, 49)
    inner.parent = "chain"
    assert nested_duplicates([("retrieval", retrieve), ("retrieval", inner)], {"chain": "r"}) == {"i"}


def test_parent_links_that_loop_say_nothing() -> None:
    a, b = _note("a", 0, 10), _note("b", 20, 30)
    a.parent, b.parent = "b", "a"
    assert nested_duplicates([("retrieval", a), ("retrieval", b)], {"a": "b", "b": "a"}) == set()


def test_a_retrieval_around_retrievals_counts_once_as_the_outer_one() -> None:
    ensemble, bm25, vector = _note("e", 0, 50), _note("b", 2, 10), _note("v", 11, 49)
    assert nested_duplicates([("retrieval", n) for n in (ensemble, bm25, vector)]) == {"b", "v"}


def test_sequential_and_overlapping_spans_all_count() -> None:
    first, retry = _note("a", 0, 40), _note("b", 45, 90)
    overlapping = _note("c", 30, 60)
    assert nested_duplicates([("retrieval", n) for n in (first, retry, overlapping)]) == set()


def test_an_unmeasured_llm_span_around_a_measured_one_is_dropped() -> None:
    wrapper = _note("w", 0, 320, "llm_ttft")  # LangChain's ChatOpenAI: no first chunk
    call = _note("c", 3, 318, "llm_ttft", first_chunk=125)  # the client's ChatCompletion
    assert nested_duplicates([("llm_ttft", wrapper), ("llm_ttft", call)]) == {"w"}


def test_a_measured_llm_span_is_kept_over_an_unmeasured_one_inside_it() -> None:
    wrapper = _note("w", 0, 320, "llm_ttft", first_chunk=130)
    call = _note("c", 3, 318, "llm_ttft")  # a client instrumentation that tells no first chunk
    assert nested_duplicates([("llm_ttft", wrapper), ("llm_ttft", call)]) == {"c"}


def test_of_nested_measured_llm_spans_the_innermost_counts() -> None:
    outer = _note("o", 0, 320, "llm_ttft", first_chunk=130)
    middle = _note("m", 2, 319, "llm_ttft", first_chunk=128)
    inner = _note("i", 3, 318, "llm_ttft", first_chunk=125)
    staged = [("llm_ttft", n) for n in (outer, middle, inner)]
    assert nested_duplicates(staged) == {"o", "m"}


def test_a_wrapper_around_two_attempts_goes_and_both_attempts_count() -> None:
    wrapper = _note("w", 0, 600, "llm_ttft")
    first = _note("a", 5, 250, "llm_ttft", first_chunk=130)
    retry = _note("b", 260, 590, "llm_ttft", first_chunk=400)
    assert nested_duplicates([("llm_ttft", n) for n in (wrapper, first, retry)]) == {"w"}


def test_instants_and_other_stages_never_nest_with_each_other() -> None:
    start, first = _note("s", 0, 0, "request_start"), _note("f", 0, 0, "first_token")
    retrieval, rerank = _note("r", 0, 100), _note("k", 10, 20, "rerank")
    staged = [("request_start", start), ("first_token", first), ("retrieval", retrieval), ("rerank", rerank)]
    assert nested_duplicates(staged) == set()
