"""Dashboards 3 (Canary) and 4 (LLM levers). Thresholds come from the rules config, never typed twice."""

from __future__ import annotations

from typing import Any

from streams.grafana.boards_latency import (
    IN_RANGE,
    P50_P95_P99,
    stage_variable,
    tenant_variable,
    version_variable,
)
from streams.grafana.boards_stages import mix_sql, slowest_requests
from streams.grafana.links import TENANT_KEY, VERSION_KEY, to_drilldown
from streams.grafana.model import (
    FORMAT_TABLE,
    FORMAT_TIME_SERIES,
    AnnotationSpec,
    DashboardSpec,
    PanelSpec,
    PercentileCheck,
)
from streams.grafana.sql import CANARY_VERSION, STAGE, TENANT, VERSION, count_rows, number, percentiles, where
from streams.rules_config import RulesConfig
from streams.settings import Settings


def threshold_lines(*steps: tuple[str, float | None]) -> dict[str, Any]:
    """fieldConfig drawing the given thresholds as lines (values from the rules config)."""
    return {
        "thresholds": {"mode": "absolute", "steps": [{"color": c, "value": v} for c, v in steps]},
        "custom": {"thresholdsStyle": {"mode": "line+area"}, "showPoints": "never", "lineWidth": 1},
    }


def _arms_over_time() -> PanelSpec:
    sql = (
        "SELECT $__timeInterval(window_start) AS time, version_id, stage,\n"
        f"       {percentiles({'p95': 0.95})}\n"
        "FROM stage_windows FINAL\n"
        f"{where(IN_RANGE, TENANT, VERSION, STAGE)}\n"
        "GROUP BY time, version_id, stage\nHAVING sum(count) > 0\nORDER BY time, version_id, stage"
    )
    return PanelSpec(
        title="Arms side by side per stage (raw P95)",
        kind="timeseries",
        sql=sql,
        fmt=FORMAT_TIME_SERIES,
        columns=("time", "version_id", "stage", "p95"),
        expect_sql=count_rows("stage_windows", "count > 0"),
        description="P95 per version (arm) and stage, merged from the sketches; pick the stable and canary "
        "versions and one stage to compare. Raw: not adjusted for traffic mix.",
        check=PercentileCheck({"p95": 0.95}, group=("version_id", "stage"), stage_column="stage", by_time=True),
        width=12,
    )


def _arms_range_table() -> PanelSpec:
    sql = (
        "SELECT version_id, stage, sum(count) AS requests,\n"
        f"       {percentiles(P50_P95_P99)}\n"
        "FROM stage_windows FINAL\n"
        f"{where(IN_RANGE, TENANT, VERSION, STAGE)}\n"
        "GROUP BY version_id, stage\nHAVING requests > 0\nORDER BY stage, version_id"
    )
    return PanelSpec(
        title="Arms over the range (raw)",
        kind="table",
        sql=sql,
        fmt=FORMAT_TABLE,
        columns=("version_id", "stage", "requests", "p50", "p95", "p99"),
        expect_sql=count_rows("stage_windows", "count > 0"),
        description="Each version's merged percentiles per stage over the range.",
        check=PercentileCheck(P50_P95_P99, group=("version_id", "stage"), stage_column="stage"),
        width=12,
    )


def _mix_adjusted(rules: RulesConfig) -> PanelSpec:
    sql = (
        "SELECT window_start AS time, tenant_id, stage, canary_version,\n"
        "       p95_canary AS canary_p95_verdict, naive_p95_canary AS canary_p95_raw,\n"
        "       p95_stable AS stable_p95\n"
        "FROM canary_verdicts FINAL\n"
        f"{where(IN_RANGE, TENANT, CANARY_VERSION, STAGE)}\n"
        "ORDER BY time, tenant_id, stage, canary_version"
    )
    return PanelSpec(
        title="Canary P95: mix-adjusted and raw",
        kind="timeseries",
        sql=sql,
        fmt=FORMAT_TIME_SERIES,
        columns=(
            "time",
            "tenant_id",
            "stage",
            "canary_version",
            "canary_p95_verdict",
            "canary_p95_raw",
            "stable_p95",
        ),
        expect_sql=count_rows("canary_verdicts"),
        description="Per verdict: the canary P95 the verdict used (reweighted to the stable arm's route x "
        f"prompt-cache x prompt-length mix when mix_adjusted), the raw canary P95 and the stable P95, over "
        f"the trailing {rules.canary.span_windows} windows. A gap between raw and adjusted means the arms "
        "served different traffic.",
        width=12,
    )


def _ratio_vs_thresholds(rules: RulesConfig) -> PanelSpec:
    sql = (
        "SELECT window_start AS time, tenant_id, stage, canary_version, ratio, naive_ratio\n"
        "FROM canary_verdicts FINAL\n"
        f"{where(IN_RANGE, TENANT, CANARY_VERSION, STAGE)}\n"
        "ORDER BY time, tenant_id, stage, canary_version"
    )
    canary = rules.canary
    return PanelSpec(
        title="Canary P95 ratio vs thresholds",
        kind="timeseries",
        sql=sql,
        fmt=FORMAT_TIME_SERIES,
        columns=("time", "tenant_id", "stage", "canary_version", "ratio", "naive_ratio"),
        expect_sql=count_rows("canary_verdicts"),
        description=f"Canary / stable P95. Fails above {canary.ratio} (with the stage floor and the tail "
        f"test, p < {canary.alpha}) and at once above {canary.critical_ratio}; needs "
        f"{canary.min_samples} requests per arm.",
        unit="none",
        field_config=threshold_lines(("green", None), ("orange", canary.ratio), ("red", canary.critical_ratio)),
        width=12,
    )


def _verdict_history(rules: RulesConfig) -> PanelSpec:
    canary = rules.canary
    sql = (
        "SELECT window_start, tenant_id, stage, canary_version, verdict, reason, ratio, delta_ms, tail_p,\n"
        "       naive_verdict, mix_adjusted, mix_coverage, n_canary, n_stable,\n"
        f"       {number(canary.ratio)} AS ratio_threshold,\n"
        f"       {number(canary.critical_ratio)} AS critical_ratio,\n"
        f"       {number(canary.alpha)} AS alpha, {canary.min_samples} AS min_samples, explanation,\n"
        f"       hex(tenant_id) AS {TENANT_KEY}, hex(canary_version) AS {VERSION_KEY}\n"
        "FROM canary_verdicts FINAL\n"
        f"{where(IN_RANGE, TENANT, CANARY_VERSION, STAGE)}\n"
        "ORDER BY window_start DESC, tenant_id, stage, canary_version\nLIMIT 500"
    )
    return PanelSpec(
        title="Canary verdict history",
        kind="table",
        sql=sql,
        fmt=FORMAT_TABLE,
        columns=(
            "window_start",
            "tenant_id",
            "stage",
            "canary_version",
            "verdict",
            "reason",
            "ratio",
            "delta_ms",
            "tail_p",
            "naive_verdict",
            "mix_adjusted",
            "mix_coverage",
            "n_canary",
            "n_stable",
            "ratio_threshold",
            "critical_ratio",
            "alpha",
            "min_samples",
            "explanation",
            TENANT_KEY,
            VERSION_KEY,
        ),
        expect_sql=count_rows("canary_verdicts"),
        description="Every verdict with the thresholds it was judged against (from the rules config).",
        unit="none",
        links={
            "tenant_id": (to_drilldown(version="row", stage="${__data.fields.stage}"),),
            "stage": (to_drilldown(version="row", stage="${__value.raw}"),),
        },
        hidden=(TENANT_KEY, VERSION_KEY),
        width=24,
        height=10,
    )


FIRST_SEEN = (
    "SELECT version_id, tenant_id, min(window_start) AS first_seen, max(window_start) AS last_seen,\n"
    "       sum(total) AS requests\n"
    "FROM window_health FINAL\n"
    f"{where(TENANT)}\n"
    "GROUP BY version_id, tenant_id"
)


def _first_seen() -> PanelSpec:
    active = "first_seen <= ($__toTime) AND last_seen >= ($__fromTime)"
    sql = f"SELECT * FROM (\n{FIRST_SEEN}\n)\n{where(active)}\nORDER BY first_seen, version_id, tenant_id"
    return PanelSpec(
        title="Versions first seen",
        kind="table",
        sql=sql,
        fmt=FORMAT_TABLE,
        columns=("version_id", "tenant_id", "first_seen", "last_seen", "requests"),
        expect_sql=count_rows("window_health", TENANT),
        description="When each version first served each tenant (rollout start), and when it was last seen.",
        unit="none",
        width=24,
        height=6,
    )


def rollout_annotation() -> AnnotationSpec:
    """First seen per version, as dashboard annotations."""
    sql = (
        "SELECT first_seen AS time, concat('version ', version_id, ' first seen') AS text,\n"
        "       version_id AS tags\n"
        "FROM (\n"
        "  SELECT version_id, min(window_start) AS first_seen FROM window_health FINAL GROUP BY version_id\n"
        ")\n"
        f"{where('$__timeFilter(first_seen)')}\nORDER BY time"
    )
    return AnnotationSpec("Rollouts: first seen per version", sql)


def canary(rules: RulesConfig, settings: Settings) -> DashboardSpec:
    """Dashboard 3: Canary."""
    return DashboardSpec(
        uid="ttft-canary",
        slug="ttft-canary",
        title="TTFT canary",
        description="Canary against stable per stage: raw and mix-adjusted P95, the verdicts with their "
        "thresholds, rollout annotations, and the slowest requests of the selected versions.",
        variables=(tenant_variable(), version_variable(), stage_variable()),
        panels=(
            _arms_over_time(),
            _arms_range_table(),
            _mix_adjusted(rules),
            _ratio_vs_thresholds(rules),
            _verdict_history(rules),
            _first_seen(),
            slowest_requests(settings),
        ),
        annotations=(rollout_annotation(),),
    )


def _cache_hit_rate() -> PanelSpec:
    sql = (
        "SELECT $__timeInterval(window_start) AS time, tenant_id,\n"
        "       sum(prompt_cache_hits) / sum(prompt_cache_known) AS cache_hit_rate,\n"
        "       sum(below_cacheable) / sum(prompt_tokens_known) AS below_cacheable_min\n"
        "FROM llm_signals FINAL\n"
        f"{where(IN_RANGE, TENANT, VERSION)}\n"
        "GROUP BY time, tenant_id\nHAVING sum(prompt_cache_known) > 0 OR sum(prompt_tokens_known) > 0\n"
        "ORDER BY time, tenant_id"
    )
    return PanelSpec(
        title="Prompt-cache hit rate",
        kind="timeseries",
        sql=sql,
        fmt=FORMAT_TIME_SERIES,
        columns=("time", "tenant_id", "cache_hit_rate", "below_cacheable_min"),
        expect_sql=count_rows("llm_signals", "prompt_cache_known > 0 OR prompt_tokens_known > 0"),
        description="Share of prompt-cache hits among requests that reported it, and the share of prompts "
        "shorter than the cacheable minimum (windows.cacheable_min_tokens): those can never hit.",
        unit="percentunit",
    )


def _draft_acceptance(rules: RulesConfig) -> PanelSpec:
    rank = "toUInt64(floor({q} * (count(draft_accept_rate) - 1))) + 1"
    sorted_rates = "arraySort(groupArray(draft_accept_rate))"
    sql = (
        "SELECT $__timeInterval(window_start) AS time, tenant_id,\n"
        f"       arrayElement({sorted_rates}, {rank.format(q=0.5)}) AS draft_accept_p50,\n"
        f"       arrayElement({sorted_rates}, {rank.format(q=0.1)}) AS draft_accept_p10\n"
        "FROM requests FINAL\n"
        f"{where(IN_RANGE, 'draft_accept_rate IS NOT NULL', TENANT, VERSION)}\n"
        "GROUP BY time, tenant_id\nORDER BY time, tenant_id"
    )
    draft = rules.draft_acceptance
    return PanelSpec(
        title="Draft acceptance vs the 0.6 line",
        kind="timeseries",
        sql=sql,
        fmt=FORMAT_TIME_SERIES,
        columns=("time", "tenant_id", "draft_accept_p50", "draft_accept_p10"),
        expect_sql=count_rows("requests", "draft_accept_rate IS NOT NULL"),
        description=f"Speculative decoding: median and P10 draft acceptance (exact order statistics of the "
        f"requests). Below {draft.threshold} it is slower than no speculation "
        f"(TTFTDraftAcceptanceLow; recovers above {draft.recovery_threshold}).",
        unit="percentunit",
        check=PercentileCheck(
            {"draft_accept_p50": 0.5, "draft_accept_p10": 0.1},
            group=("tenant_id",),
            stage="draft_accept_rate",
            by_time=True,
        ),
        field_config=threshold_lines(("red", None), ("green", draft.threshold)),
    )


def _mix_panel(title: str, mix: str, label: str, description: str) -> PanelSpec:
    return PanelSpec(
        title=title,
        kind="timeseries",
        sql=mix_sql("llm_signals", mix, label, TENANT, VERSION),
        fmt=FORMAT_TIME_SERIES,
        columns=("time", label, "requests"),
        expect_sql=count_rows("llm_signals", "requests > 0"),
        description=description,
        unit="short",
        field_config={"custom": {"stacking": {"mode": "percent", "group": "A"}, "fillOpacity": 40}},
    )


def llm_levers(rules: RulesConfig) -> DashboardSpec:
    """Dashboard 4: LLM levers."""
    return DashboardSpec(
        uid="ttft-llm-levers",
        slug="ttft-llm-levers",
        title="TTFT LLM levers",
        description="What the LLM-side levers are doing: prompt cache, speculative decoding, routing and fallbacks.",
        variables=(tenant_variable(), version_variable()),
        panels=(
            _cache_hit_rate(),
            _draft_acceptance(rules),
            _mix_panel("Route mix", "route_mix", "route", "Requests per route (small-model routing tier)."),
            _mix_panel(
                "Fallback mix",
                "fallback_mix",
                "fallback_level",
                "Requests per fallback level (0 = no degradation).",
            ),
        ),
    )
