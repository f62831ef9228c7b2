from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from streams.core.stages import PROMPT_BUCKETS, prompt_bucket
from streams.core.whatif import (
    RequestColumns,
    WhatIfRefused,
    predict,
    prompt_bucket_codes,
    replay,
    serial_recall,
)
from streams.core.whatif_levers import (
    AllCacheHits,
    Cap,
    Cut,
    LeverError,
    ParallelRecall,
    RouteAll,
    RouteShare,
    Scale,
    parse_cap,
    parse_cut,
    parse_route,
    parse_route_share,
    parse_scale,
)
from streams.core.whatif_rank import rank_stages
from streams.core.whatif_stats import lower_quantiles


def record(**overrides: Any) -> dict[str, Any]:
    """A complete record: serial recall 100 + 60, rerank 40, retrieval 210, assembly 50, LLM 700, gap 20:
    TTFT 980."""
    base: dict[str, Any] = {
        "status": "complete",
        "first_token_at": 1.0,
        "vector_recall_ms": 100.0,
        "bm25_recall_ms": 60.0,
        "rerank_ms": 40.0,
        "retrieval_ms": 210.0,
        "prompt_assemble_ms": 50.0,
        "llm_ttft_ms": 700.0,
        "recall_mode": "serial",
        "prompt_tokens": 2_000,
        "prompt_cache_hit": False,
        "route": "main",
    }
    base.update(overrides)
    if "ttft_ms" not in overrides:
        parents = ("retrieval_ms", "prompt_assemble_ms", "llm_ttft_ms")
        base["ttft_ms"] = sum(base[p] or 0.0 for p in parents) + base.pop("other_ms", 20.0)
    return base


def columns(*records: dict[str, Any]) -> RequestColumns:
    return RequestColumns.from_records(records)


def one(levers: list[Any], *records: dict[str, Any], **kw: Any) -> np.ndarray:
    return replay(columns(*(records or (record(),))), levers, **kw).predicted


# --- parsing -------------------------------------------------------------------------------------------


def test_parse_levers() -> None:
    assert parse_scale("retrieval=0.7") == Scale("retrieval", 0.7)
    assert parse_cut(" rerank = 40 ") == Cut("rerank", 40.0)
    assert parse_cap("llm_ttft=1500") == Cap("llm_ttft", ms=1500.0)
    assert parse_cap("rerank=p50") == Cap("rerank", percentile=50.0)
    assert parse_cap("rerank=P99.9") == Cap("rerank", percentile=99.9)
    assert parse_route("fast") == RouteAll("fast")
    assert [lever.text for lever in (Scale("retrieval", 0.7), Cap("rerank", percentile=50.0))] == [
        "--scale retrieval=0.7",
        "--cap rerank=p50",
    ]


@pytest.mark.parametrize(
    ("parse", "text", "says"),
    [
        (parse_scale, "retrieval", "STAGE=VALUE"),
        (parse_scale, "ttft=0.5", "unknown stage"),
        (parse_scale, "other=0.5", "unknown stage"),
        (parse_scale, "retrieval=-0.5", "not a number"),
        (parse_scale, "retrieval=fast", "not a number"),
        (parse_scale, "retrieval=nan", "not a number"),
        (parse_cut, "rerank=", "STAGE=VALUE"),
        (parse_cap, "rerank=p0", "(0, 100]"),
        (parse_cap, "rerank=p101", "(0, 100]"),
        (parse_route, " ", "route name"),
    ],
)
def test_bad_levers_say_why(parse: Any, text: str, says: str) -> None:
    with pytest.raises(LeverError) as info:
        parse(text)
    assert says in str(info.value)


def test_levers_built_in_code_are_checked_too() -> None:
    with pytest.raises(LeverError):
        Scale("retrieval", -1.0)
    with pytest.raises(LeverError):
        Cut("nope", 1.0)
    with pytest.raises(LeverError):
        Cap("rerank")
    with pytest.raises(LeverError):
        Cap("rerank", ms=1.0, percentile=50.0)


# --- columns and selection -------------------------------------------------------------------------------


def test_only_complete_requests_with_a_ttft_are_replayed() -> None:
    cols = columns(
        record(),
        record(status="missing_stage"),
        record(status="timed_out", ttft_ms=None, first_token_at=None),
        record(ttft_ms=None),
        record(route=None, prompt_cache_hit=None, prompt_tokens=None, rerank_ms=None),
    )
    assert cols.n == 2
    assert cols.route_names == ("main",)
    assert cols.route.tolist() == [0, -1]
    assert cols.prompt_cache_hit.tolist() == [0, -1]
    assert cols.prompt_tokens.tolist() == [2_000, -1]
    assert math.isnan(cols.stages["rerank"][1])


def test_prompt_bucket_codes_match_the_stage_strata() -> None:
    tokens = [0, 1, 1_023, 1_024, 4_095, 4_096, 16_383, 16_384, 100_000, -1]
    codes = prompt_bucket_codes(np.array(tokens, dtype=np.int64))
    expected = [prompt_bucket({"prompt_tokens": None if t < 0 else t}) for t in tokens]
    assert [PROMPT_BUCKETS[c] for c in codes] == expected


def test_serial_recall_comes_from_the_record_else_from_the_durations() -> None:
    cols = columns(
        record(recall_mode="serial"),
        record(recall_mode="parallel"),
        record(recall_mode="single", bm25_recall_ms=None),
        # no recall mode (recalls merged from amendments): 100 + 60 + 40 fit in 210 -> serial
        record(recall_mode=None),
        # no recall mode, and 100 + 60 + 40 do not fit in 150 -> they overlapped
        record(recall_mode=None, retrieval_ms=150.0),
    )
    assert serial_recall(cols).tolist() == [True, False, False, True, False]


# --- stage levers ------------------------------------------------------------------------------------


def test_scale_a_parent_and_its_sub_stages() -> None:
    cols = columns(record())
    result = replay(cols, [Scale("retrieval", 0.5)])
    assert result.after["retrieval"].tolist() == [105.0]
    assert result.predicted.tolist() == [980.0 - 105.0]
    # the sub-stages were halved too: a later rerank cut shortens retrieval by at most the halved rerank
    both = replay(cols, [Scale("retrieval", 0.5), Cut("rerank", 1_000.0)])
    assert both.after["retrieval"].tolist() == [105.0 - 20.0]


def test_scale_up_makes_a_request_slower() -> None:
    assert one([Scale("llm_ttft", 1.5)]).tolist() == [980.0 + 350.0]


def test_cut_is_floored_at_zero() -> None:
    result = replay(columns(record()), [Cut("prompt_assemble", 80.0)])
    assert result.after["prompt_assemble"].tolist() == [0.0]
    assert result.predicted.tolist() == [980.0 - 50.0]


def test_cap_in_ms_and_at_the_stage_percentile() -> None:
    recs = [record(llm_ttft_ms=float(v)) for v in (100, 200, 300, 400, 1_000)]
    result = replay(columns(*recs), [Cap("llm_ttft", ms=250.0)])
    assert result.after["llm_ttft"].tolist() == [100.0, 200.0, 250.0, 250.0, 250.0]
    assert result.levers[0].changed == 3
    at_p50 = replay(columns(*recs), [Cap("llm_ttft", percentile=50.0)])
    assert at_p50.levers[0].detail["cap_ms"] == float(np.quantile([100, 200, 300, 400, 1_000], 0.5, method="lower"))
    assert at_p50.after["llm_ttft"].tolist() == [100.0, 200.0, 300.0, 300.0, 300.0]


def test_sub_stage_cuts_roll_up_through_the_critical_path() -> None:
    serial = record()
    parallel = record(recall_mode="parallel", retrieval_ms=150.0)
    # rerank: the same amount off retrieval and TTFT, whatever the recall mode
    assert one([Cut("rerank", 30.0)], serial, parallel).tolist() == [950.0, 920.0 - 30.0]
    # serial recall: a leg's cut is retrieval's; parallel: only what the longer leg loses past the shorter
    assert one([Cut("vector_recall", 50.0)], serial, parallel).tolist() == [930.0, 920.0 - 40.0]
    assert one([Cut("bm25_recall", 50.0)], serial, parallel).tolist() == [930.0, 920.0]


def test_parallel_recall_shortens_serial_requests_by_their_shorter_leg() -> None:
    recs = [record(), record(recall_mode="parallel", retrieval_ms=150.0), record(bm25_recall_ms=None)]
    result = replay(columns(*recs), [ParallelRecall()])
    assert result.levers[0].changed == 1
    assert result.after["retrieval"].tolist() == [150.0, 150.0, 210.0]
    assert result.predicted.tolist() == [920.0, 920.0, 980.0]


def test_levers_apply_in_order() -> None:
    assert one([Cut("llm_ttft", 100.0), Scale("llm_ttft", 0.5)]).tolist() == [980.0 - 700.0 + 300.0]
    assert one([Scale("llm_ttft", 0.5), Cut("llm_ttft", 100.0)]).tolist() == [980.0 - 700.0 + 250.0]
    # after --parallel-recall the legs overlap: cutting the shorter one gains nothing more
    assert one([ParallelRecall(), Cut("bm25_recall", 60.0)]).tolist() == [920.0]
    assert one([Cut("bm25_recall", 60.0), ParallelRecall()]).tolist() == [920.0]
    assert one([ParallelRecall(), Cut("vector_recall", 30.0)]).tolist() == [890.0]
    assert one([Cut("vector_recall", 30.0), ParallelRecall()]).tolist() == [890.0]
    # cut first, the legs end 20 and 60 ms long: in parallel only the 20 ms leg is hidden
    assert one([Cut("vector_recall", 80.0), ParallelRecall()]).tolist() == [980.0 - 80.0 - 20.0]


def test_other_is_kept_and_the_floor_is_the_longest_remaining_stage() -> None:
    # spans overlapped by 100 ms (other = -100, TTFT 860): cutting retrieval away (-210 ms) cannot take
    # TTFT below llm_ttft
    overlapping = record(other_ms=-100.0)
    assert one([Cut("retrieval", 1_000.0)], overlapping).tolist() == [700.0]
    assert one([Scale("retrieval", 0.0), Scale("llm_ttft", 0.0), Scale("prompt_assemble", 0.0)]).tolist() == [20.0]
    everything = [Scale("retrieval", 0.0), Scale("llm_ttft", 0.0), Scale("prompt_assemble", 0.0)]
    assert one(everything, overlapping).tolist() == [0.0]


def test_a_complete_request_without_a_parent_keeps_working() -> None:
    no_retrieval = record(
        retrieval_ms=None, vector_recall_ms=None, bm25_recall_ms=None, rerank_ms=None, recall_mode="none"
    )
    assert one([Scale("retrieval", 0.5), Cut("rerank", 10.0)], no_retrieval).tolist() == [770.0]
    assert one([Scale("llm_ttft", 0.5)], no_retrieval).tolist() == [420.0]


# --- donor levers ------------------------------------------------------------------------------------


def _cache_world(hits_per_bucket: int = 12) -> list[dict[str, Any]]:
    recs = []
    for i in range(hits_per_bucket):
        recs.append(record(prompt_cache_hit=True, llm_ttft_ms=300.0 + i, prompt_tokens=2_000))
        recs.append(record(prompt_cache_hit=True, llm_ttft_ms=500.0 + i, prompt_tokens=8_000))
    recs += [record(prompt_cache_hit=False, llm_ttft_ms=900.0, prompt_tokens=2_000) for _ in range(20)]
    recs += [record(prompt_cache_hit=False, llm_ttft_ms=1_500.0, prompt_tokens=8_000) for _ in range(5)]
    recs += [record(prompt_cache_hit=False, llm_ttft_ms=700.0, prompt_tokens=500) for _ in range(3)]
    recs += [record(prompt_cache_hit=None, llm_ttft_ms=2_000.0, prompt_tokens=2_000) for _ in range(2)]
    return recs


def test_all_cache_hits_draws_from_hits_of_the_same_prompt_size() -> None:
    recs = _cache_world()
    result = replay(columns(*recs), [AllCacheHits()], rng=np.random.default_rng(1))
    llm = result.after["llm_ttft"]
    report = result.levers[0]
    assert report.changed == 25
    assert report.detail["not_cacheable"] == 3
    assert report.detail["buckets"] == {
        "1k-4k": {"recipients": 20, "donors": 12},
        "4k-16k": {"recipients": 5, "donors": 12},
    }
    small, big = llm[24:44], llm[44:49]
    assert set(small.tolist()) <= {300.0 + i for i in range(12)}
    assert set(big.tolist()) <= {500.0 + i for i in range(12)}
    assert llm[49:52].tolist() == [700.0] * 3  # below the cacheable minimum: kept
    assert llm[52:].tolist() == [2_000.0] * 2  # cache state unknown: kept
    assert llm[:24].tolist() == [r["llm_ttft_ms"] for r in recs[:24]]  # hits: kept
    again = replay(columns(*recs), [AllCacheHits()], rng=np.random.default_rng(1))
    assert np.array_equal(again.predicted, result.predicted)


def test_all_cache_hits_refuses_a_bucket_with_too_few_donors() -> None:
    with pytest.raises(WhatIfRefused) as info:
        replay(columns(*_cache_world(hits_per_bucket=4)), [AllCacheHits()])
    message = str(info.value)
    assert "--all-cache-hits" in message and "at least 10" in message
    assert "1k-4k: 4 donor(s) for 20 request(s)" in message and "4k-16k: 4 donor(s) for 5 request(s)" in message
    assert replay(columns(*_cache_world(hits_per_bucket=4)), [AllCacheHits()], min_donors=4).levers[0].changed == 25


def test_route_all_draws_from_that_route() -> None:
    recs = [record(route="fast", llm_ttft_ms=200.0 + i) for i in range(10)]
    recs += [record(route="main", llm_ttft_ms=900.0) for _ in range(6)] + [record(route=None, llm_ttft_ms=950.0)]
    result = replay(columns(*recs), [RouteAll("fast")])
    assert result.levers[0].changed == 7 and result.levers[0].detail["donors"] == 10
    assert set(result.after["llm_ttft"][10:].tolist()) <= {200.0 + i for i in range(10)}
    with pytest.raises(WhatIfRefused, match="no replayed request was served on route 'turbo'"):
        replay(columns(*recs), [RouteAll("turbo")])
    with pytest.raises(WhatIfRefused, match="too few donors"):
        replay(columns(*recs), [RouteAll("fast")], min_donors=11)


def test_donor_draws_are_matched_to_the_recipients_by_rank() -> None:
    hits = [record(prompt_cache_hit=True, llm_ttft_ms=100.0 * (i + 1)) for i in range(10)]
    misses = [record(prompt_cache_hit=False, llm_ttft_ms=llm) for llm in (5_000.0, 1_000.0, 3_000.0, 2_000.0, 4_000.0)]
    for seed in range(5):
        llm = replay(columns(*hits, *misses), [AllCacheHits()], rng=np.random.default_rng(seed)).after["llm_ttft"]
        drawn = llm[10:]
        assert set(drawn.tolist()) <= {100.0 * (i + 1) for i in range(10)}
        # The misses' order (1,000 < 2,000 < ... < 5,000 ms) is the order of what they drew.
        by_rank = drawn[np.argsort([m["llm_ttft_ms"] for m in misses])]
        assert by_rank.tolist() == sorted(drawn.tolist())


def test_route_share_moves_a_random_share_onto_the_route() -> None:
    recs = [record(route="fast", llm_ttft_ms=300.0) for _ in range(10)]
    recs += [record(route="main", llm_ttft_ms=1_000.0) for _ in range(90)]
    result = replay(columns(*recs), [RouteShare("fast", 0.5, 0.4)], rng=np.random.default_rng(2))
    llm = result.after["llm_ttft"]
    assert result.levers[0].changed == 40 and result.levers[0].detail == {"already": 10}
    assert llm[:10].tolist() == [300.0] * 10  # on the route already: kept
    assert sorted(set(llm[10:].tolist())) == [400.0, 1_000.0] and np.count_nonzero(llm[10:] == 400.0) == 40
    assert np.array_equal(
        replay(columns(*recs), [RouteShare("fast", 0.5, 0.4)], rng=np.random.default_rng(2)).predicted,
        result.predicted,
    )
    # Already past the share: nothing moves. A route no request takes: the share comes from the others.
    assert replay(columns(*recs), [RouteShare("fast", 0.05, 0.4)]).levers[0].changed == 0
    assert replay(columns(*recs), [RouteShare("turbo", 0.25, 0.5)]).levers[0].changed == 25
    assert RouteShare("fast", 0.58, 0.4).text == "--route-share fast=0.58:0.4"
    assert result.levers[0].to_json() == {
        "lever": "route_share",
        "text": "--route-share fast=0.5:0.4",
        "stage": "llm_ttft",
        "route": "fast",
        "share": 0.5,
        "factor": 0.4,
        "changed": 40,
        "already": 10,
    }


def test_donor_and_share_draws_do_not_depend_on_the_order_rows_are_read_in() -> None:
    rng = np.random.default_rng(9)
    recs = [
        record(
            prompt_cache_hit=bool(i % 4 == 0),
            route="fast" if i % 9 == 0 else "main",
            llm_ttft_ms=float(rng.lognormal(6.5, 0.4)),
            prompt_tokens=int(rng.choice([1_500, 6_000])),
        )
        for i in range(300)
    ]
    shuffled = [recs[i] for i in np.random.default_rng(1).permutation(len(recs))]
    for levers in ([AllCacheHits()], [RouteAll("fast")], [RouteShare("fast", 0.5, 0.4)]):
        first = predict(columns(*recs), levers, resamples=50, seed=2)
        again = predict(columns(*shuffled), levers, resamples=50, seed=2)
        assert (first.predicted, first.p95_ci) == (again.predicted, again.p95_ci), levers


def test_parse_route_share() -> None:
    assert parse_route_share("fast=0.58:0.4") == RouteShare("fast", 0.58, 0.4)
    assert parse_route_share(" fast = 1 : 0 ") == RouteShare("fast", 1.0, 0.0)
    for bad in ("fast=0.5", "=0.5:0.4", "fast=1.5:0.4", "fast=0.5:-1", "fast=0.5:x", "fast"):
        with pytest.raises(LeverError):
            parse_route_share(bad)


# --- summaries -----------------------------------------------------------------------------------------


def _spread(n: int = 400, seed: int = 5) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    recs = []
    for _ in range(n):
        vector, bm25, rerank = rng.lognormal(4.5, 0.4, 3)
        retrieval = vector + bm25 + rerank + 2.0
        recs.append(
            record(
                vector_recall_ms=float(vector),
                bm25_recall_ms=float(bm25),
                rerank_ms=float(rerank),
                retrieval_ms=float(retrieval),
                prompt_assemble_ms=float(rng.lognormal(4.0, 0.3)),
                llm_ttft_ms=float(rng.lognormal(6.8, 0.5)),
                other_ms=float(rng.uniform(0.0, 30.0)),
            )
        )
    return recs


def test_predict_reports_percentiles_interval_and_naive_estimate() -> None:
    recs = _spread()
    cols = columns(*recs)
    result = predict(cols, [Scale("llm_ttft", 0.8)], resamples=200, seed=3)
    ttft = np.array([r["ttft_ms"] for r in recs])
    assert result.requests == 400
    assert result.observed == {
        k: float(np.quantile(ttft, q, method="lower")) for k, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
    }
    lo, hi = result.p95_ci
    assert lo <= result.predicted["p95"] <= hi < result.observed["p95"]
    llm = np.array([r["llm_ttft_ms"] for r in recs])
    change = float(np.quantile(llm, 0.95, method="lower") - np.quantile(llm * 0.8, 0.95, method="lower"))
    assert result.naive_p95 == pytest.approx(result.observed["p95"] - change)
    payload = result.to_json()
    assert set(payload) == {"requests", "observed", "predicted", "naive_p95", "levers"}
    assert set(payload["predicted"]) == {"p50", "p95", "p99", "p95_ci"}
    assert payload["levers"] == [
        {"lever": "scale", "text": "--scale llm_ttft=0.8", "stage": "llm_ttft", "factor": 0.8, "changed": 400}
    ]
    assert predict(cols, [Scale("llm_ttft", 0.8)], resamples=200, seed=3) == result


def test_predict_refuses_an_empty_selection() -> None:
    with pytest.raises(WhatIfRefused, match="no complete requests"):
        predict(columns(), [Scale("llm_ttft", 0.8)])
    with pytest.raises(WhatIfRefused, match="no complete requests"):
        rank_stages(columns())


def test_rank_puts_the_stage_that_moves_ttft_p95_most_first() -> None:
    recs = _spread()
    ranking = rank_stages(columns(*recs), resamples=50)
    assert ranking.rows[0].stage == "llm_ttft"
    gains = [r.faster_gain for r in ranking.rows]
    assert gains == sorted(gains, reverse=True)
    for row in ranking.rows:
        alone = predict(columns(*recs), [Scale(row.stage, 0.8)])
        assert row.faster_p95 == alone.predicted["p95"]
        assert row.cap_ms == lower_quantiles(np.array([r[f"{row.stage}_ms"] for r in recs]), [0.5])[0]
    no_rerank = [dict(r, rerank_ms=None) for r in recs]
    assert "rerank" not in [r.stage for r in rank_stages(columns(*no_rerank), resamples=10).rows]
    assert set(ranking.to_json()) == {"requests", "observed", "rank"}
