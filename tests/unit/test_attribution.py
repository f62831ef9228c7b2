from __future__ import annotations

from typing import Any

import numpy as np

from streams.core.attribution import INSUFFICIENT, MIN_RECORDS, OK, advice, tail_attribution_row
from streams.core.windows import aggregate_window
from streams.settings import Settings
from tests.support.window_records import HOUR_START_MS, synthetic_records


def _record(i: int, retrieval: float, assemble: float, llm: float, other: float = 20.0) -> dict[str, Any]:
    return {
        "request_id": f"r{i:05d}",
        "tenant_id": "acme",
        "version_id": "v1",
        "status": "complete",
        "first_token_at": 1.0,
        "ttft_ms": retrieval + assemble + llm + other,
        "retrieval_ms": retrieval,
        "prompt_assemble_ms": assemble,
        "llm_ttft_ms": llm,
        "other_ms": other,
    }


def _retrieval_tail(n: int = 400) -> list[dict[str, Any]]:
    """LLM is the biggest stage everywhere; retrieval is small but explodes in the slowest requests."""
    rng = np.random.default_rng(1)
    out = []
    for i in range(n):
        llm = float(rng.uniform(900.0, 1_000.0))
        retrieval = float(rng.uniform(100.0, 150.0))
        if i % 25 == 0:  # 4 % of requests: a retrieval timeout-and-retry
            retrieval += 700.0
        out.append(_record(i, retrieval, 80.0, llm))
    return out


def test_fewer_than_min_records_is_insufficient_data() -> None:
    records = _retrieval_tail(MIN_RECORDS - 1)
    row = tail_attribution_row(0, ("acme", "v1"), records)
    assert row["status"] == INSUFFICIENT
    assert row["n"] == MIN_RECORDS - 1
    slowest = sorted(records, key=lambda r: -r["ttft_ms"])[:5]  # named even when too few to attribute
    assert row["exemplar_request_ids"] == [r["request_id"] for r in slowest]


def test_only_complete_records_with_ttft_count() -> None:
    records = _retrieval_tail(MIN_RECORDS)
    records[0] = records[0] | {"status": "missing_stage"}
    row = tail_attribution_row(0, ("acme", "v1"), records)
    assert row["status"] == INSUFFICIENT
    assert row["n"] == MIN_RECORDS - 1


def test_biggest_p95_and_tail_dominant_stage_can_differ() -> None:
    records = _retrieval_tail()
    row = tail_attribution_row(0, ("acme", "v1"), records)
    assert row["status"] == OK
    assert row["biggest_p95_stage"] == "llm_ttft"
    assert row["tail_dominant_stage"] == "retrieval"
    assert row["share_delta"]["retrieval"] > 0.2
    assert abs(sum(row["tail_share"].values()) - 1.0) < 1e-9


def test_tail_is_above_the_exact_p95_and_band_is_40_to_60() -> None:
    records = _retrieval_tail()
    ttfts = np.array([r["ttft_ms"] for r in records])
    row = tail_attribution_row(0, ("acme", "v1"), records)
    p95 = float(np.quantile(ttfts, 0.95, method="lower"))
    low, high = (float(np.quantile(ttfts, q, method="lower")) for q in (0.4, 0.6))
    assert row["ttft_p95"] == p95
    assert row["tail_count"] == int((ttfts > p95).sum())
    assert row["band_count"] == int(((ttfts >= low) & (ttfts <= high)).sum())
    assert row["stage_p95"]["llm_ttft"] == float(np.quantile([r["llm_ttft_ms"] for r in records], 0.95, method="lower"))


def test_exemplars_are_the_five_slowest() -> None:
    records = _retrieval_tail()
    row = tail_attribution_row(0, ("acme", "v1"), records)
    slowest = sorted(records, key=lambda r: -r["ttft_ms"])[:5]
    assert row["exemplar_request_ids"] == [r["request_id"] for r in slowest]


def test_window_aggregation_attributes_every_series() -> None:
    records = synthetic_records(6_000, span_ms=60_000)
    rows = aggregate_window(records, HOUR_START_MS, Settings()).tail_attribution
    assert len(rows) == 6
    assert all(r["status"] == OK and r["tail_dominant_stage"] for r in rows)
    assert {r["biggest_p95_stage"] for r in rows} == {"llm_ttft"}


def test_advice_without_attribution_falls_back_to_biggest_p95() -> None:
    stage, reason = advice({"retrieval": 900.0, "prompt_assemble": 400.0, "llm_ttft": 1_800.0}, [])
    assert stage == "llm_ttft"
    assert "largest stage P95" in reason


def test_advice_names_the_stage_that_makes_slow_requests_slow() -> None:
    row = tail_attribution_row(0, ("acme", "v1"), _retrieval_tail())
    stage, reason = advice(row["stage_p95"], [row])
    assert stage == "retrieval"
    assert "slow requests slow" in reason


def test_advice_names_the_largest_tail_stage_when_no_stage_dominates() -> None:
    records = synthetic_records(6_000, span_ms=60_000, versions=("v1",), tenants=("acme",))
    row = aggregate_window(records, HOUR_START_MS, Settings()).tail_attribution[0]
    stage, reason = advice(row["stage_p95"], [row, row | {"status": INSUFFICIENT}])
    assert stage == "llm_ttft"
    assert "largest share" in reason


def test_advice_with_no_data() -> None:
    assert advice({}, []) == ("", "no latency data in the span")
