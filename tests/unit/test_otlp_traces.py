from __future__ import annotations

import random
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.dead_letter import DeadLetter
from schemas.otlp import OtlpSpan, parse_spans
from streams.core.otlp_outputs import ForwardedEvent, Output
from streams.core.otlp_state import trace_key
from streams.core.otlp_traces import TraceAssembler
from streams.settings import CapsConfig, JoinConfig, OtlpConfig
from tests.support.otlp_traffic import (
    SpanSpec,
    TraceSpec,
    build_trace,
    emitter_events,
    exports,
    request_message,
)

START_US = 1_764_000_000_000_000
NOW_MS = START_US / 1000 + 3_600_000  # an hour later: nothing is timestamp_skew
JOIN = JoinConfig()
NO_LLM_STAGES = {"request_start", "retrieval", "vector_recall", "rerank", "prompt_assemble"}


def _assembler(**otlp: Any) -> TraceAssembler:
    return TraceAssembler(OtlpConfig(**otlp), JOIN, CapsConfig(), "otlp_spans")


def _spans(spec: TraceSpec, part: list[SpanSpec]) -> list[OtlpSpan]:
    return parse_spans(request_message(spec, part).SerializeToString(), "otlp_proto")


def _events(outputs: list[Output]) -> list[dict[str, Any]]:
    return sorted(
        (orjson.loads(o.value) for o in outputs if isinstance(o, ForwardedEvent)),
        key=lambda e: (e["stage"], e["event_id"]),
    )


def _expected(spec: TraceSpec) -> list[dict[str, Any]]:
    return sorted((orjson.loads(v) for _, v in emitter_events(spec)), key=lambda e: (e["stage"], e["event_id"]))


def _feed(asm: TraceAssembler, spec: TraceSpec, messages: list[list[SpanSpec]], offset: int = 0) -> list[Output]:
    out: list[Output] = []
    for i, part in enumerate(messages):
        out += asm.add_message(_spans(spec, part), 0, offset + i, NOW_MS)
    return out


def _spec(seed: int = 1, i: int = 1, **kw: Any) -> TraceSpec:
    shape = kw.pop("shape", "openinference")
    return build_trace(random.Random(seed), i, START_US, shape=shape, tenant=kw.pop("tenant", "acme"))


def test_openinference_trace_maps_to_the_emitters_events() -> None:
    spec = _spec(shape="openinference")
    out = _feed(_assembler(), spec, exports(spec, random.Random(2), 3))
    assert _events(out) == _expected(spec)
    assert not [o for o in out if isinstance(o, DeadLetter)]


def test_gen_ai_trace_with_time_to_first_chunk_attribute_or_event() -> None:
    for seed in range(8):  # both first-chunk sources occur across these seeds
        spec = _spec(seed, i=seed + 1, shape="gen_ai")
        out = _feed(_assembler(), spec, exports(spec, random.Random(seed), 2))
        assert _events(out) == _expected(spec), seed


def test_retried_retrieval_is_two_events_and_every_event_carries_the_trace_id() -> None:
    spec = next(s for s in (_spec(seed, i=seed) for seed in range(1, 60)) if len(s.retrievals) == 2)
    events = _events(_feed(_assembler(), spec, [spec.spans]))
    assert [e["stage"] for e in events].count("retrieval") == 2
    assert [e["stage"] for e in events].count("vector_recall") == 2
    assert {e["attrs"]["trace_id"] for e in events} == {spec.trace_id.hex()}


def test_trace_without_llm_span_has_no_first_token() -> None:
    spec = next(s for s in (_spec(seed, i=seed) for seed in range(1, 80)) if s.llm is None)
    stages = {e["stage"] for e in _events(_feed(_assembler(), spec, [spec.spans]))}
    assert stages == NO_LLM_STAGES


def test_children_are_held_until_the_root_arrives() -> None:
    spec = _spec()
    asm = _assembler()
    first, last = exports(spec, random.Random(3), 2)
    assert _feed(asm, spec, [first]) == []
    assert asm.held_traces == 1
    assert _events(_feed(asm, spec, [last], offset=1)) == _expected(spec)
    assert asm.held_traces == 0


def test_request_id_from_the_root_reaches_events_of_spans_sent_before_it() -> None:
    spec = _spec(i=1)
    assert spec.request_id is not None
    events = _events(_feed(_assembler(), spec, exports(spec, random.Random(4), 4)))
    assert {e["request_id"] for e in events} == {spec.request_id}


def test_request_id_defaults_to_the_trace_id() -> None:
    spec = _spec(i=3)
    assert spec.request_id is None
    events = _events(_feed(_assembler(), spec, [spec.spans]))
    assert {e["request_id"] for e in events} == {spec.trace_id.hex()}


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), pieces=st.integers(1, 6), shuffle=st.integers(0, 10_000))
def test_any_split_and_order_within_messages_gives_the_same_events(seed: int, pieces: int, shuffle: int) -> None:
    spec = _spec(seed, i=seed, shape=("openinference", "gen_ai")[seed % 2])
    messages = exports(spec, random.Random(seed), pieces)
    rng = random.Random(shuffle)
    for part in messages:
        rng.shuffle(part)  # the order inside one export is the SDK's, not the end-time order
    assert _events(_feed(_assembler(), spec, messages)) == _expected(spec)


def test_missing_tenant_dead_letters_each_stage_span_with_its_ids() -> None:
    spec = _spec(i=3)  # tenant on the root, not the resource
    for s in spec.spans:
        s.attributes.pop("ttft.tenant_id", None)
    out = _feed(_assembler(), spec, [spec.spans])
    dead = [o for o in out if isinstance(o, DeadLetter)]
    assert not [o for o in out if isinstance(o, ForwardedEvent)]
    assert {d.reason_code for d in dead} == {"missing_tenant"}
    stage_spans = [s for s in spec.spans if s.name in ("retrieve", "embed", "rerank", "assemble", "llm", "POST /ask")]
    assert {d.span_id for d in dead} == {s.span_id.hex() for s in stage_spans}
    assert {d.trace_id for d in dead} == {spec.trace_id.hex()}
    assert all(d.source_topic == "otlp_spans" for d in dead)


def test_llm_span_without_a_first_chunk_is_forwarded_llm_unmeasured() -> None:
    spec = _spec(shape="gen_ai")
    llm = next(s for s in spec.spans if s.name == "llm")
    llm.events.clear()
    llm.attributes.pop("gen_ai.response.time_to_first_chunk", None)
    asm = _assembler()
    out = _feed(asm, spec, [spec.spans])
    assert not [o for o in out if isinstance(o, DeadLetter)]
    assert {e["stage"] for e in _events(out)} == {
        "request_start",
        "retrieval",
        "vector_recall",
        "rerank",
        "prompt_assemble",
        "llm_unmeasured",
    }
    (unmeasured,) = [e for e in _events(out) if e["stage"] == "llm_unmeasured"]
    assert (unmeasured["event_id"], unmeasured["request_id"]) == (llm.span_id.hex(), spec.rid)
    assert unmeasured["duration_ms"] == (llm.end_us - llm.start_us) / 1000
    assert asm.counters.spans["dead_letter"] == 0 and asm.counters.no_first_chunk == {("", ""): 1}


def test_non_stage_spans_are_counted_not_dead_lettered() -> None:
    spec = _spec()
    asm = _assembler()
    out = _feed(asm, spec, [spec.spans])
    assert not [o for o in out if isinstance(o, DeadLetter)]
    assert asm.counters.spans["not_stage"] == 2  # the HTTP and the tool span
    assert asm.counters.spans["stage"] == len(spec.spans) - 2


def test_replayed_spans_are_not_forwarded_again() -> None:
    spec = _spec()
    asm = _assembler()
    messages = exports(spec, random.Random(5), 3)
    first = _feed(asm, spec, messages)
    again = _feed(asm, spec, messages)
    assert _events(first) == _expected(spec)
    assert again == []
    assert asm.counters.spans["replayed"] == len(spec.spans)


def test_watermark_resolves_a_trace_whose_root_never_came_and_the_late_root_adds_request_start() -> None:
    spec = _spec(i=6)  # tenant on the resource (every span knows it), request id = trace id
    asm = _assembler()
    children = [s for s in spec.spans if s.parent]
    root = [s for s in spec.spans if not s.parent]
    assert _feed(asm, spec, [children]) == []
    # another trace's span, ending past this trace's last end + grace, moves the partition's watermark
    later = _spec(seed=9, i=4)
    later_children = [s for s in later.spans if s.parent]
    for s in later_children:
        s.start_us += 10_000_000
        s.end_us += 10_000_000
    out = asm.add_message(_spans(later, later_children), 0, 1, NOW_MS) + asm.advance(0, NOW_MS)
    stages = {e["stage"] for e in _events(out) if e["request_id"] == spec.rid}
    assert "request_start" not in stages and "llm_ttft" in stages
    late = _events(asm.add_message(_spans(spec, root), 0, 2, NOW_MS))
    assert [e["stage"] for e in late] == ["request_start"]
    assert late[0]["request_id"] == spec.rid


def test_idle_tick_resolves_held_traces_on_wall_time() -> None:
    spec = _spec(i=2)
    asm = _assembler()
    children = [s for s in spec.spans if s.parent]
    asm.add_message(_spans(spec, children), 0, 0, NOW_MS)
    assert asm.advance(0, NOW_MS) == []
    out = asm.advance(0, NOW_MS + JOIN.grace_ms + 10)
    assert {e["stage"] for e in _events(out)} >= {"retrieval", "llm_ttft", "first_token"}


def test_time_the_partition_was_not_caught_up_never_resolves_a_held_trace() -> None:
    """The broker down for longer than the grace (no fetch answered, so not caught up): a trace whose tenant is
    on its root, its children held apart under the bare trace id, waits for the root. Before, the first idle
    fold after the outage moved the watermark by the outage, resolved the children without a tenant
    (dead-lettered ``missing_tenant``), and the root that came next made no request: CI lost one that way."""
    spec = _spec(i=3)  # tenant on the root, not the resource
    asm = _assembler()
    children = [s for s in spec.spans if s.parent]
    asm.add_message(_spans(spec, children), 0, 0, NOW_MS)
    assert asm.advance(0, NOW_MS) == []
    for wait_ms in (1_000, 10_000, 40_000):  # the outage
        assert asm.advance(0, NOW_MS + wait_ms, caught_up=False) == []
    assert asm.advance(0, NOW_MS + 40_500) == []  # fetches answered again: the idle clock starts now
    root = [s for s in spec.spans if not s.parent]
    out = asm.add_message(_spans(spec, root), 0, 1, NOW_MS + 41_000)
    assert not [o for o in out if isinstance(o, DeadLetter)]
    assert _events(out) == _expected(spec)
    asm.hold_idle(0)  # what the bridge's fold calls for a partition it cannot read
    assert asm.held_traces == 0


def test_state_packs_and_restores_mid_trace() -> None:
    spec = _spec()
    messages = exports(spec, random.Random(6), 3)
    asm = _assembler()
    _feed(asm, spec, messages[:2])
    restored = _assembler()
    for key, (partition, packed) in asm.dirty().items():
        assert packed is not None
        restored.restore(key, packed, partition)
    out = _feed(restored, spec, messages[2:], offset=2)
    assert _events(out) == _expected(spec)
    # and a resolved trace restores as remembered: its replayed spans are skipped
    again = _assembler()
    for key, (partition, packed) in restored.dirty().items():
        if packed is not None:  # (a tombstone: spans without a tenant, taken over by the root's tenant)
            again.restore(key, packed, partition)
    assert _feed(again, spec, messages) == []


def test_forgotten_after_forget_bound_with_a_tombstone() -> None:
    spec = _spec(i=2)
    asm = _assembler()
    _feed(asm, spec, [spec.spans])
    asm.dirty()
    later = _spec(seed=9, i=4)
    shift = (JOIN.forget_after_ms + 60_000) * 1000
    for s in later.spans:
        s.start_us += shift
        s.end_us += shift
    asm.add_message(_spans(later, later.spans), 0, 1, NOW_MS + shift / 1000)
    asm.advance(0, NOW_MS + shift / 1000)
    dirty = asm.dirty()
    assert dirty[trace_key("acme", spec.trace_id.hex())] == (0, None)


def test_trace_cap_resolves_the_oldest_held_trace_early() -> None:
    asm = _assembler(max_traces=2)
    specs = [_spec(seed, i=seed) for seed in (12, 14, 16)]  # even: the tenant is on the resource
    out: list[Output] = []
    for n, spec in enumerate(specs):
        out += asm.add_message(_spans(spec, [s for s in spec.spans if s.parent]), 0, n, NOW_MS)
    assert asm.counters.caps["otlp_held_traces"] == 1
    assert {e["attrs"]["trace_id"] for e in _events(out)} == {specs[0].trace_id.hex()}


def test_span_cap_dead_letters_stage_spans_past_it() -> None:
    spec = _spec()
    asm = _assembler(max_spans_per_trace=3)
    out = _feed(asm, spec, [spec.spans])
    dead = [o for o in out if isinstance(o, DeadLetter)]
    assert dead and {d.reason_code for d in dead} == {"too_many_events"}
    assert asm.counters.caps["otlp_spans_per_trace"] > 0


def test_explicit_first_token_span_replaces_the_derived_one() -> None:
    spec = _spec()
    root = next(s for s in spec.spans if not s.parent)
    assert spec.llm is not None
    marker = SpanSpec(b"\x07" * 8, root.span_id, "first token", spec.llm[1] + 5, spec.llm[1] + 5)
    marker.attributes["ttft.stage"] = "first_token"
    spec.spans.insert(0, marker)
    events = _events(_feed(_assembler(), spec, [spec.spans]))
    (first,) = [e for e in events if e["stage"] == "first_token"]
    assert first["event_id"] == marker.span_id.hex()
    assert first["ts_ms"] == (spec.llm[1] + 5) / 1000


def test_embedding_outside_a_retriever_is_no_stage() -> None:
    spec = _spec()
    root = next(s for s in spec.spans if not s.parent)
    for s in spec.spans:
        if s.name == "embed":
            s.parent = root.span_id
    stages = [e["stage"] for e in _events(_feed(_assembler(), spec, [spec.spans]))]
    assert "vector_recall" not in stages


def test_trace_whose_llm_span_is_still_streaming_waits_up_to_the_request_timeout() -> None:
    spec = _spec(i=2)
    asm = _assembler()
    early = [s for s in spec.spans if s.parent and s.name != "llm"]
    asm.add_message(_spans(spec, early), 0, 0, NOW_MS)
    last_end_ms = max(s.end_us for s in early) / 1000
    asm.advance(0, NOW_MS)
    assert asm.advance(0, NOW_MS + JOIN.grace_ms + 10) == []  # grace passed, no first token yet: held
    llm = [s for s in spec.spans if s.name == "llm"]
    asm.add_message(_spans(spec, llm), 0, 1, NOW_MS + JOIN.grace_ms + 20)
    assert asm.held_traces == 1
    out = asm.advance(0, NOW_MS + 2 * JOIN.grace_ms + 2 * JOIN.idle_tick_ms + 6_000)
    assert {e["stage"] for e in _events(out)} >= {"retrieval", "llm_ttft", "first_token"}
    assert last_end_ms < spec.start_us / 1000 + JOIN.request_timeout_ms


def test_trace_without_any_llm_span_resolves_at_the_request_timeout() -> None:
    spec = next(s for s in (_spec(seed, i=2 * seed) for seed in range(1, 80)) if s.llm is None)
    asm = _assembler()
    children = [s for s in spec.spans if s.parent]
    asm.add_message(_spans(spec, children), 0, 0, NOW_MS)
    asm.advance(0, NOW_MS)
    lag_ms = JOIN.request_timeout_ms - (max(s.end_us for s in children) - spec.start_us) / 1000
    assert asm.advance(0, NOW_MS + lag_ms - 50) == []
    out = asm.advance(0, NOW_MS + lag_ms + 50)
    assert {e["stage"] for e in _events(out)} == NO_LLM_STAGES - {"request_start"}


def test_spans_of_several_traces_in_one_message_map_per_trace() -> None:
    specs = [_spec(seed, i=seed) for seed in (21, 22, 23)]
    mixed = [span for spec in specs for span in _spans(spec, spec.spans)]
    random.Random(7).shuffle(mixed)
    mixed.sort(key=lambda s: s.is_root)  # the roots end last
    events = _events(_assembler().add_message(mixed, 0, 0, NOW_MS))
    want = sorted((e for spec in specs for e in _expected(spec)), key=lambda e: (e["stage"], e["event_id"]))
    assert events == want


def test_a_span_whose_event_breaks_the_contract_is_dead_lettered_with_its_ids() -> None:
    spec = _spec()
    assemble = next(s for s in spec.spans if s.name == "assemble")
    assemble.attributes["ttft.prompt_cache_hit"] = "yes"  # the contract wants a boolean
    asm = _assembler()
    out = _feed(asm, spec, [spec.spans])
    (dead,) = [o for o in out if isinstance(o, DeadLetter)]
    assert (dead.reason_code, dead.span_id, dead.trace_id) == ("schema", assemble.span_id.hex(), spec.trace_id.hex())
    assert "prompt_cache_hit" in dead.detail
    assert asm.counters.spans["dead_letter"] == 1
    assert "prompt_assemble" not in {e["stage"] for e in _events(out)}


def test_ttft_attributes_reach_the_event_attrs_by_name() -> None:
    spec = _spec()
    assemble = next(s for s in spec.spans if s.name == "assemble")
    assemble.attributes.update({"ttft.prompt_cache_hit": True, "ttft.rerank_top_k": 20})
    (event,) = [e for e in _events(_feed(_assembler(), spec, [spec.spans])) if e["stage"] == "prompt_assemble"]
    assert event["attrs"] == {"prompt_cache_hit": True, "rerank_top_k": 20, "trace_id": spec.trace_id.hex()}


def _health_check(trace_id: str = "a" * 32, tenant: str = "acme") -> list[OtlpSpan]:
    """What FastAPI's instrumentation exports for a probe of ``GET /healthz``: a root server span and the ASGI
    send span under it; no stage."""
    start = START_US * 1000
    resource = {"tenant.id": tenant, "service.name": "rag-api"}
    root = OtlpSpan(
        trace_id, "b" * 16, "", "GET /healthz", start, start + 900_000, {**resource, "http.route": "/healthz"}
    )
    send = OtlpSpan(trace_id, "c" * 16, "b" * 16, "GET /healthz http send", start + 100_000, start + 800_000, resource)
    return [send, root]


def _late_retrieval(root: OtlpSpan) -> OtlpSpan:
    """A retrieval span under ``root``, exported by another service after the root's."""
    start = root.start_ns + 200_000
    attributes = {"tenant.id": "acme", "openinference.span.kind": "RETRIEVER"}
    return OtlpSpan(root.trace_id, "e" * 16, root.span_id, "retrieve", start, start + 300_000, attributes)


def test_a_trace_without_a_stage_span_is_no_request() -> None:
    """A health check, a metrics scrape, a start-up job: before, its root became a request_start, and every
    probe a timed_out request of the service's tenant (completeness and the SLO down with it)."""
    asm = _assembler()
    assert asm.add_message(_health_check(), 0, 0, NOW_MS) == []
    assert asm.advance(0, NOW_MS + 10 * JOIN.forget_after_ms) == []
    assert asm.counters.spans["not_stage"] == 2 and asm.counters.spans["stage"] == 0


def test_a_late_stage_span_makes_a_root_only_trace_a_request_from_its_root() -> None:
    """A retrieval service that exports after the root's service: the root waits (in the trace's state, across a
    restore) and starts the request when the first stage span comes."""
    asm = _assembler()
    trace_id = "d" * 32
    spans = _health_check(trace_id)
    assert asm.add_message(spans, 0, 0, NOW_MS) == []
    restored = _assembler()
    for key, (partition, packed) in asm.dirty().items():
        assert packed is not None
        restored.restore(key, packed, partition)
    root = spans[1]
    retrieval = _late_retrieval(root)
    events = _events(restored.add_message([retrieval], 0, 1, NOW_MS))
    assert [(e["stage"], e["event_id"]) for e in events] == [("request_start", root.span_id), ("retrieval", "e" * 16)]
    assert events[0]["ts_ms"] == root.start_ns / 1e6


def test_a_root_that_waited_past_its_traces_resolution_is_counted_once_as_the_stage_it_became() -> None:
    """CI, the Collector without partition_traces_by_id: a trace's root came in one message, its stage spans in
    another on another partition after the trace had resolved. The root was counted ``not_stage`` at the
    resolution and ``stage`` when the stage span started the request: 601 outcomes for 600 spans."""
    asm = _assembler()
    trace_id = "9" * 32
    send, root = _health_check(trace_id)
    assert asm.add_message([send, root], 0, 0, NOW_MS) == []
    assert asm.advance(0, NOW_MS + JOIN.request_timeout_ms + JOIN.grace_ms + 10) == []  # resolved, root waits
    retrieval = _late_retrieval(root)
    events = _events(asm.add_message([retrieval], 0, 1, NOW_MS))
    assert [e["stage"] for e in events] == ["request_start", "retrieval"]
    asm.advance(0, NOW_MS + 10 * JOIN.forget_after_ms)
    counted = {k: v for k, v in asm.counters.spans.items() if v}
    assert counted == {"stage": 2, "not_stage": 1}  # root and retrieval; the send span


def test_a_root_that_waits_until_its_trace_is_forgotten_is_counted_not_stage_once() -> None:
    asm = _assembler()
    send, root = _health_check("8" * 32)
    asm.add_message([send], 0, 0, NOW_MS)
    asm.advance(0, NOW_MS + JOIN.request_timeout_ms + JOIN.grace_ms + 10)
    assert asm.add_message([root], 0, 1, NOW_MS) == []  # a late root, waiting for a stage span
    asm.add_message([root], 0, 1, NOW_MS)  # and its replay
    asm.advance(0, NOW_MS + 10 * JOIN.forget_after_ms)
    counted = {k: v for k, v in asm.counters.spans.items() if v}
    assert counted == {"not_stage": 2, "replayed": 1}


def test_a_late_root_of_a_trace_without_stage_spans_waits_too() -> None:
    asm = _assembler()
    send, root = _health_check("f" * 32)
    assert asm.add_message([send], 0, 0, NOW_MS) == []
    assert asm.advance(0, NOW_MS + JOIN.request_timeout_ms + JOIN.grace_ms + 10) == []  # resolved without root
    assert asm.add_message([root], 0, 1, NOW_MS) == []


def test_otel_check_says_a_health_check_is_no_request() -> None:
    from streams.core.otlp_check import NOT_A_REQUEST, check_traces

    _, findings = check_traces(_health_check())
    assert [f.status for f in findings] == [NOT_A_REQUEST]
