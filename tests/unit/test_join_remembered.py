"""Emitted requests the join remembers to absorb late events: the pool's have their own budget and go first, so
a spray of unregistered tenant ids never makes the join forget a registered tenant's (issue 27, item 3); and a
late event of a request forgotten early by a cap becomes an amendment the writer merges, not a new request
whose record would lose to the stored row (or replace it)."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.events import StageEvent
from streams.core.join import FORGOT_PREFIX, RequestJoin
from streams.core.join_record import merge_records
from streams.core.tenancy import TenantBudgets
from streams.settings import JoinConfig, load_settings

W = 60_000
T0 = 1_761_300_000_000.0
CFG = JoinConfig(grace_ms=2_000, request_timeout_ms=30_000, forget_after_ms=120_000, idle_tick_ms=1_000)
#: Fields a late event changes in the stored row, compared between a re-emission and a merged amendment.
MEASURED = ("status", "ttft_ms", "llm_ttft_ms", "retrieval_ms", "missing_stages", "event_count", "started_at")


def ev(tenant: str, rid: str, stage: str, ts: float, dur: float | None = None) -> StageEvent:
    return StageEvent(tenant_id=tenant, request_id=rid, stage=stage, ts_ms=ts, duration_ms=dur)


def _records(out: list[Any]) -> list[dict[str, Any]]:
    return [o for o in out if isinstance(o, dict)]


def _victim_then_spray(join: RequestJoin, spray: int) -> list[dict[str, Any]]:
    """Ten requests of the registered "victim", emitted; then ``spray`` one-event requests of made-up tenants,
    timed out and emitted (the pool's clock moved on by one more). Returns the records."""
    out: list[Any] = []
    for i in range(10):
        out += join.add(ev("victim", f"v{i}", "request_start", T0 + i), 0, 0.0)
        out += join.add(ev("victim", f"v{i}", "first_token", T0 + 500 + i), 0, 0.0)
    for k in range(spray):
        out += join.add(ev(f"fake-{k}", f"f{k}", "request_start", T0 + 1_000 + k), 0, 0.0)
    out += join.add(ev("victim", "tick", "request_start", T0 + 40_000), 0, 0.0)
    out += join.add(ev("fake-tick", "tick", "request_start", T0 + 40_000), 0, 0.0)
    return _records(out + join.advance(0, 0.0, caught_up=False))


def test_a_spray_of_unregistered_tenants_never_makes_the_join_forget_a_registered_tenants_requests() -> None:
    cfg = CFG.model_copy(update={"max_remembered_requests": 100})
    join = RequestJoin(cfg, W, TenantBudgets(frozenset({"victim"})))
    records = _victim_then_spray(join, 300)
    assert len(records) == 310
    assert all(join.get(f"v{i}", "victim") is not None for i in range(10))  # before: all ten forgotten
    assert join.pool_remembered_requests == 90 and join.counters.caps["remembered_requests"] == 210
    # The victim's late event joins its remembered request: the whole record again, with the late stage.
    (again,) = _records(join.add(ev("victim", "v3", "llm_ttft", T0 + 100, 300.0), 0, 0.0))
    assert (again["request_id"], again["event_count"], again["late_events"], again["amend"]) == ("v3", 3, 1, False)
    assert again["llm_ttft_ms"] == 300.0


def test_the_pools_remembered_requests_have_their_own_cap() -> None:
    join = RequestJoin(CFG, W, TenantBudgets(frozenset({"victim"}), max_remembered_pool=50))
    _victim_then_spray(join, 300)
    assert join.pool_remembered_requests == 50
    assert join.counters.caps["remembered_requests_pool"] == 250
    assert join.counters.caps["remembered_requests"] == 0
    assert join.remembered_requests == 10 + 50 + 2  # the victim's, the pool's, and the two open ticks
    assert load_settings().tenancy.max_remembered_requests_pool == 200_000


def test_a_late_event_of_a_request_forgotten_early_is_an_amendment_the_writer_merges_to_the_same_values() -> None:
    def run(cap: int) -> tuple[RequestJoin, dict[str, Any], list[dict[str, Any]]]:
        join = RequestJoin(CFG.model_copy(update={"max_remembered_requests": cap}), W)
        out: list[Any] = []
        for i in range(20):
            out += join.add(ev("acme", f"r{i}", "request_start", T0 + i * 10), 0, 0.0)
            out += join.add(ev("acme", f"r{i}", "retrieval", T0 + i * 10 + 1, 50.0), 0, 0.0)
            out += join.add(ev("acme", f"r{i}", "first_token", T0 + i * 10 + 500), 0, 0.0)
        out += join.add(ev("acme", "tick", "request_start", T0 + 10_000), 0, 0.0)
        first = next(r for r in _records(out + join.advance(0, 0.0, caught_up=False)) if r["request_id"] == "r0")
        late = _records(join.add(ev("acme", "r0", "llm_ttft", T0 + 200, 290.0), 0, 0.0))
        return join, first, late

    remembered, stored, (again,) = run(200_000)
    assert remembered.get("r0", "acme") is not None and not again["amend"] and again["late_events"] == 1
    capped, stored_capped, (amendment,) = run(5)
    assert capped.get("r0", "acme") is None and capped.counters.caps["remembered_requests"] == 15
    assert stored_capped == stored
    # Before: no output now, and later an ``orphan`` record of the late event alone (fewer events than the stored
    # row, so ReplacingMergeTree kept the stored row and the late stage was never counted).
    assert amendment["amend"] and amendment["event_count"] == 1 and amendment["llm_ttft_ms"] == 290.0
    merged = merge_records(stored, amendment, W)
    assert {f: merged[f] for f in MEASURED} == {f: again[f] for f in MEASURED}
    # Once the watermark passed the forget deadlines of the requests forgotten early, a request first seen
    # late is a new request again (as without the cap).
    capped.add(ev("acme", "tick2", "request_start", T0 + 200_000), 0, 0.0)
    capped.advance(0, 0.0, caught_up=False)
    assert capped.add(ev("acme", "new", "request_start", T0 + 195_000), 0, 0.0) == []
    assert capped.get("new", "acme") is not None


def test_the_pools_remembered_count_follows_restore_revoke_and_promotion() -> None:
    join = RequestJoin(CFG, W, TenantBudgets(frozenset({"victim"})))
    _victim_then_spray(join, 30)
    assert join.pool_remembered_requests == 30
    packed = {k: v for k, v in join.dirty().items() if v[1] is not None}
    restored = RequestJoin(CFG, W, TenantBudgets(frozenset({"victim"})))
    for key, (partition, value) in packed.items():
        assert value is not None
        restored.restore(key, value, partition)
    assert restored.pool_remembered_requests == 30
    restored.revoke([0])
    assert restored.pool_remembered_requests == 0 and restored.remembered_requests == 0


def _changelog(join: RequestJoin, log: dict[str, tuple[int, bytes | None]]) -> dict[str, tuple[int, bytes | None]]:
    """``log`` (a compacted changelog: the latest value of each key) after the join's next checkpoint."""
    log.update(join.dirty())
    return log


def _restored(log: dict[str, tuple[int, bytes | None]], cfg: JoinConfig) -> RequestJoin:
    join = RequestJoin(cfg, W)
    for key, (partition, value) in log.items():
        if value is not None:
            join.restore(key, value, partition)
    return join


def test_a_restarted_join_still_sends_a_late_event_of_a_request_forgotten_early_as_an_amendment() -> None:
    cfg = CFG.model_copy(update={"max_remembered_requests": 5})
    join = RequestJoin(cfg, W)
    log: dict[str, tuple[int, bytes | None]] = {}
    for i in range(20):
        join.add(ev("acme", f"r{i}", "request_start", T0 + i * 10), 0, 0.0)
        join.add(ev("acme", f"r{i}", "first_token", T0 + i * 10 + 500), 0, 0.0)
    _changelog(join, log)
    join.add(ev("acme", "tick", "request_start", T0 + 10_000), 0, 0.0)
    join.advance(0, 0.0, caught_up=False)
    assert join.get("r0", "acme") is None and join.counters.caps["remembered_requests"] == 15
    marks = {k: v for k, v in _changelog(join, log).items() if k.startswith(FORGOT_PREFIX)}
    assert list(marks) == [f"{FORGOT_PREFIX}0\x00acme"] and marks[f"{FORGOT_PREFIX}0\x00acme"][1] is not None

    # A restart: the mark comes back with the requests. Before, it lived in memory only, and the late event
    # opened a new request (its one-event record lost to the stored row: the late stage was never counted).
    restarted = _restored(log, cfg)
    assert restarted.get("r0", "acme") is None
    (amendment,) = _records(restarted.add(ev("acme", "r0", "llm_ttft", T0 + 200, 290.0), 0, 0.0))
    assert amendment["amend"] and amendment["llm_ttft_ms"] == 290.0 and restarted.get("r0", "acme") is None

    # Once the watermark passed the mark, it is deleted from the changelog, and a late new request is new again.
    restarted.add(ev("acme", "tick2", "request_start", T0 + 200_000), 0, 0.0)
    restarted.advance(0, 0.0, caught_up=False)
    assert _changelog(restarted, log)[f"{FORGOT_PREFIX}0\x00acme"] == (0, None)
    assert restarted.add(ev("acme", "new", "request_start", T0 + 195_000), 0, 0.0) == []
    assert restarted.get("new", "acme") is not None


def test_an_early_forget_mark_of_a_revoked_partition_is_left_to_its_next_owner() -> None:
    cfg = CFG.model_copy(update={"max_remembered_requests": 1})
    join = RequestJoin(cfg, W)
    for i in range(3):
        join.add(ev("acme", f"r{i}", "request_start", T0 + i), 1, 0.0)
    join.add(ev("acme", "tick", "request_start", T0 + 40_000), 1, 0.0)
    join.advance(1, 0.0, caught_up=False)
    join.revoke([1])
    assert not any(k.startswith(FORGOT_PREFIX) for k in join.dirty())
    with pytest.raises(ValueError):
        join.restore(f"{FORGOT_PREFIX}1\x00acme", b'{"until": "soon"}', 1)


def test_the_marks_of_a_tenant_no_longer_registered_merge_into_the_pools() -> None:
    join = RequestJoin(CFG, W, TenantBudgets(frozenset({"victim"})))
    join.restore(f"{FORGOT_PREFIX}0\x00__other__", b'{"until": 2000.0, "watermark": 1000.0}', 0)
    join.restore(f"{FORGOT_PREFIX}0\x00gone", b'{"until": 3000.0, "watermark": 1500.0}', 0)
    assert join.legacy_keys == [(f"{FORGOT_PREFIX}0\x00__other__", 0)]
    (written,) = [v for k, v in join.dirty().items() if k.startswith(FORGOT_PREFIX)]
    assert written == (0, b'{"until":3000.0,"watermark":1500.0}')


def test_a_late_event_of_a_request_the_pool_forgot_early_is_an_amendment_after_its_tenant_is_promoted() -> None:
    # Failed before: the early-forget mark stayed on the pool's clock; acme's own clock (made when it was promoted)
    # had none, so a late event of r0, forgotten early by the pool's cap while acme was in the pool, was joined
    # as a new request, whose record would lose to the stored row or replace it.
    cfg = CFG.model_copy(update={"forget_after_ms": 300_000})
    join = RequestJoin(cfg, W, TenantBudgets(frozenset(), steady_windows=3, window_ms=W, max_remembered_pool=2))
    out: list[Any] = []
    for i in range(3):
        out += join.add(ev("acme", f"r{i}", "request_start", T0 + 1_000 + i), 0, 0.0)
        out += join.add(ev("acme", f"r{i}", "first_token", T0 + 1_500 + i), 0, 0.0)
    for k in range(5):
        out += join.add(ev(f"fake-{k}", f"f{k}", "request_start", T0 + 2_000 + k), 0, 0.0)
    out += join.add(ev("fake-tick", "tick", "request_start", T0 + 40_000), 0, 0.0)
    out += join.advance(0, 0.0, caught_up=False)
    assert join.get("r0", "acme") is None and join.counters.caps["remembered_requests_pool"] >= 1
    stored = next(r for r in _records(out) if r["request_id"] == "r0")
    for window in (1, 2):
        out += join.add(ev("acme", f"w{window}", "request_start", T0 + window * W + 1_000), 0, 0.0)
    assert join.budgets.is_registered("acme")  # promoted in its third window
    (amendment,) = _records(join.add(ev("acme", "r0", "llm_ttft", T0 + 1_200, 100.0), 0, 0.0))
    assert amendment["amend"] and amendment["event_count"] == 1
    assert join.get("r0", "acme") is None
    merged = merge_records(stored, amendment, W)
    assert (merged["event_count"], merged["llm_ttft_ms"], merged["status"]) == (3, 100.0, stored["status"])
