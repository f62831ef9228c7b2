"""Dashboard 5: Pipeline health (dead letters, late data, caps, lag and insert latency).

Worker metrics come from ``pipeline_stats``: append-only gauge samples, so a panel takes the last sample
per worker (and label set) in each interval and adds those up across workers; it never sums samples over
time. The metric names are :data:`STATS_METRICS`, the names the workers write.
"""

from __future__ import annotations

from typing import Final

from streams.grafana.boards_latency import IN_RANGE, tenant_variable
from streams.grafana.model import FORMAT_TIME_SERIES, DashboardSpec, PanelSpec
from streams.grafana.panels_rules import rule_gates, rule_outcomes, undecided_series
from streams.grafana.sql import TENANT, count_rows, literal, selected, where

#: ``pipeline_stats.metric`` names shown here (streams/store/stats_store.py).
CONSUMER_LAG: Final = "consumer_lag"
INSERT_LATENCY_MS: Final = "insert_latency_ms"
OPEN_REQUESTS: Final = "open_requests"
EVICTIONS: Final = "evictions"
SERIES_CAP_HITS: Final = "series_cap_hits"
CUT_OFF_TRACES: Final = "otlp_cut_off_traces"
STATS_METRICS: Final = (CONSUMER_LAG, INSERT_LATENCY_MS, OPEN_REQUESTS, EVICTIONS, SERIES_CAP_HITS, CUT_OFF_TRACES)
STATS_IN_RANGE: Final = "$__timeFilter(ts)"
DEAD_LETTER_TENANT: Final = selected("tenant", "tenant")


def _metric_in(metrics: tuple[str, ...]) -> str:
    return f"metric IN ({', '.join(literal(m) for m in metrics)})"


def _dead_letters() -> PanelSpec:
    sql = (
        "SELECT $__timeInterval(ts) AS time, reason_code, count() AS dead_letters\n"
        "FROM (\n"
        "  SELECT reason_code, ifNull(tenant_id, '') AS tenant, ifNull(kafka_timestamp, received_at) AS ts\n"
        "  FROM dead_letters FINAL\n"
        ")\n"
        f"{where(STATS_IN_RANGE, DEAD_LETTER_TENANT)}\n"
        "GROUP BY time, reason_code\nORDER BY time, reason_code"
    )
    expect = (
        "SELECT count() FROM (SELECT ifNull(kafka_timestamp, received_at) AS ts FROM dead_letters FINAL)\n"
        f"{where(STATS_IN_RANGE)}"
    )
    return PanelSpec(
        title="Dead letters by reason",
        kind="timeseries",
        sql=sql,
        fmt=FORMAT_TIME_SERIES,
        columns=("time", "reason_code", "dead_letters"),
        expect_sql=expect,
        description="Events that failed validation or the join, by reason code, at their Kafka timestamp. "
        "Unparseable events carry no tenant: pick All tenants to see them.",
        unit="short",
        field_config={"custom": {"drawStyle": "bars", "stacking": {"mode": "normal", "group": "A"}}},
    )


def _late_and_amendments() -> PanelSpec:
    sql = (
        "SELECT $__timeInterval(window_start) AS time,\n"
        "       sum(late_events) AS late_events, sum(late_amendments) AS late_records,\n"
        "       max(amendments) AS window_recomputes, sum(duplicate_events) AS duplicates\n"
        "FROM window_health FINAL\n"
        f"{where(IN_RANGE, TENANT)}\n"
        "GROUP BY time\nORDER BY time"
    )
    return PanelSpec(
        title="Late events and amendments",
        kind="timeseries",
        sql=sql,
        fmt=FORMAT_TIME_SERIES,
        columns=("time", "late_events", "late_records", "window_recomputes", "duplicates"),
        expect_sql=count_rows("window_health"),
        description="Events folded into already emitted requests, records that arrived after their window "
        "closed (each amends the window), how often a window was recomputed, and duplicates counted once.",
        unit="short",
    )


def _no_first_chunk() -> PanelSpec:
    sql = (
        "SELECT $__timeInterval(window_start) AS time, tenant_id, sum(no_first_chunk) AS no_first_chunk\n"
        "FROM window_health FINAL\n"
        f"{where(IN_RANGE, TENANT)}\n"
        "GROUP BY time, tenant_id\nORDER BY time, tenant_id"
    )
    return PanelSpec(
        title="LLM calls without a first chunk",
        kind="timeseries",
        sql=sql,
        fmt=FORMAT_TIME_SERIES,
        columns=("time", "tenant_id", "no_first_chunk"),
        expect_sql=count_rows("window_health"),
        description="Requests stored no_first_chunk, per tenant (0 is healthy): answered, but their LLM spans "
        "tell no first chunk (no first-chunk attribute or event: e.g. opentelemetry-instrumentation-openai-v2), "
        "so their TTFT is unknown. They are never SLO-bad and keep their other stages; TTFTTelemetryDegraded names "
        "them. ttft_otlp_no_first_chunk{scope, scope_version} on the join says which instrumentation made "
        "the spans; the fix (gen_ai.response.time_to_first_chunk on the LLM span) is in docs/otlp-mapping.md.",
        unit="short",
        field_config={"custom": {"drawStyle": "bars", "stacking": {"mode": "normal", "group": "A"}}},
    )


def _series_caps() -> PanelSpec:
    sql = (
        "SELECT $__timeInterval(window_start) AS time, sum(overflow_series) AS series_over_cap,\n"
        "       sumIf(total, version_id = '__other__') AS requests_in_other\n"
        "FROM window_health FINAL\n"
        f"{where(IN_RANGE)}\n"
        "GROUP BY time\nORDER BY time"
    )
    return PanelSpec(
        title="Series caps hit",
        kind="timeseries",
        sql=sql,
        fmt=FORMAT_TIME_SERIES,
        columns=("time", "series_over_cap", "requests_in_other"),
        expect_sql=count_rows("window_health"),
        description="Tenant x version series folded into an __other__ row (a tenant's own when it passed "
        "windows.max_versions_per_tenant, the shared one past windows.max_series), and the requests they "
        "carried. Above 0, per-version numbers miss those series.",
        unit="short",
    )


def _last_per_worker(metrics: tuple[str, ...], label: str, *, combine: str = "sum") -> str:
    """Last sample per worker and label set in each interval, combined across workers."""
    return (
        f"SELECT time, {label}, {combine}(last_value) AS value\n"
        "FROM (\n"
        "  SELECT $__timeInterval(ts) AS time, metric, worker_id, toString(labels) AS label_set,\n"
        "         labels['table'] AS table_name, argMax(value, ts) AS last_value\n"
        "  FROM pipeline_stats\n"
        f"  {where(STATS_IN_RANGE, _metric_in(metrics))}\n"
        "  GROUP BY time, metric, worker_id, label_set, table_name\n"
        ")\n"
        f"GROUP BY time, {label}\nORDER BY time, {label}"
    )


def _stats_panel(
    title: str, metrics: tuple[str, ...], label: str, description: str, unit: str, combine: str = "sum"
) -> PanelSpec:
    return PanelSpec(
        title=title,
        kind="timeseries",
        sql=_last_per_worker(metrics, label, combine=combine),
        fmt=FORMAT_TIME_SERIES,
        columns=("time", label, "value"),
        expect_sql=count_rows("pipeline_stats", _metric_in(metrics), time_column="ts", final=False),
        description=description,
        unit=unit,
    )


def pipeline_health() -> DashboardSpec:
    """Dashboard 5: Pipeline health."""
    return DashboardSpec(
        uid="ttft-pipeline-health",
        slug="ttft-pipeline-health",
        title="TTFT pipeline health",
        description="Is the measurement itself healthy: dead letters, late data, LLM calls without a first "
        "chunk, open requests and evictions, series caps, OTLP traces cut apart, consumer lag, ClickHouse insert "
        "latency, and whether the alert rules had enough traffic to decide, and what keeps a rule silent (paused, "
        "muted, unwatched tenants, quarantined sources).",
        variables=(tenant_variable(),),
        panels=(
            _dead_letters(),
            _late_and_amendments(),
            _no_first_chunk(),
            _stats_panel(
                "Open requests and evictions",
                (OPEN_REQUESTS, EVICTIONS, SERIES_CAP_HITS),
                "metric",
                "Requests waiting for their stages (join.max_open_requests caps them), open requests evicted "
                "as timed_out when the cap tripped, and series-cap hits, summed over workers.",
                "short",
            ),
            _series_caps(),
            _stats_panel(
                "OTLP traces cut apart",
                (CUT_OFF_TRACES,),
                "metric",
                "OpenTelemetry traces that start at a stage span, counted by the join workers since they started "
                "(flat is healthy): one stage span alone, or a retrieval without an LLM span. When a request's "
                "OpenTelemetry context does not reach a part (the Java agent beside Spring Boot's OpenTelemetry "
                "starter, Reactor without context propagation, a thread pool), each part is stored as a request of "
                "its own; a batch job's single call counts too. ttft otel check names the traces and the fix "
                "(docs/otlp-mapping.md).",
                "short",
            ),
            _stats_panel(
                "Consumer lag",
                (CONSUMER_LAG,),
                "metric",
                "Messages behind the log end, summed over partitions and workers.",
                "short",
            ),
            _stats_panel(
                "Insert latency",
                (INSERT_LATENCY_MS,),
                "table_name",
                "ClickHouse insert latency per table: the slowest worker's last sample per interval.",
                "ms",
                combine="max",
            ),
            rule_gates(),
            rule_outcomes(),
            undecided_series(),
        ),
    )
