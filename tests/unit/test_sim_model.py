from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from schemas.events import StageEvent
from streams.sim.model import (
    CACHEABLE_MIN_TOKENS,
    RequestProfile,
    simulate_request,
    speculative_multiplier,
    stage_log_correlation,
)
from streams.sim.scenarios import BEFORE, ROUTING_SPECULATIVE

T0 = 1_767_225_600_000.0
PARENTS = ("retrieval", "prompt_assemble", "llm_ttft")


def _requests(profile: RequestProfile, n: int, seed: int = 1) -> list[list[dict[str, Any]]]:
    rng = random.Random(seed)
    return [simulate_request(rng, profile, T0 + i * 10.0, f"r-{i}") for i in range(n)]


def _sums(events: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for e in events:
        if "duration_ms" in e:
            out[e["stage"]] = out.get(e["stage"], 0.0) + e["duration_ms"]
        else:
            out[e["stage"]] = e["ts_ms"]
    return out


@pytest.mark.parametrize(
    "profile", [BEFORE, ROUTING_SPECULATIVE, replace(BEFORE, tenant_id="知识库", rollout="canary")]
)
def test_every_event_validates_as_stage_event(profile: RequestProfile) -> None:
    for events in _requests(profile, 400):
        ids = set()
        for event in events:
            parsed = StageEvent.model_validate(event, strict=True)
            assert parsed.model_dump(exclude_unset=True) == event
            assert event["event_id"] not in ids
            ids.add(event["event_id"])


@pytest.mark.parametrize("profile", [BEFORE, ROUTING_SPECULATIVE])
def test_ttft_contains_every_span_and_other_ms_is_small_and_non_negative(profile: RequestProfile) -> None:
    for events in _requests(profile, 3_000):
        by_stage: dict[str, list[dict[str, Any]]] = {}
        for e in events:
            by_stage.setdefault(e["stage"], []).append(e)
        start = by_stage["request_start"][0]["ts_ms"]
        first = by_stage["first_token"][0]["ts_ms"]
        ttft = first - start
        spans = [e for e in events if "duration_ms" in e]
        assert all(start <= e["ts_ms"] and e["ts_ms"] + e["duration_ms"] <= first for e in spans)
        parents = sum(e["duration_ms"] for e in spans if e["stage"] in PARENTS)
        other = ttft - parents
        assert 0.0 <= other < 150.0
        retrieval = by_stage["retrieval"][0]
        r_end = retrieval["ts_ms"] + retrieval["duration_ms"]
        for sub in ("vector_recall", "bm25_recall", "rerank"):
            for e in by_stage.get(sub, []):
                assert retrieval["ts_ms"] <= e["ts_ms"] and e["ts_ms"] + e["duration_ms"] <= r_end
        assemble = by_stage["prompt_assemble"][0]
        assert assemble["ts_ms"] >= r_end
        assert by_stage["llm_ttft"][0]["ts_ms"] >= assemble["ts_ms"] + assemble["duration_ms"]


def test_stage_log_correlation_matches_the_stated_formula() -> None:
    # Mixtures that add their own variance off, so only the shared factor links the stages.
    profile = replace(BEFORE, prompt_tokens_sigma=0.0, prompt_cache_max_rate=0.0, fallback_rates=(0.0, 0.0))
    values = [_sums(events) for events in _requests(profile, 8_000, seed=7)]
    assemble = np.log([v["prompt_assemble"] for v in values])
    llm = np.log([v["llm_ttft"] for v in values])
    measured = float(np.corrcoef(assemble, llm)[0, 1])
    expected = stage_log_correlation(profile.shared_sigma, profile.assemble_sigma, profile.llm_sigma)
    assert expected == pytest.approx(0.93, abs=0.01)
    assert measured == pytest.approx(expected, abs=0.02)


def test_whole_stage_correlations_are_as_documented_in_the_before_world() -> None:
    values = [_sums(events) for events in _requests(BEFORE, 8_000, seed=3)]
    logs = {s: np.log([v[s] for v in values]) for s in PARENTS}
    retrieval_llm = float(np.corrcoef(logs["retrieval"], logs["llm_ttft"])[0, 1])
    assemble_llm = float(np.corrcoef(logs["prompt_assemble"], logs["llm_ttft"])[0, 1])
    assert retrieval_llm == pytest.approx(0.55, abs=0.07)
    assert assemble_llm == pytest.approx(0.9, abs=0.05)


def test_speculative_decoding_is_slower_than_none_below_sixty_percent_acceptance() -> None:
    assert speculative_multiplier(0.5) > 1.0
    assert speculative_multiplier(0.6) == pytest.approx(1.0)
    assert speculative_multiplier(0.8) < 1.0
    assert speculative_multiplier(0.95) < speculative_multiplier(0.8)


def test_prompt_cache_hits_depend_on_prompt_length() -> None:
    profile = replace(ROUTING_SPECULATIVE, prompt_tokens_sigma=0.8)
    rows = []
    for events in _requests(profile, 6_000):
        attrs = next(e["attrs"] for e in events if e["stage"] == "llm_ttft")
        rows.append((attrs["prompt_tokens"], attrs["prompt_cache_hit"], attrs["cached_tokens"]))
    short = [hit for tokens, hit, _ in rows if tokens < CACHEABLE_MIN_TOKENS]
    medium = [hit for tokens, hit, _ in rows if CACHEABLE_MIN_TOKENS <= tokens < 2_500]
    long = [hit for tokens, hit, _ in rows if tokens >= 3_072]
    assert short and not any(short)
    assert np.mean(long) > np.mean(medium) + 0.15
    assert all((cached > 0) == hit and cached < tokens for tokens, hit, cached in rows)


def test_prompt_cache_hits_lower_assembly_and_llm() -> None:
    profile = replace(
        ROUTING_SPECULATIVE,
        fast_route_share=0.0,
        prompt_tokens_sigma=0.0,
        prompt_tokens_median=3_000,
        prompt_cache_max_rate=0.5,
    )
    hit: dict[str, list[float]] = {"prompt_assemble": [], "llm_ttft": []}
    miss: dict[str, list[float]] = {"prompt_assemble": [], "llm_ttft": []}
    for events in _requests(profile, 4_000):
        values = _sums(events)
        cache_hit = next(e["attrs"]["prompt_cache_hit"] for e in events if e["stage"] == "llm_ttft")
        for stage in hit:
            (hit if cache_hit else miss)[stage].append(values[stage])
    for stage in hit:
        assert np.median(hit[stage]) < 0.85 * np.median(miss[stage])


def test_fast_route_is_faster_and_speculative_attrs_are_set() -> None:
    llm: dict[str, list[float]] = {"fast": [], "main": []}
    accept = []
    for events in _requests(ROUTING_SPECULATIVE, 4_000):
        llm[events[0]["route"]].append(_sums(events)["llm_ttft"])
        accept.append(next(e["attrs"]["draft_accept_rate"] for e in events if e["stage"] == "llm_ttft"))
    assert 0.5 < len(llm["fast"]) / 4_000 < 0.66
    assert np.median(llm["fast"]) < 0.6 * np.median(llm["main"])
    assert np.mean(accept) == pytest.approx(ROUTING_SPECULATIVE.draft_accept_mean, abs=0.02)
    assert all(0.0 <= a <= 1.0 for a in accept)


def test_recall_modes_overlap_only_when_parallel() -> None:
    for mode in ("parallel", "serial"):
        profile = replace(BEFORE, recall_mode=mode, retrieval_cache_hit_rate=0.0)
        for events in _requests(profile, 300):
            v = next(e for e in events if e["stage"] == "vector_recall")
            b = next(e for e in events if e["stage"] == "bm25_recall")
            overlap = v["ts_ms"] < b["ts_ms"] + b["duration_ms"] and b["ts_ms"] < v["ts_ms"] + v["duration_ms"]
            assert overlap == (mode == "parallel")


def test_fallback_levels_retry_the_llm_with_distinct_event_ids() -> None:
    profile = replace(BEFORE, fallback_rates=(0.3, 0.2))
    levels = {0: 0, 1: 0, 2: 0}
    for events in _requests(profile, 2_000):
        level = events[0]["fallback_level"]
        levels[level] += 1
        attempts = [e for e in events if e["stage"] == "llm_ttft"]
        assert len(attempts) == (2 if level else 1)
        assert len({e["event_id"] for e in attempts}) == len(attempts)
        if level:
            assert attempts[1]["ts_ms"] >= attempts[0]["ts_ms"] + attempts[0]["duration_ms"]
        has_rerank = any(e["stage"] == "rerank" for e in events)
        has_recall = any(e["stage"] == "vector_recall" for e in events)
        assert has_rerank == (has_recall and level < 2)
    assert all(count > 100 for count in levels.values())


def test_same_rng_state_gives_the_same_request() -> None:
    assert _requests(ROUTING_SPECULATIVE, 50, seed=11) == _requests(ROUTING_SPECULATIVE, 50, seed=11)
    assert _requests(ROUTING_SPECULATIVE, 50, seed=11) != _requests(ROUTING_SPECULATIVE, 50, seed=12)
