"""RequestJoin: watermarks, idle tick, emission, late data, eviction, tenant mismatch, dirty, restore."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from schemas.events import StageEvent
from schemas.records import RequestRecord
from streams.core.join import RequestJoin, TenantMismatch
from streams.core.join_state import state_key
from streams.settings import CapsConfig, JoinConfig

T0 = 1_700_000_000_000.0
W = 60_000
K1 = state_key("acme", "r1")
CFG = JoinConfig(grace_ms=2_000, request_timeout_ms=30_000, forget_after_ms=120_000, idle_tick_ms=1_000)


def ev(stage: str, ts: float, dur: float | None = None, rid: str = "r1", **kw: Any) -> StageEvent:
    kw.setdefault("tenant_id", "acme")
    return StageEvent(request_id=rid, stage=stage, ts_ms=T0 + ts, duration_ms=dur, **kw)


def request(rid: str = "r1", at: float = 0.0) -> list[StageEvent]:
    return [
        ev("request_start", at, rid=rid),
        ev("retrieval", at + 10, 300.0, rid=rid),
        ev("prompt_assemble", at + 320, 80.0, rid=rid),
        ev("llm_ttft", at + 400, 900.0, rid=rid),
        ev("first_token", at + 1_350, rid=rid),
    ]


def feed(j: RequestJoin, events: list[StageEvent], partition: int = 0, now: float = 0.0) -> list[Any]:
    out: list[Any] = []
    for e in events:
        out.extend(j.add(e, partition, now))
    return out


def tick(j: RequestJoin, partition: int, at: float, now: float = 0.0, tenant_id: str = "acme") -> list[dict[str, Any]]:
    """Push a tenant's watermark to T0 + at with a span event of another request, then advance."""
    j.add(ev("custom_clock", at, 0.0, rid=f"clock-{at}", tenant_id=tenant_id), partition, now)
    return j.advance(partition, now, caught_up=False)


def ids(records: list[dict[str, Any]]) -> list[str]:
    return [r["request_id"] for r in records]


def test_emitted_when_watermark_passes_first_token_plus_grace() -> None:
    j = RequestJoin(CFG, W)
    assert feed(j, request()) == []
    assert j.advance(0, 0.0) == []
    assert tick(j, 0, 1_350 + 1_999) == []
    (r,) = tick(j, 0, 1_350 + 2_000)
    assert r["request_id"] == "r1" and r["status"] == "complete"
    assert j.open_requests == 2  # the two clock requests
    assert j.counters.emitted["complete"] == 1
    assert tick(j, 0, 10_000) == []  # emitted once


def test_timeout_without_first_token() -> None:
    j = RequestJoin(CFG, W)
    feed(j, request("r1")[:-1])
    feed(j, [ev("retrieval", 5, 10.0, rid="orph")])
    assert tick(j, 0, 30_000 - 1) == []
    out = tick(j, 0, 30_005)
    assert [(r["request_id"], r["status"]) for r in out] == [("r1", "timed_out"), ("orph", "orphan")]
    for r in out:
        RequestRecord.model_validate(r)


def test_partitions_have_their_own_watermark() -> None:
    j = RequestJoin(CFG, W)
    feed(j, request("a"), partition=0)
    feed(j, request("b", at=5), partition=1)
    assert tick(j, 1, 60_000) != []
    assert j.advance(0, 0.0) == []
    assert j.watermark(0) == T0 + 1_350
    assert ids(tick(j, 0, 3_350)) == ["a"]


def test_idle_tick_moves_the_watermark_by_wall_time() -> None:
    j = RequestJoin(CFG, W)
    feed(j, request(), now=1_000.0)
    assert j.advance(0, 1_000.0 + 999) == []  # below idle_tick_ms: no movement
    assert j.watermark(0) == T0 + 1_350
    assert j.advance(0, 1_000.0 + 1_500) == []  # idle: wm = last event end + 1500 < 1350 + 2000
    assert j.watermark(0) == T0 + 1_350 + 1_500
    (r,) = j.advance(0, 1_000.0 + 2_000)
    assert r["status"] == "complete"


def test_replay_at_full_speed_never_idles() -> None:
    j = RequestJoin(CFG, W)
    for i in range(50):
        feed(j, request(f"r{i}", at=i * 10_000.0), now=5.0)
        out = j.advance(0, 5.0)
        assert ids(out) == ([f"r{i - 1}"] if i >= 1 else [])


def test_idle_tick_does_not_move_the_watermark_back() -> None:
    j = RequestJoin(CFG, W)
    feed(j, request(), now=0.0)
    j.advance(0, 10_000.0)
    wm = j.watermark(0)
    feed(j, [ev("retrieval", 0, 1.0, rid="old")], now=10_000.0)
    assert j.watermark(0) == wm


def test_another_tenants_event_with_the_same_id_is_another_request() -> None:
    """docs/design.md: a request is (tenant_id, request_id); one tenant can never merge into another's record."""
    j = RequestJoin(CFG, W)
    feed(j, request()[:2])
    other = ev("prompt_assemble", 320, 80.0, tenant_id="globex")
    assert j.add(other, 0, 0.0) == []
    assert j.counters.tenant_mismatches == 0
    feed(j, request()[3:])
    records = {r["tenant_id"]: r for r in tick(j, 0, 40_000) + tick(j, 0, 40_000, tenant_id="globex")}
    assert records["acme"]["prompt_assemble_ms"] is None and records["acme"]["status"] == "missing_stage"
    assert records["globex"]["prompt_assemble_ms"] == 80.0 and records["globex"]["status"] == "orphan"


def test_tenant_mismatch_dead_letter_keeps_the_source() -> None:
    @dataclass
    class Msg:
        value: bytes | None
        topic: str
        partition: int
        offset: int
        timestamp: float | None

    mismatch = TenantMismatch(ev("retrieval", 0, 1.0, tenant_id="globex"), "tenant differs")
    dl = mismatch.to_dead_letter(Msg(b'{"x": 1}', "ttft.stage-events", 3, 42, 1_700_000_000.5), 5.0, CapsConfig())
    assert (dl.reason_code, dl.request_id, dl.tenant_id, dl.original) == (
        "tenant_mismatch",
        "r1",
        "globex",
        b'{"x": 1}',
    )
    # Source fields by value: their names belong to schemas.dead_letter.
    source = set(dl.model_dump().values())
    assert {"ttft.stage-events", 3, 42, 1_700_000_000_500} <= source


def test_late_event_for_emitted_request_re_emits_the_whole_record() -> None:
    j = RequestJoin(CFG, W)
    feed(j, [e for e in request() if e.stage != "prompt_assemble"])
    (first,) = tick(j, 0, 5_000)
    assert first["status"] == "missing_stage"
    assert feed(j, [ev("retrieval", 10, 300.0)]) == []  # duplicate: counted, nothing emitted
    assert j.counters.duplicates == 1
    (again,) = feed(j, [ev("prompt_assemble", 320, 80.0)])
    assert again["status"] == "complete" and again["late_events"] == 1 and again["amend"] is False
    assert again["event_count"] == first["event_count"] + 1
    assert again["duplicate_events"] == 1
    assert again["record_version"] > first["record_version"]
    assert j.counters.late_events == 1 and j.counters.re_emitted == 1
    assert j.counters.emitted["missing_stage"] == 1 and j.counters.emitted["complete"] == 0


def test_emitted_request_is_forgotten_after_forget_after() -> None:
    j = RequestJoin(CFG, W)
    feed(j, request())
    tick(j, 0, 3_350)  # emitted at its deadline 3350
    j.dirty()
    tick(j, 0, 3_350 + 120_000 - 1)
    assert j.get("r1") is not None
    tick(j, 0, 3_350 + 120_000)
    assert j.get("r1") is None
    assert j.dirty()[K1] == (0, None)


def test_late_event_of_a_forgotten_request_is_an_amendment_without_state() -> None:
    j = RequestJoin(CFG, W)
    feed(j, request())
    tick(j, 0, 200_000)
    assert j.get("r1") is None
    j.dirty()
    (amend,) = feed(j, [ev("rerank", 250, 40.0)])
    RequestRecord.model_validate(amend)
    assert amend["amend"] is True and amend["late_events"] == 1 and amend["event_count"] == 1
    assert amend["rerank_ms"] == 40.0 and amend["status"] == "orphan"
    assert j.get("r1") is None and j.dirty() == {}
    assert j.counters.amendments == 1 and j.counters.late_events == 1


def test_unknown_request_inside_forget_horizon_is_a_new_request() -> None:
    j = RequestJoin(CFG, W)
    tick(j, 0, 100_000)
    assert feed(j, [ev("rerank", 250, 40.0)]) == []
    assert j.get("r1") is not None


def test_eviction_of_the_oldest_open_request_by_started_at() -> None:
    j = RequestJoin(CFG.model_copy(update={"max_open_requests": 3}), W)
    feed(j, [ev("request_start", 500, rid="b"), ev("retrieval", 100, 5.0, rid="c")])
    feed(j, [ev("request_start", 900, rid="d")])
    assert j.open_requests == 3
    (evicted,) = feed(j, [ev("retrieval", 50, 5.0, rid="a")])  # the newest arrival is the oldest
    assert (evicted["request_id"], evicted["status"]) == ("a", "orphan")
    (evicted,) = feed(j, [ev("request_start", 1_000, rid="e")])
    assert (evicted["request_id"], evicted["status"]) == ("c", "orphan")
    (evicted,) = feed(j, [ev("request_start", 1_100, rid="f")])
    assert (evicted["request_id"], evicted["status"]) == ("b", "timed_out")
    assert j.counters.evictions == 3 and j.open_requests == 3
    # An evicted request is remembered: its late events re-emit it.
    (again,) = feed(j, [ev("first_token", 1_500, rid="b")])
    assert again["late_events"] == 1 and again["first_token_at"] == T0 + 1_500


def test_eviction_uses_updated_started_at() -> None:
    j = RequestJoin(CFG.model_copy(update={"max_open_requests": 2}), W)
    feed(j, [ev("retrieval", 100, 5.0, rid="x"), ev("retrieval", 50, 5.0, rid="y")])
    feed(j, [ev("request_start", 10, rid="x")])  # x now started at 10, before y
    (evicted,) = feed(j, [ev("request_start", 5_000, rid="z")])
    assert (evicted["request_id"], evicted["status"]) == ("x", "timed_out")


def test_dirty_holds_one_write_per_request_per_batch() -> None:
    j = RequestJoin(CFG, W)
    feed(j, request("a") + request("b"))
    dirty = j.dirty()
    assert set(dirty) == {state_key("acme", "a"), state_key("acme", "b")}
    assert all(p == 0 and packed for p, packed in dirty.values())
    assert j.dirty() == {} and not j.has_dirty()
    feed(j, [ev("retrieval", 10, 300.0, rid="a")])  # a duplicate changes the duplicate count
    assert set(j.dirty()) == {state_key("acme", "a")}


def test_revoke_drops_state_and_pending_writes() -> None:
    j = RequestJoin(CFG, W)
    feed(j, request("a"), partition=0)
    feed(j, request("b"), partition=1)
    j.revoke({1})
    assert j.get("b") is None and j.get("a") is not None and j.open_requests == 1
    assert set(j.dirty()) == {state_key("acme", "a")}
    assert j.advance(1, 10**9) == []


def test_restore_then_replay_changes_nothing() -> None:
    events = [*request(), ev("rerank", 250, 40.0)]
    reference = RequestJoin(CFG, W)
    for offset, e in enumerate(events):
        reference.add(e, 0, 0.0, offset=offset)
    (expected,) = tick(reference, 0, 10_000)

    crashed = RequestJoin(CFG, W)
    for offset, e in enumerate(events[:3]):
        crashed.add(e, 0, 0.0, offset=offset)
    snapshot = crashed.dirty()
    recovered = RequestJoin(CFG, W)
    for rid, (partition, packed) in snapshot.items():
        assert packed is not None
        assert recovered.restore(rid, packed) == partition
    assert recovered.open_requests == 1 and recovered.dirty() == {}
    for offset, e in enumerate(events):  # the broker redelivers from the last commit
        assert recovered.add(e, 0, 0.0, offset=offset) == []
    assert recovered.counters.replayed == 3 and recovered.counters.duplicates == 0
    (record,) = tick(recovered, 0, 10_000)
    assert record == expected


def test_replay_without_offsets_only_counts_duplicates() -> None:
    j = RequestJoin(CFG, W)
    feed(j, request()[:3])
    ((rid, (_, packed)),) = j.dirty().items()
    recovered = RequestJoin(CFG, W)
    assert packed is not None
    recovered.restore(rid, packed)
    feed(recovered, request())
    (r,) = tick(recovered, 0, 10_000)
    assert r["duplicate_events"] == 3 and r["event_count"] == 5 and r["status"] == "complete"


def test_restored_emitted_request_is_not_emitted_again() -> None:
    j = RequestJoin(CFG, W)
    for offset, e in enumerate(request()):
        j.add(e, 0, 0.0, offset=offset)
    tick(j, 0, 5_000)
    packed = j.dirty()[K1][1]
    assert packed is not None
    recovered = RequestJoin(CFG, W)
    recovered.restore(K1, packed)
    assert recovered.open_requests == 0
    assert recovered.watermark(0) >= T0 + 3_350
    assert recovered.advance(0, 0.0) == []
    for offset, e in enumerate(request()):
        assert recovered.add(e, 0, 0.0, offset=offset) == []
    assert recovered.advance(0, 10**9) == []  # forgotten, never re-emitted
    assert recovered.dirty() == {K1: (0, None)}


def test_restore_rejects_corrupt_state() -> None:
    j = RequestJoin(CFG, W)
    for bad in (b"{", b"[99]", b'{"a": 1}', b"[1, 0]"):
        with pytest.raises(ValueError):
            j.restore("r1", bad)


def test_restore_with_partition_override_and_reset() -> None:
    j = RequestJoin(CFG, W)
    feed(j, request())
    packed = j.dirty()[K1][1]
    assert packed is not None
    other = RequestJoin(CFG, W)
    assert other.restore(K1, packed, partition=5) == 5
    assert other.restore(K1, packed, partition=5) == 5  # restoring twice does not double count
    assert other.open_requests == 1
    assert ids(tick(other, 5, 10_000)) == ["r1"]
    other.reset()
    assert other.open_requests == 0 and other.get("r1") is None


def test_request_first_seen_behind_the_watermark_gets_a_grace_period() -> None:
    # A service with a lagging clock: its whole request is older than the partition's watermark.
    j = RequestJoin(CFG, W)
    tick(j, 0, 100_000)
    feed(j, request("lagging")[:2])
    assert j.advance(0, 0.0) == []
    feed(j, request("lagging")[2:])
    assert j.advance(0, 0.0) == []
    (r,) = [r for r in tick(j, 0, 102_000) if r["request_id"] == "lagging"]
    assert r["status"] == "complete"


def test_a_changelog_keyed_by_bare_request_id_is_rekeyed() -> None:
    """A changelog written before issue 14 (key = request id): restored, then rewritten under the
    (tenant, request id) key, and its old key listed for deletion."""
    j = RequestJoin(CFG, W)
    feed(j, request()[:3])
    packed = j.dirty()[K1][1]
    assert packed is not None
    recovered = RequestJoin(CFG, W)
    assert recovered.restore("r1", packed) == 0
    assert recovered.legacy_keys == [("r1", 0)]
    assert set(recovered.dirty()) == {K1}
    pending = recovered.get("r1", "acme")
    assert pending is not None and pending.request_id == "r1" and pending.key == K1
    feed(recovered, request()[3:])
    (record,) = tick(recovered, 0, 40_000)
    assert record["request_id"] == "r1" and record["status"] == "complete"


def test_time_the_partition_was_not_caught_up_never_counts_as_silence() -> None:
    """A broker outage (no fetch answered) or a backlog: the partition is not known to be caught up. Once it
    is again, its tenants' idle time starts then; before, a 40 s outage moved the watermark 40 s at the first
    idle fold, and a request whose first token was still on its way was emitted ``timed_out``."""
    j = RequestJoin(CFG, W)
    feed(j, request()[:-1], now=1_000.0)  # no first_token yet: it is on its way
    for now in (2_000.0, 20_000.0, 41_000.0):  # the broker down: not caught up
        assert j.advance(0, now, caught_up=False) == []
    assert j.advance(0, 41_500.0) == []  # caught up again: the idle clock starts now
    assert j.advance(0, 41_500.0 + 999) == []
    assert j.watermark(0) == T0 + 400 + 900
    feed(j, request()[-1:], now=42_600.0)  # its first token arrives after the outage
    (r,) = j.advance(0, 42_600.0 + 2_000 + 1_000)
    assert r["status"] == "complete"
    j.hold_idle(0)  # what the join's fold calls for a partition it cannot read (no records, not caught up)
    assert j.advance(0, 100_000.0) == []
