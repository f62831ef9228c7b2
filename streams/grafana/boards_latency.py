"""Dashboard 1 (TTFT overview), and the variables and constants the other dashboards share."""

from __future__ import annotations

from streams.grafana.links import TENANT_KEY, to_canary, to_drilldown
from streams.grafana.model import (
    FORMAT_TABLE,
    FORMAT_TIME_SERIES,
    DashboardSpec,
    PanelSpec,
    PercentileCheck,
    VariableSpec,
)
from streams.grafana.sql import (
    BREAKDOWN_STAGES,
    PARENTS,
    TENANT,
    VERSION,
    count_rows,
    health_share,
    hex_variable_sql,
    percentiles,
    sketch_quantile,
    slo_expression,
    stage_in,
    stage_order,
    string_array,
    where,
)
from streams.settings import Settings

P95_P99 = {"p95": 0.95, "p99": 0.99}
P50_P95_P99 = {"p50": 0.5, "p95": 0.95, "p99": 0.99}
IN_RANGE = "$__timeFilter(window_start)"
TTFT_ONLY = "stage = 'ttft'"
ATTRIBUTED = "status = 'ok'"


def tenant_variable() -> VariableSpec:
    return VariableSpec(
        "tenant",
        "Tenant",
        hex_variable_sql("tenant_id", f"FROM window_health FINAL {where(IN_RANGE)}"),
    )


def version_variable() -> VariableSpec:
    return VariableSpec(
        "version",
        "Version",
        hex_variable_sql("version_id", f"FROM window_health FINAL {where(IN_RANGE, TENANT)}"),
    )


def stage_variable() -> VariableSpec:
    return VariableSpec(
        "stage",
        "Stage",
        f"SELECT DISTINCT stage FROM stage_windows FINAL {where(IN_RANGE)} ORDER BY stage",
    )


def _ttft_over_time(settings: Settings) -> PanelSpec:
    sql = (
        "SELECT $__timeInterval(window_start) AS time, tenant_id,\n"
        f"       {percentiles(P95_P99)},\n"
        f"       {slo_expression(settings)} AS slo_ms\n"
        "FROM stage_windows FINAL\n"
        f"{where(IN_RANGE, TTFT_ONLY, TENANT, VERSION)}\n"
        "GROUP BY time, tenant_id\nHAVING sum(count) > 0\nORDER BY time, tenant_id"
    )
    return PanelSpec(
        title="TTFT P95 and P99 per tenant",
        kind="timeseries",
        sql=sql,
        fmt=FORMAT_TIME_SERIES,
        columns=("time", "tenant_id", "p95", "p99", "slo_ms"),
        expect_sql=count_rows("stage_windows", "stage = 'ttft'", "count > 0"),
        description="End-to-end TTFT percentiles merged from the stored sketches per interval, with each "
        "tenant's SLO (tenants.<id>.slo_ms). Completeness is the panel beside it.",
        check=PercentileCheck(P95_P99, group=("tenant_id",), stage="ttft", by_time=True),
        overrides=(
            {
                "matcher": {"id": "byRegexp", "options": "/slo_ms/"},
                "properties": [
                    {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                    {"id": "custom.lineWidth", "value": 2},
                ],
            },
        ),
        width=16,
    )


def _completeness_over_time() -> PanelSpec:
    sql = (
        "SELECT $__timeInterval(window_start) AS time, tenant_id,\n"
        "       sum(complete) / sum(total) AS complete_ratio,\n"
        "       sum(missing_stage) / sum(total) AS missing_stage_ratio,\n"
        "       sum(no_first_chunk) / sum(total) AS no_first_chunk_ratio,\n"
        "       sum(timed_out) / sum(total) AS timed_out_ratio,\n"
        "       sum(orphan) / sum(total) AS orphan_ratio\n"
        "FROM window_health FINAL\n"
        f"{where(IN_RANGE, TENANT, VERSION)}\n"
        "GROUP BY time, tenant_id\nHAVING sum(total) > 0\nORDER BY time, tenant_id"
    )
    return PanelSpec(
        title="Completeness per tenant",
        kind="timeseries",
        sql=sql,
        fmt=FORMAT_TIME_SERIES,
        columns=(
            "time",
            "tenant_id",
            "complete_ratio",
            "missing_stage_ratio",
            "no_first_chunk_ratio",
            "timed_out_ratio",
            "orphan_ratio",
        ),
        expect_sql=count_rows("window_health", "total > 0"),
        description="Share of requests per status: below ~0.9 complete, the latency numbers beside it are "
        "missing part of the traffic (timed-out and orphan requests count as SLO-bad, never as fast). "
        "no_first_chunk: answered, but the LLM spans tell no first chunk, so TTFT is unknown (fix the "
        "instrumentation: docs/otlp-mapping.md).",
        unit="percentunit",
        width=8,
    )


def _ttft_range_table(settings: Settings) -> PanelSpec:
    sql = (
        "SELECT s.tenant_id AS tenant_id, s.requests AS requests, s.p50 AS p50, s.p95 AS p95, s.p99 AS p99,\n"
        "       s.slo_ms AS slo_ms, s.slo_bad / h.slo_requests AS slo_bad_share,\n"
        f"       h.complete_share AS complete_share, hex(s.tenant_id) AS {TENANT_KEY}\n"
        "FROM (\n"
        "  SELECT tenant_id, sum(count) AS requests,\n"
        f"       {percentiles(P50_P95_P99)},\n"
        f"       {slo_expression(settings)} AS slo_ms, sum(slo_bad_count) AS slo_bad\n"
        "  FROM stage_windows FINAL\n"
        f"  {where(IN_RANGE, TTFT_ONLY, TENANT, VERSION)}\n"
        "  GROUP BY tenant_id HAVING requests > 0\n"
        ") AS s\n"
        f"LEFT JOIN ({health_share(TENANT, VERSION)}) AS h USING (tenant_id)\n"
        "ORDER BY tenant_id"
    )
    return PanelSpec(
        title="TTFT over the range per tenant",
        kind="table",
        sql=sql,
        fmt=FORMAT_TABLE,
        columns=(
            "tenant_id",
            "requests",
            "p50",
            "p95",
            "p99",
            "slo_ms",
            "slo_bad_share",
            "complete_share",
            TENANT_KEY,
        ),
        expect_sql=count_rows("stage_windows", "stage = 'ttft'", "count > 0"),
        description="Percentiles over the whole range (one merged sketch per tenant), SLO-bad share of all "
        "requests whose TTFT is known or bad (no_first_chunk ones left out) and completeness beside them. "
        "A tenant links to its stage drill-down and canary board.",
        check=PercentileCheck(P50_P95_P99, group=("tenant_id",), stage="ttft"),
        links={"tenant_id": (to_drilldown(), to_canary())},
        hidden=(TENANT_KEY,),
        width=12,
    )


def _stage_breakdown() -> PanelSpec:
    sql = (
        "SELECT s.tenant_id AS tenant_id, s.stage AS stage, s.requests AS requests, s.p95 AS p95,\n"
        f"       h.complete_share AS complete_share, hex(s.tenant_id) AS {TENANT_KEY}\n"
        "FROM (\n"
        "  SELECT tenant_id, stage, sum(count) AS requests,\n"
        f"       {sketch_quantile(0.95)} AS p95\n"
        "  FROM stage_windows FINAL\n"
        f"  {where(IN_RANGE, stage_in(BREAKDOWN_STAGES), TENANT, VERSION)}\n"
        "  GROUP BY tenant_id, stage HAVING requests > 0\n"
        ") AS s\n"
        f"LEFT JOIN ({health_share(TENANT, VERSION)}) AS h USING (tenant_id)\n"
        f"ORDER BY tenant_id, {stage_order('s.stage')}"
    )
    return PanelSpec(
        title="Stage P95 breakdown",
        kind="table",
        sql=sql,
        fmt=FORMAT_TABLE,
        columns=("tenant_id", "stage", "requests", "p95", "complete_share", TENANT_KEY),
        expect_sql=count_rows("stage_windows", stage_in(BREAKDOWN_STAGES), "count > 0"),
        description="P95 of each parent stage, the unattributed gap (other) and TTFT per tenant. "
        "Stage P95s do not add up to the TTFT P95: cut the largest stage first. A stage links to the "
        "drill-down for that tenant and stage.",
        links={"tenant_id": (to_drilldown(),), "stage": (to_drilldown(stage="${__value.raw}"),)},
        hidden=(TENANT_KEY,),
        check=PercentileCheck(
            {"p95": 0.95}, group=("tenant_id", "stage"), stage_column="stage", stages=BREAKDOWN_STAGES
        ),
        width=12,
    )


def _cut_first() -> PanelSpec:
    parents = string_array(PARENTS)
    sql = (
        "SELECT p.tenant_id AS tenant_id, argMax(p.stage, p.p95) AS biggest_p95_stage,\n"
        "       max(p.p95) AS biggest_p95_ms, any(t.tail_dominant_stage) AS tail_dominant_stage,\n"
        "       any(t.exemplar_request_ids) AS exemplar_request_ids,\n"
        "       any(t.attributed_windows) AS attributed_windows,\n"
        f"       any(h.complete_share) AS complete_share, hex(tenant_id) AS {TENANT_KEY}\n"
        "FROM (\n"
        f"  SELECT tenant_id, stage, {sketch_quantile(0.95)} AS p95\n"
        "  FROM stage_windows FINAL\n"
        f"  {where(IN_RANGE, stage_in(PARENTS), TENANT, VERSION)}\n"
        "  GROUP BY tenant_id, stage HAVING sum(count) > 0\n"
        ") AS p\n"
        "LEFT JOIN (\n"
        f"  SELECT tenant_id, attributed_windows, exemplar_request_ids,\n"
        f"         arrayMap(s_ -> tail_w[s_] / tail_n - band_w[s_] / band_n, {parents}) AS delta_,\n"
        f"         {parents}[arrayFirstIndex(d_ -> d_ = arrayMax(delta_), delta_)] AS tail_dominant_stage\n"
        "  FROM (\n"
        "    SELECT tenant_id, count() AS attributed_windows,\n"
        "           sumMap(mapApply((k_, v_) -> (k_, v_ * tail_count), tail_share)) AS tail_w,\n"
        "           sum(tail_count) AS tail_n,\n"
        "           sumMap(mapApply((k_, v_) -> (k_, v_ * band_count), band_share)) AS band_w,\n"
        "           sum(band_count) AS band_n,\n"
        "           argMax(exemplar_request_ids, ttft_p95) AS exemplar_request_ids\n"
        "    FROM tail_attribution FINAL\n"
        f"    {where(IN_RANGE, ATTRIBUTED, TENANT, VERSION)}\n"
        "    GROUP BY tenant_id HAVING tail_n > 0 AND band_n > 0\n"
        "  )\n"
        ") AS t USING (tenant_id)\n"
        f"LEFT JOIN ({health_share(TENANT, VERSION)}) AS h USING (tenant_id)\n"
        "GROUP BY tenant_id\nORDER BY tenant_id"
    )
    return PanelSpec(
        title="Cut this stage first",
        kind="table",
        sql=sql,
        fmt=FORMAT_TABLE,
        columns=(
            "tenant_id",
            "biggest_p95_stage",
            "biggest_p95_ms",
            "tail_dominant_stage",
            "exemplar_request_ids",
            "attributed_windows",
            "complete_share",
            TENANT_KEY,
        ),
        expect_sql=count_rows("stage_windows", stage_in(PARENTS), "count > 0"),
        description="Biggest-P95 parent stage (merged sketches over the range) and the tail-dominant stage "
        "(whose share of TTFT grows most from typical to the slowest 5 %, weighted over the windows with "
        "enough requests), with the slowest requests of the worst window as exemplars (see `ttft request`).",
        check=PercentileCheck(
            {"biggest_p95_ms": 0.95},
            group=("tenant_id",),
            stage_column="biggest_p95_stage",
            stages=PARENTS,
            argmax_over=True,
        ),
        links={
            "tenant_id": (to_drilldown(),),
            "biggest_p95_stage": (to_drilldown(stage="${__value.raw}"),),
            "tail_dominant_stage": (to_drilldown(stage="${__value.raw}"),),
        },
        hidden=(TENANT_KEY,),
        width=24,
        height=7,
    )


def overview(settings: Settings) -> DashboardSpec:
    """Dashboard 1: TTFT overview."""
    return DashboardSpec(
        uid="ttft-overview",
        slug="ttft-overview",
        title="TTFT overview",
        description="End-to-end TTFT per tenant against its SLO, the stage breakdown and which stage to cut "
        "first. Every number has its completeness beside it.",
        variables=(tenant_variable(), version_variable()),
        panels=(
            _ttft_over_time(settings),
            _completeness_over_time(),
            _ttft_range_table(settings),
            _stage_breakdown(),
            _cut_first(),
        ),
    )
