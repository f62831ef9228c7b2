from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from streams.core.health import llm_signals_row, lower_quantile, window_health_row
from streams.settings import Settings, WindowConfig


def _record(status: str = "complete", **fields: Any) -> dict[str, Any]:
    return {"request_id": "r", "tenant_id": "acme", "version_id": "v1", "status": status} | fields


def test_health_counts_and_shares_each_status() -> None:
    records = [_record()] * 6 + [_record("missing_stage")] * 2
    records += [_record("timed_out"), _record("orphan", late_events=3, duplicate_events=2)]
    row = window_health_row(0, ("acme", "v1"), records, late_amendments=4, dead_letters=5, amendments=2)
    assert row["total"] == 10
    assert (row["complete"], row["missing_stage"], row["timed_out"], row["orphan"]) == (6, 2, 1, 1)
    assert row["complete_share"] == pytest.approx(0.6)
    assert row["orphan_share"] == pytest.approx(0.1)
    assert row["late_events"] == 3
    assert row["duplicate_events"] == 2
    assert (row["late_amendments"], row["dead_letters"], row["amendments"]) == (4, 5, 2)


def test_health_of_a_window_with_only_dead_letters() -> None:
    row = window_health_row(0, ("ghost", "unknown"), [], dead_letters=3)
    assert row["total"] == 0
    assert row["complete_share"] == 0.0
    assert row["dead_letters"] == 3


@pytest.mark.parametrize("q", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_lower_quantile_matches_numpy_lower(q: float) -> None:
    values = sorted(np.random.default_rng(2).uniform(0, 1, 101).tolist())
    assert lower_quantile(values, q) == float(np.quantile(values, q, method="lower"))
    assert lower_quantile([], q) is None


def test_llm_signals() -> None:
    rng = np.random.default_rng(4)
    drafts = rng.beta(5, 3, 300).tolist()
    records = [
        _record(
            prompt_cache_hit=i % 4 == 0,
            prompt_tokens=500 if i % 5 == 0 else 3_000,
            draft_accept_rate=drafts[i],
            route="fast" if i % 3 == 0 else "main",
            fallback_level=1 if i % 10 == 0 else 0,
            recall_mode="parallel",
            rerank_top_k=10 + i % 7,
        )
        for i in range(300)
    ]
    records.append(_record("timed_out"))  # no attributes: counted in mixes as unknown, nowhere else
    row = llm_signals_row(0, ("acme", "v1"), records, Settings())
    assert row["requests"] == 301
    assert row["prompt_cache_known"] == 300
    assert row["prompt_cache_hit_rate"] == pytest.approx(75 / 300)
    assert row["below_cacheable_share"] == pytest.approx(60 / 300)
    assert row["cacheable_min_tokens"] == 1_024
    assert row["draft_accept_p50"] == float(np.quantile(drafts, 0.5, method="lower"))
    assert row["draft_accept_p10"] == float(np.quantile(drafts, 0.1, method="lower"))
    assert row["route_mix"] == {"fast": 100, "main": 200, "unknown": 1}
    assert row["fallback_mix"] == {"0": 271, "1": 30}
    assert row["recall_mode_mix"] == {"parallel": 300, "unknown": 1}
    assert row["rerank_top_k_p50"] == 13
    assert row["rerank_top_k_max"] == 16


def test_cacheable_minimum_is_a_setting() -> None:
    records = [_record(prompt_tokens=1_500)]
    row = llm_signals_row(0, ("acme", "v1"), records, Settings(windows=WindowConfig(cacheable_min_tokens=2_048)))
    assert row["below_cacheable_share"] == 1.0


def test_llm_signals_without_attributes_are_null_rates() -> None:
    row = llm_signals_row(0, ("acme", "v1"), [_record()], Settings())
    assert row["prompt_cache_hit_rate"] is None
    assert row["below_cacheable_share"] is None
    assert row["draft_accept_p50"] is None
    assert row["rerank_top_k_p50"] is None
