"""Issue 14 item 3: events per request are capped, a request's state is bounded in bytes, and a request id
reused forever (a constant ``"unknown"``) is emitted ``request_timeout_ms`` after its first event."""

from __future__ import annotations

import time
from typing import Any

from schemas.events import StageEvent
from streams.core.join import Refusal, RequestJoin
from streams.settings import JoinConfig

W = 60_000
T0 = 1_761_300_000_000.0
CFG = JoinConfig(grace_ms=2_000, request_timeout_ms=30_000, forget_after_ms=120_000, idle_tick_ms=1_000)


def ev(stage: str, ts: float, dur: float | None = None, rid: str = "unknown", **kw: Any) -> StageEvent:
    kw.setdefault("tenant_id", "acme")
    return StageEvent(request_id=rid, stage=stage, ts_ms=T0 + ts, duration_ms=dur, **kw)


def _constant_id_stream(n: int) -> list[StageEvent]:
    """A service whose request id is always "unknown": one request's events, every 100 ms, forever."""
    out = []
    for i in range(n):
        stage = ("request_start", "retrieval", "llm_ttft", "first_token")[i % 4]
        out.append(ev(stage, i * 100.0, None if stage in ("request_start", "first_token") else 5.0))
    return out


def test_a_constant_request_id_is_emitted_and_bounded() -> None:
    join = RequestJoin(CFG, W)
    records: list[dict[str, Any]] = []
    refused: list[Refusal] = []
    started = time.perf_counter()
    for i, event in enumerate(_constant_id_stream(40_000)):  # 4,000 s of event time
        for out in join.add(event, 0, float(i), offset=i):
            (refused if isinstance(out, Refusal) else records).append(out)  # type: ignore[arg-type]
        records += join.advance(0, float(i))
        pending = join.get("unknown")
        if pending is not None and i % 100 == 0:
            assert pending.state_bytes() <= CFG.max_request_state_bytes
            assert len(pending.to_bytes()) <= pending.state_bytes()
    elapsed = time.perf_counter() - started
    first = [r for r in records if not r.get("amend")]
    # The first request is emitted 30 s (event time) after its first event, not never.
    assert first and first[0]["started_at"] == T0
    assert join.counters.caps["request_lifetime"] >= 1
    assert join.counters.caps["events_per_request"] == len(refused) > 0
    assert {r.reason for r in refused} == {"too_many_events"}
    assert elapsed < 20, elapsed  # linear: the cap keeps each event's dedup scan short
    print(f"\n40,000 events of one request id: {elapsed:.2f} s, {len(first)} records, {len(refused)} refused")


def test_events_beyond_the_cap_are_refused() -> None:
    cfg = CFG.model_copy(update={"max_events_per_request": 10})
    join = RequestJoin(cfg, W)
    outs = [o for i in range(25) for o in join.add(ev("my_stage", float(i), 1.0, rid="r1"), 0, 0.0, offset=i)]
    assert len(outs) == 15 and all(isinstance(o, Refusal) and o.reason == "too_many_events" for o in outs)
    pending = join.get("r1")
    assert pending is not None and pending.event_count == 10


def test_state_bytes_bound_with_long_custom_stage_names() -> None:
    cfg = CFG.model_copy(update={"max_request_state_bytes": 4_096, "max_events_per_request": 1_000})
    join = RequestJoin(cfg, W)
    refused = 0
    for i in range(200):
        stage = f"custom_{i:03d}_" + "x" * 36  # 48 characters, each a new custom stage
        refused += len(join.add(ev(stage, float(i), 1.0, rid="r1"), 0, 0.0, offset=i))
    pending = join.get("r1")
    assert pending is not None and refused > 0
    assert len(pending.to_bytes()) <= pending.state_bytes() <= 4_096
    assert join.counters.caps["request_state_bytes"] == refused


def test_a_normal_request_is_unchanged_by_the_lifetime_bound() -> None:
    join = RequestJoin(CFG, W)
    for i, event in enumerate(
        [ev("request_start", 0, rid="a"), ev("retrieval", 1, 100.0, rid="a"), ev("first_token", 900, rid="a")]
    ):
        assert join.add(event, 0, 0.0, offset=i) == []
    (record,) = join.advance(0, 10**9)
    assert record["status"] == "missing_stage" and join.counters.caps["request_lifetime"] == 0


def test_a_skewed_event_cannot_move_the_watermark_past_the_workers_clock() -> None:
    """A valid event 24 h ahead must not time out its own tenant's requests, and never touches another
    tenant's watermark (live: a real wall clock)."""
    join = RequestJoin(CFG, W)
    now = T0 + 2_000.0
    for i, event in enumerate([ev("request_start", 0, rid="g"), ev("retrieval", 1, 100.0, rid="g")]):
        join.add(event, 0, now, offset=i)
    join.add(ev("retrieval", 0, 5.0, rid="h", tenant_id="hostile"), 0, now, offset=9)
    join.add(ev("retrieval", 86_400_000, 5.0, rid="skewed", tenant_id="hostile"), 0, now, offset=10)
    assert join.tenant_watermark(0, "hostile") == now + CFG.max_watermark_lead_ms
    assert join.counters.caps["watermark_step"] == 1 and join.counters.caps["watermark_lead"] == 1
    assert join.tenant_watermark(0, "acme") == T0 + 101  # the good tenant's clock: its own events only
    assert join.watermark(0) == T0 + 101  # the writer closes windows on the slowest tenant
    assert join.advance(0, now) == []  # the good request (30 s timeout) is still open
    pending = join.get("g")
    assert pending is not None and not pending.emitted


def test_a_tenant_trails_the_leading_tenant_by_at_most_the_lag_bound() -> None:
    """A quiet tenant during a backlog is carried along once the leader is max_tenant_lag_ms ahead."""
    join = RequestJoin(CFG, W)
    join.add(ev("request_start", 0, rid="quiet", tenant_id="quiet"), 0, 0.0, offset=0)
    for i in range(1, 25):  # the busy tenant moves on a minute per event (a backlog: never caught up)
        join.add(ev("retrieval", i * 60_000, 5.0, rid=f"b{i}", tenant_id="busy"), 0, 0.0, offset=i)
        out = join.advance(0, 0.0, caught_up=False)
        lead = T0 + i * 60_000 + 5.0
        assert join.tenant_watermark(0, "quiet") == max(T0, lead - CFG.max_tenant_lag_ms)
        if any(r["request_id"] == "quiet" for r in out):
            assert lead - CFG.max_tenant_lag_ms >= T0 + CFG.request_timeout_ms
            break
    else:
        raise AssertionError("the quiet tenant's request was never timed out")


def test_one_event_moves_the_watermark_at_most_one_step() -> None:
    """A replay far behind the clock: each event moves the watermark at most max_watermark_step_ms."""
    join = RequestJoin(CFG, W)
    join.add(ev("retrieval", 0, 5.0, rid="a"), 0, 0.0, offset=0)
    before = join.watermark(0)
    join.add(ev("retrieval", 86_400_000, 5.0, rid="b"), 0, 0.0, offset=1)
    assert join.watermark(0) - before == CFG.max_watermark_step_ms
    assert join.counters.caps["watermark_step"] == 1


def test_times_in_the_past_are_folded_never_refused() -> None:
    join = RequestJoin(CFG, W)
    join.add(ev("retrieval", 1_000, 5.0, rid="a"), 0, 0.0, offset=0)
    mark = join.watermark(0)
    assert join.add(ev("retrieval", -10_000, 5.0, rid="recent"), 0, 0.0, offset=1) == []  # joined normally
    (amend,) = join.add(ev("retrieval", -10 * 86_400_000, 5.0, rid="old"), 0, 0.0, offset=2)  # a backfill
    assert isinstance(amend, dict) and amend["amend"] is True
    assert join.watermark(0) == mark


def test_a_tenant_flooding_open_requests_evicts_only_its_own() -> None:
    cfg = CFG.model_copy(update={"max_open_requests": 50, "max_open_requests_per_tenant": 30})
    join = RequestJoin(cfg, W)
    for i in range(10):
        assert join.add(ev("request_start", i, rid=f"g{i}", tenant_id="good"), 0, 0.0, offset=i) == []
    evicted: list[dict[str, Any]] = []
    for i in range(200):
        evicted += join.add(ev("request_start", 100 + i, rid=f"f{i}", tenant_id="flood"), 0, 0.0, offset=100 + i)
    assert {r["tenant_id"] for r in evicted} == {"flood"} and len(evicted) == 170
    assert join.counters.caps["open_requests_per_tenant"] == 170
    assert all(join.get(f"g{i}", "good") is not None for i in range(10))
    # Past the global cap, the tenant holding the most open requests gives way first.
    for i in range(15):
        out = join.add(ev("request_start", 500 + i, rid=f"h{i}", tenant_id="third"), 0, 0.0, offset=500 + i)
        assert all(r["tenant_id"] == "flood" for r in out)
    assert join.open_requests == 50


def test_emitted_requests_are_not_remembered_past_the_cap() -> None:
    cfg = CFG.model_copy(update={"max_remembered_requests": 5})
    join = RequestJoin(cfg, W)
    for i in range(20):
        rid = f"r{i}"
        for k, event in enumerate([ev("request_start", i * 10, rid=rid), ev("first_token", i * 10 + 5, rid=rid)]):
            join.add(event, 0, 0.0, offset=2 * i + k)
    records = join.advance(0, 10_000.0)  # idle 10 s: everything is emitted, then the excess forgotten
    assert len(records) == 20
    assert join.remembered_requests - join.open_requests == 5
    assert join.counters.caps["remembered_requests"] == 15
    assert join.get("r0") is None and join.get("r19") is not None  # the soonest-forgotten went first


def test_a_tenant_running_ahead_never_emits_another_tenants_requests() -> None:
    """Per-tenant watermarks: within the lag bound, one tenant's clock changes nothing for another."""
    alone, mixed = RequestJoin(CFG, W), RequestJoin(CFG, W)
    good = [ev("request_start", i * 1_000, rid=f"g{i}") for i in range(20)]
    good += [ev("first_token", i * 1_000 + 500, rid=f"g{i}") for i in range(20)]
    good.sort(key=lambda e: e.ts_ms)
    ahead = [ev("retrieval", 200_000 + i, 1.0, rid=f"h{i}", tenant_id="hostile") for i in range(20)]
    out_alone: list[Any] = []
    out_mixed: list[Any] = []
    for i, event in enumerate(good):
        out_alone += alone.add(event, 0, 0.0, offset=i) + alone.advance(0, 0.0, caught_up=False)
        out_mixed += mixed.add(ahead[i % 20], 0, 0.0, offset=2 * i) + mixed.add(event, 0, 0.0, offset=2 * i + 1)
        out_mixed += mixed.advance(0, 0.0, caught_up=False)
    good_mixed = [r for r in out_mixed if r["tenant_id"] == "acme"]
    assert [r["request_id"] for r in good_mixed] == [r["request_id"] for r in out_alone]
    assert all(r["status"] != "timed_out" for r in good_mixed)
    assert mixed.watermark(0) == alone.watermark(0)  # the writer's view: the slowest tenant


def test_evictions_take_the_oldest_open_requests_before_and_after_the_age_index_is_dropped() -> None:
    """The age index exists only while a cap is near (built at the first eviction, dropped by advance once
    the join is well below its caps): the victims are always the oldest open requests by started_at."""
    import random

    cfg = CFG.model_copy(update={"max_open_requests": 1_000, "max_open_requests_per_tenant": 8})
    join = RequestJoin(cfg, W)
    rng = random.Random(3)
    offset = 0
    for wave in range(3):
        starts = {f"w{wave}-{i}": 100_000.0 * wave + rng.uniform(0, 500) for i in range(20)}
        evicted: list[str] = []
        for rid, ts in starts.items():
            offset += 1
            evicted += [r["request_id"] for r in join.add(ev("request_start", ts, rid=rid), 0, 0.0, offset=offset)]
        kept = sorted(starts, key=starts.__getitem__)[-8:]
        assert sorted(evicted) == sorted(set(starts) - set(kept)), wave  # the 12 oldest, whatever the order
        assert all(join.get(rid) is not None for rid in kept)
        # Finish the wave: every open request is emitted (an idle minute of wall time), and the index is
        # dropped (the join is below its caps again).
        for rid in kept:
            offset += 1
            join.add(ev("first_token", starts[rid] + 1, rid=rid), 0, 0.0, offset=offset)
        assert len(join.advance(0, 60_000.0)) == 8 and join.open_requests == 0
