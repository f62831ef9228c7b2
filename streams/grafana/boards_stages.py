"""Dashboard 2: Stage drill-down (per-stage percentiles, what if a stage were faster, retrieval levers,
slowest requests)."""

from __future__ import annotations

from streams.grafana.boards_latency import (
    IN_RANGE,
    P50_P95_P99,
    stage_variable,
    tenant_variable,
    version_variable,
)
from streams.grafana.links import TENANT_KEY, VERSION_KEY, key_columns, to_canary, to_request, to_trace
from streams.grafana.model import (
    FORMAT_TABLE,
    FORMAT_TIME_SERIES,
    DashboardSpec,
    PanelSpec,
    PercentileCheck,
)
from streams.grafana.panels_whatif import scale_variable, whatif_panel
from streams.grafana.sql import STAGE, TENANT, VERSION, count_rows, percentiles, stage_order, where
from streams.settings import Settings


def _stage_over_time() -> PanelSpec:
    sql = (
        "SELECT $__timeInterval(window_start) AS time, stage,\n"
        f"       {percentiles(P50_P95_P99)}\n"
        "FROM stage_windows FINAL\n"
        f"{where(IN_RANGE, TENANT, VERSION, STAGE)}\n"
        "GROUP BY time, stage\nHAVING sum(count) > 0\nORDER BY time, stage"
    )
    return PanelSpec(
        title="Stage P50, P95 and P99 over time",
        kind="timeseries",
        sql=sql,
        fmt=FORMAT_TIME_SERIES,
        columns=("time", "stage", "p50", "p95", "p99"),
        expect_sql=count_rows("stage_windows", "count > 0"),
        description="Re-aggregated from the stored bins for the panel's interval (sumMap, then the sketch "
        "quantile), so a 24 h range is as exact as a 1 h one (1 % relative accuracy).",
        check=PercentileCheck(P50_P95_P99, group=("stage",), stage_column="stage", by_time=True),
        width=24,
    )


def _stage_range_table() -> PanelSpec:
    sql = (
        "SELECT stage, sum(count) AS requests,\n"
        f"       {percentiles(P50_P95_P99)},\n"
        "       max(max) AS max_ms, sum(negative_count) AS negative_values\n"
        "FROM stage_windows FINAL\n"
        f"{where(IN_RANGE, TENANT, VERSION, STAGE)}\n"
        f"GROUP BY stage\nHAVING requests > 0\nORDER BY {stage_order()}"
    )
    return PanelSpec(
        title="Stage percentiles over the range",
        kind="table",
        sql=sql,
        fmt=FORMAT_TABLE,
        columns=("stage", "requests", "p50", "p95", "p99", "max_ms", "negative_values"),
        expect_sql=count_rows("stage_windows", "count > 0"),
        description="One merged sketch per stage over the whole range. negative_values counts requests "
        "whose unattributed gap (other) was negative (clock skew between services). A stage links to the "
        "canary board for it.",
        check=PercentileCheck(P50_P95_P99, group=("stage",), stage_column="stage"),
        links={"stage": (to_canary(tenant="keep", stage="${__value.raw}"),)},
    )


def mix_sql(table: str, mix: str, label: str, *filters: str) -> str:
    """Counts per key of a summed ``Map(String, UInt64)`` mix column, one row per interval and key."""
    return (
        f"SELECT time, {label}, requests\n"
        "FROM (\n"
        f"  SELECT $__timeInterval(window_start) AS time, sumMap({mix}) AS mix_\n"
        f"  FROM {table} FINAL\n"
        f"  {where(IN_RANGE, *filters)}\n"
        "  GROUP BY time\n"
        ")\n"
        f"ARRAY JOIN mapKeys(mix_) AS {label}, mapValues(mix_) AS requests\n"
        f"ORDER BY time, {label}"
    )


def recall_mode_panel() -> PanelSpec:
    return PanelSpec(
        title="Recall mode",
        kind="timeseries",
        sql=mix_sql("llm_signals", "recall_mode_mix", "recall_mode", TENANT, VERSION),
        fmt=FORMAT_TIME_SERIES,
        columns=("time", "recall_mode", "requests"),
        expect_sql=count_rows("llm_signals", "requests > 0"),
        description="Requests per recall mode: serial recall adds vector and BM25 latencies, parallel "
        "takes the slower of the two.",
        unit="short",
    )


def _rerank_top_k() -> PanelSpec:
    sql = (
        "SELECT $__timeInterval(window_start) AS time, toString(rerank_top_k) AS top_k, count() AS requests\n"
        "FROM requests FINAL\n"
        f"{where(IN_RANGE, 'rerank_top_k IS NOT NULL', TENANT, VERSION)}\n"
        "GROUP BY time, top_k\nORDER BY time, top_k"
    )
    return PanelSpec(
        title="Rerank top-k",
        kind="timeseries",
        sql=sql,
        fmt=FORMAT_TIME_SERIES,
        columns=("time", "top_k", "requests"),
        expect_sql=count_rows("requests", "rerank_top_k IS NOT NULL"),
        description="Requests per rerank top-k: rerank cost grows with k.",
        unit="short",
    )


def slowest_requests(settings: Settings) -> PanelSpec:
    """The 50 slowest requests of the range (selected tenants and versions), each linking to its board and
    trace."""
    sql = (
        "SELECT request_id, tenant_id, version_id, started_at, ttft_ms, retrieval_ms, prompt_assemble_ms,\n"
        f"       llm_ttft_ms, other_ms, recall_mode, rerank_top_k, route, status, trace_id, {key_columns()}\n"
        "FROM requests FINAL\n"
        f"{where(IN_RANGE, 'ttft_ms IS NOT NULL', TENANT, VERSION)}\n"
        "ORDER BY ttft_ms DESC, request_id\nLIMIT 50"
    )
    return PanelSpec(
        title="Slowest requests",
        kind="table",
        sql=sql,
        fmt=FORMAT_TABLE,
        columns=(
            "request_id",
            "tenant_id",
            "version_id",
            "started_at",
            "ttft_ms",
            "retrieval_ms",
            "prompt_assemble_ms",
            "llm_ttft_ms",
            "other_ms",
            "recall_mode",
            "rerank_top_k",
            "route",
            "status",
            "trace_id",
            TENANT_KEY,
            VERSION_KEY,
        ),
        expect_sql=count_rows("requests", "ttft_ms IS NOT NULL"),
        description="The 50 slowest requests of the range with their stages: a request_id opens the request's "
        "board (`ttft request <id>` shows the same), a trace_id its trace, a version_id the canary board.",
        links={
            "request_id": (to_request(),),
            "trace_id": (to_trace(settings),),
            "version_id": (to_canary(version="row"),),
        },
        hidden=(TENANT_KEY, VERSION_KEY),
        width=24,
        height=10,
    )


def stage_drilldown(settings: Settings) -> DashboardSpec:
    """Dashboard 2: Stage drill-down."""
    return DashboardSpec(
        uid="ttft-stages",
        slug="ttft-stage-drilldown",
        title="TTFT stage drill-down",
        description="Per-stage percentiles over time from the stored sketches, TTFT's P95 if a stage took "
        "$scale times as long (replayed request by request), the retrieval levers (recall mode, rerank top-k) "
        "and the slowest requests.",
        variables=(tenant_variable(), version_variable(), stage_variable(), scale_variable()),
        panels=(
            _stage_over_time(),
            _stage_range_table(),
            whatif_panel(),
            recall_mode_panel(),
            _rerank_top_k(),
            slowest_requests(settings),
        ),
    )
