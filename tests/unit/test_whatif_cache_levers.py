"""--cache-hits and --cached-share: the prompt-cache levers beyond --all-cache-hits (pure)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from streams.core.whatif import RequestColumns, WhatIfRefused, replay
from streams.core.whatif_levers import AllCacheHits, CachedShare, LeverError, lever_json, parse_cache_hits


def rec(llm: float, tokens: int, cached: int, hit: bool) -> dict[str, Any]:
    stages = {"retrieval_ms": 200.0, "prompt_assemble_ms": 50.0, "llm_ttft_ms": llm}
    return {
        "status": "complete",
        "first_token_at": 1.0,
        "ttft_ms": 270.0 + llm,
        "recall_mode": "single",
        "vector_recall_ms": 150.0,
        "prompt_tokens": tokens,
        "cached_tokens": cached,
        "prompt_cache_hit": hit,
        "route": "main",
        **stages,
    }


def prefill(tokens: int, cached: int) -> float:
    """The world's exact line: 200 ms + 0.1 ms per uncached token."""
    return 200.0 + 0.1 * (tokens - cached)


def world() -> list[dict[str, Any]]:
    out = []
    for i in range(40):
        tokens = 2_000 + 100 * i
        hit = i % 4 == 0
        cached = int(tokens * 0.4) if hit else 0
        out.append(rec(prefill(tokens, cached), tokens, cached, hit))
    return out


def test_cached_share_rescales_the_hits_along_the_fitted_line() -> None:
    recs = world()
    result = replay(RequestColumns.from_records(recs), [CachedShare(0.75)])
    report = result.levers[0]
    assert report.detail["base_ms"] == pytest.approx(200.0) and report.detail["ms_per_1k_uncached"] == pytest.approx(
        100.0
    )
    assert report.changed == 10
    llm = result.after["llm_ttft"]
    for i, r in enumerate(recs):
        expected = (
            prefill(r["prompt_tokens"], int(r["prompt_tokens"] * 0.75)) if r["prompt_cache_hit"] else r["llm_ttft_ms"]
        )
        assert llm[i] == pytest.approx(expected)


def test_a_cache_hit_lever_before_cached_share_needs_no_donors_and_is_exact_on_a_line() -> None:
    recs = world()
    result = replay(RequestColumns.from_records(recs), [AllCacheHits(), CachedShare(0.75)], min_donors=1_000)
    assert result.levers[0].detail["llm_ttft"] == "from --cached-share"
    llm = result.after["llm_ttft"]
    for i, r in enumerate(recs):
        assert llm[i] == pytest.approx(prefill(r["prompt_tokens"], int(r["prompt_tokens"] * 0.75)))


def test_cache_hits_turns_misses_into_hits_until_the_share() -> None:
    recs = world()  # 10 hits of 40 cacheable prompts
    result = replay(RequestColumns.from_records(recs), [AllCacheHits(0.5), CachedShare(0.75)], min_donors=1)
    assert result.levers[0].changed == 10  # 20 of 40 hit after it
    assert result.levers[1].changed == 20
    again = replay(RequestColumns.from_records(list(reversed(recs))), [AllCacheHits(0.5), CachedShare(0.75)])
    assert sorted(again.after["llm_ttft"].tolist()) == pytest.approx(sorted(result.after["llm_ttft"].tolist()))


def test_cached_share_refuses_without_token_counts_or_a_prefill_cost() -> None:
    flat = [rec(500.0, 2_000 + 100 * i, 0, i % 2 == 0) for i in range(20)]
    with pytest.raises(WhatIfRefused, match="does not grow with uncached prompt tokens"):
        replay(RequestColumns.from_records(flat), [CachedShare(0.75)])
    unknown = [{**r, "cached_tokens": None} for r in world()]
    with pytest.raises(WhatIfRefused, match="have prompt and cached token counts"):
        replay(RequestColumns.from_records(unknown), [CachedShare(0.75)])


def test_the_levers_parse_print_and_check_their_share() -> None:
    assert parse_cache_hits("0.84").text == "--cache-hits 0.84"
    assert AllCacheHits().text == "--all-cache-hits"
    assert lever_json(CachedShare(0.75)) == {
        "lever": "cached_share",
        "text": "--cached-share 0.75",
        "stage": "llm_ttft",
        "share": 0.75,
    }
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(LeverError):
            CachedShare(bad)
        with pytest.raises(LeverError):
            AllCacheHits(bad)
    assert np.isfinite(parse_cache_hits("1").share)
