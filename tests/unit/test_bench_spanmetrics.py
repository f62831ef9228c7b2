"""The pure side of the spanmetrics comparison (bench/spanmetrics.py): the /metrics parser, Prometheus'
histogram_quantile, the issue 15 target and the phase's flags."""

from __future__ import annotations

import math

import pytest

from bench.__main__ import parse_args
from bench.results import evaluate_targets
from bench.spanmetrics import histogram_quantile, parse_histograms

PAGE = """\
# TYPE span_metrics_tuned_duration_milliseconds histogram
span_metrics_tuned_duration_milliseconds_bucket{service_name="a",span_name="retrieve",le="100"} 0
span_metrics_tuned_duration_milliseconds_bucket{service_name="a",span_name="retrieve",le="200"} 10
span_metrics_tuned_duration_milliseconds_bucket{service_name="a",span_name="retrieve",le="+Inf"} 20
span_metrics_tuned_duration_milliseconds_bucket{service_name="b",span_name="retrieve",le="100"} 0
span_metrics_tuned_duration_milliseconds_bucket{service_name="b",span_name="retrieve",le="200"} 0
span_metrics_tuned_duration_milliseconds_bucket{service_name="b",span_name="retrieve",le="+Inf"} 0
span_metrics_default_duration_milliseconds_bucket{span_name="chat",le="1000"} 4
span_metrics_default_duration_milliseconds_bucket{span_name="chat",le="+Inf"} 4
span_metrics_default_duration_milliseconds_count{span_name="chat"} 4
"""


def test_parse_histograms_sums_series_by_span_name() -> None:
    h = parse_histograms(PAGE)
    assert h[("tuned", "retrieve")] == [(100.0, 0.0), (200.0, 10.0), (math.inf, 20.0)]
    assert h[("default", "chat")] == [(1000.0, 4.0), (math.inf, 4.0)]
    assert len(h) == 2


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    buckets = [(100.0, 10.0), (200.0, 60.0), (400.0, 100.0), (math.inf, 100.0)]
    # rank 95 lies in (200, 400]: 200 + 200 * (95 - 60) / 40
    assert histogram_quantile(0.95, buckets) == pytest.approx(375.0)
    # the lowest bucket starts at 0
    assert histogram_quantile(0.05, buckets) == pytest.approx(50.0)
    # a rank in +Inf gives the highest finite bound
    assert histogram_quantile(0.95, [(100.0, 1.0), (math.inf, 100.0)]) == 100.0
    assert histogram_quantile(0.95, [(math.inf, 0.0)]) is None
    assert histogram_quantile(0.95, []) is None


def test_issue15_target() -> None:
    name = "issue 15: ours P95 within 1 % of exact (retrieval, llm_ttft)"
    ok = {
        t.name: t for t in evaluate_targets({"otel_retrieval_p95_ours_err": 0.004, "otel_llm_ttft_p95_ours_err": 0.009})
    }
    assert ok[name].status == "holds" and ok[name].measured == "0.90 %"
    bad = {
        t.name: t for t in evaluate_targets({"otel_retrieval_p95_ours_err": 0.02, "otel_llm_ttft_p95_ours_err": 0.0})
    }
    assert bad[name].status == "fails"
    assert {t.name: t for t in evaluate_targets({})}[name].status == "not measured"


def test_only_runs_one_phase_with_token_traffic() -> None:
    args = parse_args(["--only", "spanmetrics", "--otel-traces", "500"])
    assert args.skip == {
        "simspeed",
        "raw",
        "pipeline",
        "lag",
        "naive",
        "memory",
        "closeburst",
        "scaleout",
        "quix",
        "otlpbridge",
        "whatif",
        "isolation",
        "isolation_broker",
    }
    assert args.events <= 1_000 and args.otel_traces == 500
    assert parse_args([]).otel_traces == 3_000
