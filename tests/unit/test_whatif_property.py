"""Properties of the what-if replay over random requests (hypothesis), and of its percentile and bootstrap."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from schemas.vocabulary import SUB_STAGES
from streams.core.whatif import RECALL_CODES, Replay, RequestColumns, WhatIfRefused, predict, replay, serial_recall
from streams.core.whatif_levers import LEVER_STAGES, Cap, Cut, Lever, ParallelRecall, Scale
from streams.core.whatif_stats import bootstrap_interval, lower_quantiles

PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ms = st.floats(min_value=0.0, max_value=5_000.0, allow_nan=False)
maybe_ms = st.none() | ms


@st.composite
def requests(draw: st.DrawFn, *, gap: st.SearchStrategy[float] | None = None) -> dict[str, Any]:
    """A complete record whose retrieval holds its critical path (plus some off-path time)."""
    vector, bm25, rerank = draw(maybe_ms), draw(maybe_ms), draw(maybe_ms)
    both = vector is not None and bm25 is not None
    mode = draw(st.sampled_from(["serial", "parallel", None])) if both else "single"
    legs = [x for x in (vector, bm25) if x is not None]
    recall = (sum(legs) if mode == "serial" else max(legs)) if legs else 0.0
    retrieval = recall + (rerank or 0.0) + draw(st.floats(0.0, 200.0))
    assemble, llm = draw(ms), draw(ms)
    other = draw(gap if gap is not None else st.floats(-300.0, 300.0))
    return {
        "status": "complete",
        "first_token_at": 1.0,
        "ttft_ms": retrieval + assemble + llm + other,
        "retrieval_ms": retrieval,
        "vector_recall_ms": vector,
        "bm25_recall_ms": bm25,
        "rerank_ms": rerank,
        "prompt_assemble_ms": assemble,
        "llm_ttft_ms": llm,
        "recall_mode": mode,
        "prompt_tokens": draw(st.none() | st.integers(0, 40_000)),
        "prompt_cache_hit": draw(st.none() | st.booleans()),
        "route": draw(st.sampled_from(["main", "fast", None])),
    }


batches = st.lists(requests(), min_size=1, max_size=60)
stages = st.sampled_from(LEVER_STAGES)
speedups: st.SearchStrategy[Lever] = st.one_of(
    st.builds(Scale, stages, st.floats(0.0, 1.0)),
    st.builds(Cut, stages, ms),
    st.builds(lambda s, v: Cap(s, ms=v), stages, ms),
    st.builds(lambda s, p: Cap(s, percentile=p), stages, st.floats(1.0, 100.0)),
    st.just(ParallelRecall()),
)


def _replay_or_reject(columns: RequestColumns, levers: list[Lever]) -> Replay:
    try:
        return replay(columns, levers)
    except WhatIfRefused:  # a pNN cap of a stage no request has: refused, not replayed
        reject()


def _quantiles(values: np.ndarray) -> list[float]:
    return [float(np.quantile(values, q, method="lower")) for q in (0.5, 0.95, 0.99)]


@PROPERTY
@given(batches, st.lists(stages, min_size=1, max_size=4))
def test_scale_one_reproduces_the_observed_percentiles_exactly(records: list[dict[str, Any]], names: list[str]) -> None:
    columns = RequestColumns.from_records(records)
    result = predict(columns, [Scale(stage, 1.0) for stage in names], resamples=20)
    assert result.predicted == result.observed
    assert list(result.observed.values()) == _quantiles(columns.ttft)
    assert np.array_equal(replay(columns, [Scale(s, 1.0) for s in names]).predicted, columns.ttft)


@PROPERTY
@given(batches, st.lists(speedups, min_size=1, max_size=5))
def test_a_cut_never_raises_a_request_ttft(records: list[dict[str, Any]], levers: list[Lever]) -> None:
    columns = RequestColumns.from_records(records)
    result = _replay_or_reject(columns, levers)
    assert np.all(result.predicted <= columns.ttft)
    assert np.all(result.predicted >= np.minimum(columns.ttft, 0.0))
    for stage in result.after:
        assert np.all(np.nan_to_num(result.after[stage]) <= np.nan_to_num(result.before[stage]))


@PROPERTY
@given(st.lists(requests(gap=st.floats(0.0, 300.0)), min_size=1, max_size=60), st.sampled_from(SUB_STAGES), ms)
def test_sub_stage_cuts_roll_up_into_retrieval_and_ttft(records: list[dict[str, Any]], stage: str, cut: float) -> None:
    columns = RequestColumns.from_records(records)
    result = replay(columns, [Cut(stage, cut)])
    serial = serial_recall(columns)
    for i, r in enumerate(records):
        vector, bm25, rerank = r["vector_recall_ms"], r["bm25_recall_ms"], r["rerank_ms"]
        after = {"vector_recall_ms": vector, "bm25_recall_ms": bm25, "rerank_ms": rerank}
        if after[f"{stage}_ms"] is not None:
            after[f"{stage}_ms"] = max(after[f"{stage}_ms"] - cut, 0.0)

        cut_path = _path(after["vector_recall_ms"], after["bm25_recall_ms"], after["rerank_ms"], serial[i])
        shorter = _path(vector, bm25, rerank, serial[i]) - cut_path
        assert math.isclose(result.after["retrieval"][i], r["retrieval_ms"] - shorter, abs_tol=1e-6)
        assert math.isclose(result.predicted[i], r["ttft_ms"] - shorter, abs_tol=1e-6)
        if stage == "rerank" or serial[i] or (vector is None) != (bm25 is None):
            assert math.isclose(shorter, min(cut, after_or(r[f"{stage}_ms"])), abs_tol=1e-6)


def _path(vector: float | None, bm25: float | None, rerank: float | None, serial: bool) -> float:
    legs = [x for x in (vector, bm25) if x is not None]
    recall = (sum(legs) if serial else max(legs)) if legs else 0.0
    return recall + (rerank or 0.0)


def after_or(value: float | None) -> float:
    return 0.0 if value is None else value


def _as_replayed(columns: RequestColumns, result: Replay) -> RequestColumns:
    """The requests as the levers left them: their predicted TTFT, their stages, their recall mode."""
    both = ~np.isnan(result.after["vector_recall"]) & ~np.isnan(result.after["bm25_recall"])
    mode = np.where(result.serial, RECALL_CODES["serial"], np.where(both, RECALL_CODES["parallel"], 0))
    return replace(columns, ttft=result.predicted, stages=result.after, recall_mode=mode.astype(np.uint8))


@PROPERTY
@given(
    st.lists(requests(gap=st.floats(0.0, 300.0)), min_size=1, max_size=60),
    st.lists(st.one_of(speedups, st.builds(Scale, stages, st.floats(1.0, 3.0))), min_size=2, max_size=4),
)
def test_levers_apply_in_order_each_to_what_the_ones_before_left(
    records: list[dict[str, Any]], levers: list[Lever]
) -> None:
    """Levers together predict what the last lever predicts over the requests as the others left them
    (with a non-negative gap, so the TTFT floor never binds)."""
    columns = RequestColumns.from_records(records)
    together = _replay_or_reject(columns, levers)
    first = replay(columns, levers[:-1])
    then = replay(_as_replayed(columns, first), levers[-1:])
    assert np.allclose(together.predicted, then.predicted, rtol=1e-9, atol=1e-6)
    for stage in LEVER_STAGES:
        assert np.allclose(together.after[stage], then.after[stage], rtol=1e-9, atol=1e-6, equal_nan=True)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=300),
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=5),
)
def test_lower_quantiles_are_numpys_lower_method(values: list[float], qs: list[float]) -> None:
    array = np.array(values)
    assert lower_quantiles(array, qs) == [float(np.quantile(array, q, method="lower")) for q in qs]


def _rank_cdf(n: int, k: int, j: int) -> float:
    """P(the k-th smallest (0-based) of n uniform draws from range(n) is <= j): at least k+1 draws <= j."""
    p = (j + 1) / n
    return 1.0 - sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def test_the_bootstrap_shortcut_is_resampling_the_requests() -> None:
    """The beta draw gives the resampled P95's exact distribution: its empirical CDF over a few thousand
    resamples lies within sampling error of the exact one, and so does brute-force resampling's."""
    n, q, draws = 60, 0.95, 4_000
    values = np.arange(n, dtype=np.float64)  # value = sorted index
    k = math.floor(q * (n - 1))
    rng = np.random.default_rng(11)
    shortcut = np.sort(values[np.minimum((rng.beta(k + 1, n - k, size=draws) * n).astype(int), n - 1)])
    brute = np.sort([np.sort(values[rng.integers(0, n, n)])[k] for _ in range(draws)])
    exact = np.array([_rank_cdf(n, k, j) for j in range(n)])
    for sample in (shortcut, brute):
        empirical = np.searchsorted(sample, values, side="right") / draws
        assert np.max(np.abs(empirical - exact)) < 1.63 / math.sqrt(draws)  # KS at the 1 % level
    lo, hi = bootstrap_interval(values, q, 200, np.random.default_rng(2))
    assert lo <= k <= hi
