"""Issue 27, items 1 and 2: one OTLP span never hurts another span, trace or tenant (the pure assembler).

Item 1: hostile numbers, times and sizes are dead-lettered with their trace and span ids when they arrive;
every changelog value stays packable and bounded; an exception on one span leaves the others alone.
Item 2: each tenant's spans of a trace id are their own trace, with their own clock and caps.
"""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from schemas.dead_letter import DeadLetter
from schemas.otlp import OtlpSpan, parse_spans
from streams.core import otlp_traces
from streams.core.otlp_bounds import SPAN_LINK_BYTES
from streams.core.otlp_outputs import ForwardedEvent, Output
from streams.core.otlp_state import TraceState, trace_key
from streams.core.otlp_traces import TraceAssembler
from streams.settings import CapsConfig, JoinConfig, OtlpConfig
from tests.support.otlp_traffic import SpanSpec, TraceSpec, build_trace, emitter_events, exports, request_message

START_US = 1_764_000_000_000_000
NOW_MS = START_US / 1000 + 3_600_000
JOIN = JoinConfig()
#: What a producer can send in a valid fixed64 time: just below 2**64 ns.
NEAR_2_64_US = (2**64 - 1) // 1000
#: The producer's batch (streams/kafka/batches.py) and Kafka's default message.max.bytes.
PRODUCER_BATCH_BYTES = 1_048_576


def _assembler(**otlp: Any) -> TraceAssembler:
    return TraceAssembler(OtlpConfig(**otlp), JOIN, CapsConfig(), "otlp_spans")


def _spec(i: int = 1, tenant: str = "acme", seed: int = 1, on_resource: bool | None = None) -> TraceSpec:
    specs = (build_trace(random.Random(s), i, START_US, shape="gen_ai", tenant=tenant) for s in range(seed, seed + 60))
    spec = next(s for s in specs if s.llm is not None)
    if on_resource is not None and spec.tenant_on_resource != on_resource:
        root = next(s for s in spec.spans if s.parent == b"")
        spec.tenant_on_resource = on_resource
        if on_resource:
            root.attributes.pop("ttft.tenant_id", None)
        else:
            root.attributes["ttft.tenant_id"] = tenant
    return spec


def _spans(spec: TraceSpec, part: list[SpanSpec]) -> list[OtlpSpan]:
    return parse_spans(request_message(spec, part).SerializeToString(), "otlp_proto")


def _events(outputs: list[Output]) -> list[dict[str, Any]]:
    return sorted(
        (orjson.loads(o.value) for o in outputs if isinstance(o, ForwardedEvent)),
        key=lambda e: (e["tenant_id"], e["stage"], e["event_id"]),
    )


def _expected(*specs: TraceSpec) -> list[dict[str, Any]]:
    events = (orjson.loads(v) for spec in specs for _, v in emitter_events(spec))
    return sorted(events, key=lambda e: (e["tenant_id"], e["stage"], e["event_id"]))


def _dead(outputs: list[Output]) -> list[DeadLetter]:
    return [o for o in outputs if isinstance(o, DeadLetter)]


def _feed(asm: TraceAssembler, spec: TraceSpec, parts: list[list[SpanSpec]], now_ms: float = NOW_MS) -> list[Output]:
    out: list[Output] = []
    for i, part in enumerate(parts):
        out += asm.add_message(_spans(spec, part), 0, i, now_ms)
    return out


def _packed_sizes(asm: TraceAssembler) -> list[int]:
    """Every changelog value the assembler would write now: each must pack (orjson) and fit a batch."""
    return [len(packed) for _, packed in asm.dirty().values() if packed is not None]


def _hostile(spec: TraceSpec, name: str, **attrs: Any) -> SpanSpec:
    """A stage span of ``spec``'s trace (a child of its root) with its own id."""
    root = next(s for s in spec.spans if s.parent == b"")
    llm = next(s for s in spec.spans if s.name == "llm")
    span = SpanSpec(random.Random(name).randbytes(8), root.span_id, name, llm.start_us, llm.end_us)
    span.attributes.update(attrs)
    return span


# --- item 1: numbers, times and sizes -----------------------------------------------------------------


def test_span_times_near_2_64_are_dead_lettered_and_every_state_still_packs() -> None:
    spec = _spec()
    bad = _hostile(spec, "late-retrieval", **{"ttft.stage": "retrieval"})
    bad.start_us, bad.end_us = NEAR_2_64_US - 10, NEAR_2_64_US
    asm = _assembler()
    out = _feed(asm, spec, [[bad, *spec.spans]])
    (dead,) = _dead(out)
    assert (dead.reason_code, dead.trace_id, dead.span_id) == ("schema", spec.trace_id.hex(), bad.span_id.hex())
    assert _events(out) == _expected(spec)
    assert _packed_sizes(asm)  # orjson packs every state (before: "Integer exceeds 64-bit range")


def test_an_llm_span_ending_before_it_starts_with_a_huge_first_chunk_is_dead_lettered() -> None:
    spec = _spec()
    bad = _hostile(spec, "llm-2", **{"gen_ai.operation.name": "chat", "gen_ai.response.time_to_first_chunk": 1e300})
    bad.end_us = bad.start_us - 5
    out = _feed(_assembler(), spec, [[bad, *spec.spans]])  # before: OverflowError out of round()
    (dead,) = _dead(out)
    assert (dead.reason_code, dead.span_id) == ("schema", bad.span_id.hex())
    assert _events(out) == _expected(spec)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_kept_number_is_dead_lettered_and_nan_first_chunks_are_ignored(value: float) -> None:
    spec = _spec()
    bad = _hostile(spec, "rerank-2", **{"ttft.stage": "rerank", "ttft.fallback_level": value})
    llm = next(s for s in spec.spans if s.name == "llm")
    llm.attributes["gen_ai.response.time_to_first_chunk"] = value  # ignored: the first-chunk event still tells
    llm.events = llm.events or [("gen_ai.first_chunk", spec.llm[1] if spec.llm else 0)]
    out = _feed(_assembler(), spec, [[bad, *spec.spans]])
    (dead,) = _dead(out)
    assert (dead.reason_code, dead.span_id) == ("schema", bad.span_id.hex())
    assert _events(out) == _expected(spec)


def test_a_0_6_mb_context_attribute_is_dead_lettered_and_never_held() -> None:
    spec = _spec()
    first, last = exports(spec, random.Random(3), 2)
    bad = _hostile(spec, "big-route", **{"ttft.stage": "rerank", "ttft.route": "r" * 600_000})
    asm = _assembler()
    out = _feed(asm, spec, [[bad, *first]])
    (dead,) = _dead(out)
    assert (dead.reason_code, dead.span_id) == ("too_large", bad.span_id.hex())
    assert max(_packed_sizes(asm)) < 20_000  # the held trace keeps nothing of it
    out += asm.add_message(_spans(spec, last), 0, 5, NOW_MS)
    assert _events(out) == _expected(spec)


@pytest.mark.parametrize("attr_bytes", [4_096, 2_000])
def test_hundreds_of_held_spans_with_kilobytes_of_attributes_stay_within_the_state_budget(attr_bytes: int) -> None:
    # 511 held stage spans: with 4 KB attributes each is too large for any event; with 2 KB each is valid
    # alone, and the trace's state budget (256 KiB) dead-letters the spans past it. Before: 1.1 to 2.7 MB.
    spec = _spec()
    asm = _assembler()
    spans = [
        _hostile(spec, f"extra-{i}", **{"ttft.stage": "rerank", "ttft.blob": "x" * (attr_bytes - 16)})
        for i in range(511 - len(spec.spans))
    ]
    children = [s for s in spec.spans if s.parent != b""]
    out = _feed(asm, spec, [children, spans[:250], spans[250:]])
    sizes = _packed_sizes(asm)
    assert max(sizes) <= OtlpConfig().max_trace_state_bytes < PRODUCER_BATCH_BYTES
    reasons = {d.reason_code for d in _dead(out)}
    assert reasons == ({"too_large"} if attr_bytes > 2_048 else {"too_many_events"})
    assert {d.span_id for d in _dead(out)} <= {s.span_id.hex() for s in spans}
    root = [s for s in spec.spans if s.parent == b""]
    out = asm.add_message(_spans(spec, root), 0, 9, NOW_MS)
    mine = [e for e in _events(out) if e["event_id"] not in {s.span_id.hex() for s in spans}]
    assert mine == _expected(spec)  # the trace's own spans all went through


def test_an_exception_on_one_span_dead_letters_it_and_the_message_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    spec, other = _spec(i=1), _spec(i=2, seed=7)
    victim = next(s for s in spec.spans if s.name == "rerank").span_id.hex()
    real = otlp_traces.stage_events

    def flaky(note: Any, stage: str, ctx: Any) -> list[dict[str, Any]]:
        if note.span_id == victim:
            raise RuntimeError("boom")
        return real(note, stage, ctx)

    monkeypatch.setattr(otlp_traces, "stage_events", flaky)
    asm = _assembler()
    out = asm.add_message(_spans(spec, spec.spans) + _spans(other, other.spans), 0, 0, NOW_MS)
    (dead,) = _dead(out)
    assert (dead.reason_code, dead.trace_id, dead.span_id) == ("schema", spec.trace_id.hex(), victim)
    assert "RuntimeError: boom" in dead.detail
    want = [e for e in _expected(spec, other) if e["event_id"] != victim]
    assert _events(out) == want
    assert _packed_sizes(asm)


def test_a_span_ending_past_the_skew_limit_is_dead_lettered_timestamp_skew() -> None:
    spec = _spec()
    bad = _hostile(spec, "future", **{"ttft.stage": "rerank"})
    now_ms = spec.end_us / 1000 + 1
    bad.end_us = int((now_ms + CapsConfig().skew_limit_ms + 1_000) * 1000)
    out = _feed(_assembler(), spec, [[bad, *spec.spans]], now_ms=now_ms)
    (dead,) = _dead(out)
    assert (dead.reason_code, dead.span_id) == ("timestamp_skew", bad.span_id.hex())


# --- item 2: tenants ------------------------------------------------------------------------------------


def test_another_tenants_span_ending_in_the_future_does_not_resolve_a_victims_held_trace() -> None:
    victim = _spec(i=1, tenant="victim", on_resource=False)  # tenant on the root only
    children = [s for s in victim.spans if s.parent != b""]
    root = [s for s in victim.spans if s.parent == b""]
    now_ms = victim.end_us / 1000 + 1
    attacker = _spec(i=2, tenant="mallory", seed=9, on_resource=True)
    lone = next(s for s in attacker.spans if s.parent == b"")
    lone.end_us = int((now_ms + 240_000) * 1000)  # within the skew limit: the lead bound applies
    asm = _assembler()
    out = _feed(asm, victim, [children], now_ms)
    out += asm.add_message(_spans(attacker, [lone]), 0, 1, now_ms)
    out += asm.advance(0, now_ms)
    out += asm.add_message(_spans(victim, root), 0, 2, now_ms)
    assert not [d for d in _dead(out) if d.trace_id == victim.trace_id.hex()]
    assert [e for e in _events(out) if e["tenant_id"] == "victim"] == _expected(victim)


def test_a_thousand_one_span_traces_of_another_tenant_evict_only_their_own() -> None:
    victim = _spec(i=1, tenant="victim", on_resource=False)
    children = [s for s in victim.spans if s.parent != b""]
    root = [s for s in victim.spans if s.parent == b""]
    asm = _assembler(max_traces=1_000)
    out = _feed(asm, victim, [children])
    flood = _spec(i=2, tenant="mallory", seed=9, on_resource=True)
    template = next(s for s in flood.spans if s.name == "retrieve")
    rng = random.Random(5)
    for k in range(1_000):
        flood.trace_id = rng.randbytes(16)
        out += asm.add_message(_spans(flood, [template]), 0, 10 + k, NOW_MS)
    assert asm.counters.caps["otlp_held_traces"] >= 1  # the cap tripped, on mallory's traces
    out += asm.add_message(_spans(victim, root), 0, 5_000, NOW_MS)
    assert not [d for d in _dead(out) if d.trace_id == victim.trace_id.hex()]
    assert [e for e in _events(out) if e["tenant_id"] == "victim"] == _expected(victim)


def test_another_tenants_spans_with_a_victims_trace_id_cannot_rekey_resolve_or_suppress_them() -> None:
    victim = _spec(i=1, tenant="victim", on_resource=True)  # every span names its tenant
    attacker = _spec(i=2, tenant="mallory", seed=9, on_resource=True)
    attacker.trace_id = victim.trace_id
    # mallory's copies of the victim's span ids, and a root that names another request id, sent first
    fakes = [
        SpanSpec(s.span_id, s.parent, s.name, s.start_us, s.end_us, dict(s.attributes), list(s.events))
        for s in victim.spans
    ]
    for fake in fakes:
        if fake.parent == b"":
            fake.attributes["ttft.request_id"] = "evil"
            fake.start_us -= 1_000
    asm = _assembler()
    out = _feed(asm, attacker, [fakes])
    out += _feed(asm, victim, exports(victim, random.Random(4), 3))
    assert [e for e in _events(out) if e["tenant_id"] == "victim"] == _expected(victim)
    assert {e["request_id"] for e in _events(out) if e["tenant_id"] == "mallory"} == {"evil"}
    assert asm.trace("victim", victim.trace_id.hex()) is not asm.trace("mallory", victim.trace_id.hex())


def test_spans_without_a_tenant_join_the_one_tenant_of_their_trace_id() -> None:
    spec = _spec(i=1, tenant="acme", on_resource=False)
    asm = _assembler()
    out = _feed(asm, spec, exports(spec, random.Random(8), 4))
    assert _events(out) == _expected(spec)
    assert asm.trace("", spec.trace_id.hex()) is None  # taken over by acme's trace
    assert asm.trace("acme", spec.trace_id.hex()) is not None


# --- upgrade --------------------------------------------------------------------------------------------


def test_a_format_1_state_keyed_by_trace_id_restores_under_its_tenant() -> None:
    spec = _spec(i=1, tenant="acme", on_resource=True)
    asm = _assembler()
    _feed(asm, spec, [spec.spans])  # resolved and remembered
    ((key, (partition, packed)),) = asm.dirty().items()
    assert key == trace_key("acme", spec.trace_id.hex()) and packed is not None
    row = orjson.loads(packed)
    assert row[0] == 2 and row[15] == "acme"
    old = orjson.dumps([1, *row[1:15]])  # what format 1 wrote, under the bare trace id
    restored = _assembler()
    restored.restore(spec.trace_id.hex(), old, partition)
    state = restored.trace("acme", spec.trace_id.hex())
    assert isinstance(state, TraceState) and state.resolved
    dirty = restored.dirty()
    assert list(dirty) == [key, spec.trace_id.hex()]  # the new key written, then the old one deleted
    assert dirty[spec.trace_id.hex()] == (partition, None)
    assert _feed(restored, spec, [spec.spans]) == []  # replayed spans are still recognised


def test_a_span_without_a_tenant_ending_in_the_future_cannot_resolve_other_tenantless_spans_early() -> None:
    victim = _spec(i=1, tenant="victim", on_resource=False)  # its children name no tenant
    children = [s for s in victim.spans if s.parent != b""]
    root = [s for s in victim.spans if s.parent == b""]
    now_ms = victim.end_us / 1000 + 1
    stranger = _spec(i=2, tenant="nobody", seed=9, on_resource=False)
    lone = next(s for s in stranger.spans if s.name == "rerank")  # names no tenant either
    lone.end_us = int((now_ms + 240_000) * 1000)
    asm = _assembler()
    out = _feed(asm, victim, [children], now_ms)
    out += asm.add_message(_spans(stranger, [lone]), 0, 1, now_ms)
    out += asm.advance(0, now_ms)  # the clock of spans without a tenant never runs ahead of the worker's
    out += asm.add_message(_spans(victim, root), 0, 2, now_ms)
    assert [e for e in _events(out) if e["tenant_id"] == "victim"] == _expected(victim)


def test_spans_without_a_tenant_claimed_by_two_tenants_are_dead_lettered_missing_tenant() -> None:
    spec = _spec(i=1, tenant="acme", on_resource=False)
    other = _spec(i=2, tenant="globex", seed=9, on_resource=True)
    other.trace_id = spec.trace_id
    asm = _assembler()
    out = _feed(asm, other, [[next(s for s in other.spans if s.name == "rerank")]])  # globex claims the id
    out += _feed(asm, spec, [[s for s in spec.spans if s.parent == b""]])  # acme's root claims it too
    children = [s for s in spec.spans if s.parent != b""]
    out += _feed(asm, spec, [children])  # two tenants: whose are these?
    out += asm.advance(0, NOW_MS + JOIN.request_timeout_ms + 10_000)
    stage_children = {s.span_id.hex() for s in children if s.name in ("retrieve", "embed", "rerank", "assemble", "llm")}
    dead = {d.span_id for d in _dead(out) if d.reason_code == "missing_tenant"}
    assert stage_children <= dead
    assert not [e for e in _events(out) if e["event_id"] in stage_children]


def test_a_state_without_the_pending_prompt_element_restores() -> None:
    """Values written before the 17th element (the pending derived prompt) restore as they were."""
    spec = _spec(i=2, tenant="acme", on_resource=True)
    asm = _assembler()
    _feed(asm, spec, [spec.spans])
    ((key, (partition, packed)),) = asm.dirty().items()
    assert packed is not None
    row = orjson.loads(packed)
    restored = _assembler()
    restored.restore(key, orjson.dumps(row[:16]), partition)
    state = restored.trace("acme", spec.trace_id.hex())
    assert isinstance(state, TraceState) and state.resolved and state.prompt_due is None


def test_caller_stream_flags_on_every_span_stay_within_the_state_budget() -> None:
    """Every span of a trace a caller with ``spring.ai.chat.client.stream`` (kept by span id in the trace's state):
    counted in its bytes like a parent link, held or late."""
    spec = _spec()
    asm = _assembler()
    flagged = [_hostile(spec, f"caller-{i}", **{"spring.ai.chat.client.stream": "true"}) for i in range(400)]
    for span in flagged:
        span.attributes.pop("ttft.stage", None)
    children = [s for s in spec.spans if s.parent != b""]
    root = [s for s in spec.spans if s.parent == b""]
    out = _feed(asm, spec, [children, flagged[:200], root, flagged[200:]])
    (state,) = [asm.trace(t, spec.trace_id.hex()) for t in ("acme", "") if asm.trace(t, spec.trace_id.hex())]
    assert state is not None and len(state.callers) == 400
    links = SPAN_LINK_BYTES * (len(state.handled) + len(state.parents))
    assert state.size_bytes - links >= len(orjson.dumps(state.callers))  # the flags are counted
    assert max(_packed_sizes(asm)) <= OtlpConfig().max_trace_state_bytes
    assert _events(out) == _expected(spec)
