from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import numpy as np
import pytest

from streams.core.rollup import rollup_rows
from streams.core.series import SeriesAdmission
from streams.core.windows import aggregate_window, aggregate_windows
from streams.settings import Settings, TenantConfig
from tests.support.window_records import HOUR_START_MS, synthetic_records

ACCURACY = 0.01
STAGE_COLUMNS = ("retrieval", "vector_recall", "bm25_recall", "rerank", "prompt_assemble", "llm_ttft")


def _record(rid: str, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "request_id": rid,
        "tenant_id": "acme",
        "version_id": "v1",
        "route": "main",
        "status": "complete",
        "started_at": 1_000.0,
        "first_token_at": 2_000.0,
        "window_start": 0.0,
        "ttft_ms": 1_000.0,
        "retrieval_ms": 300.0,
        "prompt_assemble_ms": 100.0,
        "llm_ttft_ms": 550.0,
        "other_ms": 50.0,
        "custom_stages": {},
        "late_events": 0,
        "record_version": 1_000,
    }
    return base | fields


def _by_stage(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["stage"]: r for r in rows}


def _truth(records: list[dict[str, Any]]) -> dict[tuple[Any, ...], list[float]]:
    """Exact values per (window, tenant, version, stage), written independently of streams.core.stages."""
    values: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for r in records:
        if r["status"] not in ("complete", "missing_stage"):
            continue
        key = (int(r["window_start"]), r["tenant_id"], r["version_id"])
        for stage in STAGE_COLUMNS:
            if r[f"{stage}_ms"] is not None:
                values[(*key, stage)].append(r[f"{stage}_ms"])
        if r["other_ms"] is not None:
            values[(*key, "other")].append(max(r["other_ms"], 0.0))
        for name, v in r["custom_stages"].items():
            values[(*key, name)].append(v)
        if r["ttft_ms"] is not None:
            values[(*key, "ttft")].append(r["ttft_ms"])
    return values


def _assert_close(estimate: float | None, exact: float, context: str) -> None:
    assert estimate is not None, context
    assert abs(estimate - exact) <= ACCURACY * exact + 1e-9, f"{context}: {estimate} vs exact {exact}"


def test_accuracy_100k_requests_every_window_and_hour_rollup() -> None:
    records = synthetic_records(100_000)
    settings = Settings()
    windows = aggregate_windows(records, settings)
    rows = [row for agg in windows.values() for row in agg.stage_windows]
    truth = _truth(records)
    checked = 0
    for row in rows:
        exact = truth.get((row["window_start"], row["tenant_id"], row["version_id"], row["stage"]), [])
        assert row["count"] == len(exact)
        if len(exact) < 50:
            continue
        for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
            _assert_close(row[name], float(np.quantile(exact, q, method="lower")), f"{row['stage']} {name}")
        assert row["max"] == max(exact)
        checked += 1
    assert checked >= 60 * 6 * 8
    # One hour, merged in Python from the stored bins, against numpy over the hour's raw values.
    hourly: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for (_, tenant, version, stage), vals in truth.items():
        hourly[(tenant, version, stage)].extend(vals)
    rollups = rollup_rows(rows)
    assert set(rollups) == set(hourly)
    for key, rollup in rollups.items():
        assert rollup.count == len(hourly[key])
        for q in (0.5, 0.95, 0.99):
            _assert_close(rollup.quantile(q), float(np.quantile(hourly[key], q, method="lower")), str(key))


def test_only_complete_and_missing_stage_feed_sketches_and_outages_count_as_slo_bad() -> None:
    records = [
        _record("a", ttft_ms=500.0),
        _record("b", ttft_ms=2_500.0),  # above the default 2 s SLO
        _record("c", status="missing_stage", prompt_assemble_ms=None, other_ms=None, ttft_ms=900.0),
        _record("d", status="timed_out", first_token_at=None, ttft_ms=None, other_ms=None, llm_ttft_ms=None),
        _record("e", status="orphan", first_token_at=None, ttft_ms=None, other_ms=None),
    ]
    rows = _by_stage(aggregate_window(records, 0, Settings()).stage_windows)
    assert rows["ttft"]["count"] == 3
    assert rows["ttft"]["slo_bad_count"] == 3  # b + timed_out + orphan
    assert rows["prompt_assemble"]["count"] == 2
    assert rows["retrieval"]["count"] == 3
    assert all(r["slo_bad_count"] == 0 for s, r in rows.items() if s != "ttft")


def test_tenant_slo_is_used_for_slo_bad() -> None:
    settings = Settings(tenants={"acme": TenantConfig(slo_ms=400.0)})
    rows = _by_stage(aggregate_window([_record("a", ttft_ms=500.0)], 0, settings).stage_windows)
    assert rows["ttft"]["slo_bad_count"] == 1


def test_outage_window_keeps_a_ttft_row_with_its_slo_bad_count() -> None:
    records = [_record(f"t{i}", status="timed_out", first_token_at=None, ttft_ms=None) for i in range(4)]
    rows = _by_stage(aggregate_window(records, 0, Settings()).stage_windows)
    assert rows["ttft"]["count"] == 0
    assert rows["ttft"]["p95"] is None
    assert rows["ttft"]["slo_bad_count"] == 4


def test_other_is_clamped_at_zero_and_negatives_are_counted() -> None:
    records = [_record("a", other_ms=-3.0), _record("b", other_ms=-0.5), _record("c", other_ms=40.0)]
    row = _by_stage(aggregate_window(records, 0, Settings()).stage_windows)["other"]
    assert row["count"] == 3
    assert row["negative_count"] == 2
    assert row["zero_count"] == 2
    assert row["p50"] == 0.0
    assert row["max"] == 40.0


def test_stage_rows_cover_parents_sub_stages_custom_and_ttft_in_order() -> None:
    records = [
        _record("a", vector_recall_ms=100.0, rerank_ms=80.0, custom_stages={"guardrail": 7.0, "ttft": 1.0}),
    ]
    stages = [r["stage"] for r in aggregate_window(records, 0, Settings()).stage_windows]
    assert stages == [
        "retrieval",
        "prompt_assemble",
        "llm_ttft",
        "vector_recall",
        "rerank",
        "other",
        "guardrail",
        "ttft",
    ]


def test_rows_do_not_depend_on_record_order() -> None:
    records = synthetic_records(3_000, span_ms=60_000)
    shuffled = records[:]
    random.Random(5).shuffle(shuffled)
    settings = Settings()
    first = aggregate_window(records, HOUR_START_MS, settings)
    second = aggregate_window(shuffled, HOUR_START_MS, settings)
    assert first == second


def test_computed_version_grows_when_a_series_sees_more() -> None:
    records = [_record("a"), _record("b"), _record("x", tenant_id="other-tenant", record_version=7)]
    before = aggregate_window(records, 0, Settings())
    after = aggregate_window([*records, _record("c", record_version=1_200)], 0, Settings())
    assert [r["computed_version"] for r in before.window_health] == [2_000, 7]
    assert [r["computed_version"] for r in after.window_health] == [3_200, 7]
    assert {r["computed_version"] for r in after.stage_windows if r["tenant_id"] == "acme"} == {3_200}


def test_health_versions_and_totals_add_up_to_the_window_fingerprint() -> None:
    records = synthetic_records(2_000, span_ms=60_000)
    health = aggregate_window(records, HOUR_START_MS, Settings()).window_health
    assert sum(r["total"] for r in health) == len(records)
    assert sum(r["computed_version"] for r in health) == sum(r["record_version"] for r in records)


def test_strata_split_by_route_cache_and_prompt_length() -> None:
    records = [
        _record("a", route="fast", prompt_cache_hit=True, prompt_tokens=500),
        _record("b", route="fast", prompt_cache_hit=True, prompt_tokens=700),
        _record("c", route="main", prompt_cache_hit=False, prompt_tokens=5_000),
        _record("d", route=None, prompt_cache_hit=None, prompt_tokens=None),
    ]
    strata = aggregate_window(records, 0, Settings()).stage_strata
    ttft = {(r["route"], r["prompt_cache"], r["prompt_bucket"]): r["count"] for r in strata if r["stage"] == "ttft"}
    assert ttft == {
        ("fast", "hit", "<1k"): 2,
        ("main", "miss", "4k-16k"): 1,
        ("unknown", "unknown", "unknown"): 1,
    }
    windows = _by_stage(aggregate_window(records, 0, Settings()).stage_windows)
    merged = rollup_rows([r for r in strata if r["stage"] == "ttft"], group_by=("stage",))[("ttft",)]
    assert merged.bins == windows["ttft"]["bins"]


def test_series_overflow_goes_to_other_with_a_counter() -> None:
    records = [_record(f"r{i}", tenant_id=f"tenant-{i}") for i in range(5)]
    agg = aggregate_window(records, 0, Settings(), admission=SeriesAdmission(max_series=2))
    series = {(r["tenant_id"], r["version_id"]) for r in agg.window_health}
    assert len(series) == 3
    assert ("__other__", "__other__") in series
    other = next(r for r in agg.window_health if r["tenant_id"] == "__other__")
    assert other["total"] == 3
    assert other["overflow_series"] == 3
    assert agg.overflow_series == 3
    assert sum(r["count"] for r in agg.stage_windows if r["stage"] == "ttft") == 5


def test_dead_letter_only_tenant_gets_a_health_row() -> None:
    dead: dict[tuple[str, str] | str, int] = {"ghost": 4, ("acme", "v1"): 1}
    agg = aggregate_window([_record("a")], 0, Settings(), dead_letters=dead, late_amendments={("acme", "v1"): 2})
    health = {(r["tenant_id"], r["version_id"]): r for r in agg.window_health}
    assert health[("ghost", "unknown")]["dead_letters"] == 4
    assert health[("ghost", "unknown")]["total"] == 0
    assert health[("acme", "v1")]["dead_letters"] == 1
    assert health[("acme", "v1")]["late_amendments"] == 2
    assert not [r for r in agg.stage_windows if r["tenant_id"] == "ghost"]


def test_empty_window_has_no_rows() -> None:
    agg = aggregate_window([], 0, Settings())
    assert agg.stage_windows == agg.window_health == agg.tail_attribution == []


@pytest.mark.parametrize("value", [0.0, 0.0005])
def test_tiny_values_go_to_the_zero_count(value: float) -> None:
    row = _by_stage(aggregate_window([_record("a", prompt_assemble_ms=value)], 0, Settings()).stage_windows)
    assert row["prompt_assemble"]["zero_count"] == 1
    assert row["prompt_assemble"]["bins"] == {}


def test_a_tenants_excess_versions_fold_into_its_own_other_row() -> None:
    """Issue 14 item 5: the per-tenant version cap folds into (tenant, __other__), not the shared row."""
    records = [_record(f"n{i}", tenant_id="noisy", version_id=f"v{i}") for i in range(8)]
    records += [_record("g1", tenant_id="good", version_id="v1")]
    settings = Settings(windows={"max_versions_per_tenant": 3})
    agg = aggregate_window(records, 0, settings)
    health = {(r["tenant_id"], r["version_id"]): r for r in agg.window_health}
    assert ("good", "v1") in health and ("__other__", "__other__") not in health
    assert health[("noisy", "__other__")]["overflow_series"] == 5
    assert health[("noisy", "__other__")]["total"] == 5
    assert sum(1 for t, _ in health if t == "noisy") == 4  # three versions and its own __other__


def test_a_tenants_custom_stages_and_routes_past_its_caps_fold_into_other() -> None:
    """Issue 14 item 5: custom stages and routes are capped per tenant; known stages never fold."""
    noisy = [
        _record(f"n{i}", tenant_id="noisy", route=f"route-{i}", custom_stages={f"step_{i}": 10.0 + i})
        for i in range(12)
    ]
    good = [_record("g1", tenant_id="good", route="main", custom_stages={"my_step": 5.0})]
    settings = Settings(windows={"max_custom_stages_per_tenant": 4, "max_routes_per_tenant": 3})
    agg = aggregate_window(noisy + good, 0, settings)
    noisy_stages = {r["stage"] for r in agg.stage_windows if r["tenant_id"] == "noisy"}
    customs = noisy_stages - {"retrieval", "prompt_assemble", "llm_ttft", "other", "ttft"}
    assert len(customs) == 5 and "__other__" in customs  # four kept, the rest merged
    folded = next(r for r in agg.stage_windows if r["tenant_id"] == "noisy" and r["stage"] == "__other__")
    assert folded["count"] == 8
    assert {r["stage"] for r in agg.stage_windows if r["tenant_id"] == "good"} >= {"my_step", "ttft"}
    routes = {r["route"] for r in agg.stage_strata if r["tenant_id"] == "noisy"}
    assert len(routes) == 4 and "__other__" in routes
    assert {r["route"] for r in agg.stage_strata if r["tenant_id"] == "good"} == {"main"}
    assert (agg.folded_custom_stages, agg.folded_routes) == (8, 9)
    shuffled = aggregate_window(list(reversed(noisy + good)), 0, settings)
    assert shuffled.stage_windows == agg.stage_windows  # deterministic, whatever the order
