from __future__ import annotations

from typing import Any

from streams.core.whatif import RequestColumns, WhatIf
from streams.demo.story_whatif import TOLERANCE, FixOutcome, predict_fixes, story_fixes


def test_the_fixes_are_the_levers_their_profiles_amount_to() -> None:
    assert [(f.phase, f.before, f.command) for f in story_fixes()] == [
        ("parallel-recall", "before", "--parallel-recall --scale rerank=0.49"),
        ("stable-prefix", "parallel-recall", "--cache-hits 0.84 --cached-share 0.75 --scale prompt_assemble=0.64"),
        ("routing-speculative", "stable-prefix", "--route-share fast=0.58:0.4 --scale llm_ttft=0.84"),
    ]


def _whatif(predicted: float, lo: float, hi: float, naive: float) -> WhatIf:
    return WhatIf(1_000, {"p95": 3_000.0}, {"p95": predicted}, (lo, hi), naive, ())


def test_a_prediction_holds_inside_its_interval_or_within_five_percent() -> None:
    fix = story_fixes()[0]
    inside = FixOutcome(fix, _whatif(2_665.0, 2_574.0, 2_792.0, 2_687.0), 2_789.0)
    assert inside.inside and inside.holds
    assert inside.line() == (
        "fix parallel-recall, predicted on phase before with --parallel-recall --scale rerank=0.49: TTFT P95 "
        "2,665 ms (95 % CI 2,574-2,792) over 1,000 requests; observed after it 2,789 ms: -4.4%, inside the "
        "interval; naive estimate 2,687 ms (-3.7%)"
    )
    near = FixOutcome(fix, _whatif(2_700.0, 2_600.0, 2_650.0, 2_500.0), 2_700.0 * (1 + TOLERANCE * 0.9))
    assert not near.inside and near.holds
    far = FixOutcome(fix, _whatif(2_420.0, 2_313.0, 2_529.0, 2_369.0), 2_228.0)
    assert not far.holds and "+8.6%, outside the interval" in far.line()
    assert FixOutcome(fix, None, 2_789.0, "too few donors").line().endswith(": no prediction (too few donors)")


def _record(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "status": "complete",
        "first_token_at": 1.0,
        "retrieval_ms": 300.0,
        "vector_recall_ms": 120.0,
        "bm25_recall_ms": 90.0,
        "rerank_ms": 80.0,
        "prompt_assemble_ms": 100.0,
        "llm_ttft_ms": 900.0,
        "recall_mode": "serial",
        "prompt_tokens": 2_000,
        "prompt_cache_hit": False,
        "route": "main",
    }
    base |= fields
    base["ttft_ms"] = base["retrieval_ms"] + base["prompt_assemble_ms"] + base["llm_ttft_ms"] + 10.0
    return base


def test_predict_fixes_says_why_a_fix_has_no_prediction() -> None:
    misses = RequestColumns.from_records([_record(llm_ttft_ms=900.0 + i) for i in range(50)])
    outcomes = predict_fixes({"before": misses, "parallel-recall": misses})
    first, cache, routing = outcomes
    assert first.result is not None and first.observed_p95 is not None and first.error is not None
    assert first.result.predicted["p95"] < first.observed_p95  # serial recall made parallel, rerank x0.49
    assert cache.result is None and "prompt and cached token counts" in cache.refused  # nothing to fit
    assert routing.result is None and routing.refused == "no complete requests in phase stable-prefix"
    assert routing.observed_p95 is None
