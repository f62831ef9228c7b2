"""Optional Grafana-side alert rules, generated from the rules config (``TTFT_CONFIG``), paused by default.

The pipeline's rule engine is the primary alerting path (it pages through Alertmanager). These rules
exist for teams that prefer Grafana alerting; they are written with ``isPaused: true`` so that enabling
both paths, and paging twice, takes a deliberate edit (docs/grafana.md: choose one). Thresholds,
spans and hysteresis come from :class:`streams.rules_config.RulesConfig`, so the two paths never fork.
One difference: these rules use the shortest spans only (``short_windows`` / ``long_windows``); the engine's
spans grow with a tenant's traffic (``max_span_windows``), so a low-traffic tenant is judged by the engine
where Grafana's rule stays silent.

Each rule's SQL returns one numeric column plus label columns (Grafana's table-alert contract), uses no
dashboard variables (alert evaluation has none) and wraps argument-less macros in parentheses. The label
columns are named as the pipeline's own alerts label them (``tenant``, ``stage``, ``version``), so
Alertmanager groups and inhibits both alike; each rule carries the same annotations (``summary``,
``description``, ``runbook_url``, ``dashboard_url`` on the same board, see :mod:`streams.rules.links`; the
board link's tenant is hex-encoded by the template's ``printf "%X"``, as ClickHouse's ``hex()`` does).
"""

from __future__ import annotations

from typing import Any, Final

import yaml

from streams.grafana.model import DATASOURCE_UID, FORMAT_TABLE
from streams.grafana.sql import literal, number, stage_in, string_array
from streams.rules.links import BOARD_OF_ALERT, HEX_VARIABLES, LOOKBACK_WINDOWS, runbook_url
from streams.rules_config import RulesConfig
from streams.settings import Settings
from streams.store.sketch_sql import quantile_sql

GROUP: Final = "ttft-grafana-rules"
FOLDER: Final = "TTFT"
#: Windows close after their grace period: rules judge spans ending this many windows before now.
LAG_WINDOWS: Final = 2
#: deploy/grafana/provisioning/alerting/contact-points.yaml
CONTACT_POINT: Final = "ttft-alertmanager"


def _span(settings: Settings, windows: int, offset: int = 0) -> str:
    """``window_start`` within ``windows`` windows ending ``LAG_WINDOWS + offset`` windows before now."""
    w = settings.windows.window_s
    end = f"(($__toTime) - INTERVAL {(LAG_WINDOWS + offset) * w} SECOND)"
    start = f"(($__toTime) - INTERVAL {(LAG_WINDOWS + offset + windows) * w} SECOND)"
    return f"window_start >= {start} AND window_start < {end}"


def _p95_if(condition: str) -> str:
    return quantile_sql(
        f"sumMapIf(bins, {condition})", f"sumIf(zero_count, {condition})", 0.95, "any(relative_accuracy)"
    )


def _query(sql: str, seconds: int, interval_ms: int) -> dict[str, Any]:
    return {
        "refId": "A",
        "relativeTimeRange": {"from": seconds, "to": 0},
        "datasourceUid": DATASOURCE_UID,
        "model": {
            "refId": "A",
            "editorType": "sql",
            "format": FORMAT_TABLE,
            "queryType": "table",
            "intervalMs": interval_ms,
            "maxDataPoints": 43200,
            "rawSql": sql,
        },
    }


def _dashboard_url(title: str, settings: Settings, labels: tuple[str, ...]) -> str:
    """The board link of a Grafana-side alert: the pipeline's alert's board (:data:`BOARD_OF_ALERT`), with the
    variables it has set from the alert's labels by the annotation template (ids hex-encoded)."""
    board = BOARD_OF_ALERT[title]
    grafana = (settings.rules.grafana_url or "").strip().rstrip("/")
    lookback = LOOKBACK_WINDOWS * settings.windows.window_s
    query = f"orgId=1&from=now-{lookback}s&to=now"
    for name in board.variables:
        if name in labels:
            value = f'{{{{ printf "%X" $labels.{name} }}}}' if name in HEX_VARIABLES else f"{{{{ $labels.{name} }}}}"
            query += f"&var-{name}={value}"
    return f"{grafana}/d/{board.uid}?{query}"


def _rule(
    uid: str,
    title: str,
    sql: str,
    seconds: int,
    settings: Settings,
    *,
    evaluator: tuple[str, float],
    recovery: tuple[str, float] | None,
    for_windows: int,
    severity: str,
    summary: str,
    description: str,
    labels: tuple[str, ...],
) -> dict[str, Any]:
    w = settings.windows.window_s
    condition: dict[str, Any] = {"evaluator": {"type": evaluator[0], "params": [evaluator[1]]}}
    if recovery is not None:
        condition["unloadEvaluator"] = {"type": recovery[0], "params": [recovery[1]]}
    return {
        "uid": uid,
        "title": title,
        "condition": "C",
        "data": [
            _query(sql, seconds + LAG_WINDOWS * w, w * 1000),
            {
                "refId": "B",
                "datasourceUid": "__expr__",
                "model": {"refId": "B", "type": "reduce", "expression": "A", "reducer": "last"},
            },
            {
                "refId": "C",
                "datasourceUid": "__expr__",
                "model": {"refId": "C", "type": "threshold", "expression": "B", "conditions": [condition]},
            },
        ],
        "noDataState": "OK",
        "execErrState": "Error",
        "for": f"{for_windows * w}s",
        "isPaused": True,
        "notification_settings": {"receiver": CONTACT_POINT, "group_by": ["alertname", *labels]},
        "labels": {"alertname": title, "severity": severity, "evaluated_by": "grafana"},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": runbook_url(settings.rules.runbook_base_url, title),
            "dashboard_url": _dashboard_url(title, settings, labels),
        },
    }


def _stage_regression(settings: Settings, rules: RulesConfig) -> dict[str, Any]:
    reg = rules.stage_regression
    short, long_ = _span(settings, reg.short_windows), _span(settings, reg.long_windows)
    base = _span(settings, reg.baseline_windows, reg.exclude_recent_windows)
    floors = rules.stage_floor_ms
    floor_values = "[" + ", ".join(number(v) for v in floors.values()) + "]"
    floor = f"transform(CAST(stage AS String), {string_array(floors)}, {floor_values}, 0.)"
    sql = (
        "SELECT tenant_id AS tenant, stage, least(p_short / p_base, p_long / p_base) AS p95_ratio\n"
        "FROM (\n"
        f"  SELECT tenant_id, stage, {_p95_if(short)} AS p_short, {_p95_if(long_)} AS p_long,\n"
        f"         {_p95_if(base)} AS p_base,\n"
        f"         sumIf(count, {short}) AS n_short, sumIf(count, {base}) AS n_base\n"
        "  FROM stage_windows FINAL\n"
        f"  WHERE $__timeFilter(window_start) AND {stage_in(reg.stages)}\n"
        "  GROUP BY tenant_id, stage\n"
        f"  HAVING n_short >= {reg.min_recent_samples} AND n_base >= {reg.min_baseline_samples}\n"
        f"     AND p_short - p_base >= {floor}\n"
        ")"
    )
    seconds = (reg.baseline_windows + reg.exclude_recent_windows) * settings.windows.window_s
    return _rule(
        "ttft-stage-regression",
        "TTFTStageRegression",
        sql,
        seconds,
        settings,
        evaluator=("gt", reg.ratio),
        recovery=("lt", reg.recovery_ratio),
        for_windows=reg.for_windows,
        severity="ticket",
        summary="{{ $labels.stage }} P95 regressed for tenant {{ $labels.tenant }}",
        description=(
            "{{ $labels.stage }} P95 of tenant {{ $labels.tenant }} is x{{ $values.B.Value }} its baseline "
            f"({reg.baseline_windows} windows before the last {reg.exclude_recent_windows}) on both the last "
            f"{reg.short_windows} and {reg.long_windows} window(s), and above the stage floor (Grafana-side rule: "
            "shortest spans only)."
        ),
        labels=("tenant", "stage"),
    )


def _canary_failed(settings: Settings, rules: RulesConfig) -> dict[str, Any]:
    canary = rules.canary
    span = _span(settings, canary.for_windows)
    sql = (
        "SELECT tenant_id AS tenant, stage, canary_version AS version, countIf(verdict = 'fail') AS failing_verdicts\n"
        "FROM canary_verdicts FINAL\n"
        f"WHERE $__timeFilter(window_start) AND {span}\n"
        "GROUP BY tenant_id, stage, canary_version"
    )
    return _rule(
        "ttft-canary-failed",
        "TTFTCanaryFailed",
        sql,
        canary.for_windows * settings.windows.window_s,
        settings,
        evaluator=("gt", canary.for_windows - 0.5),
        recovery=None,
        for_windows=1,
        severity="page",
        summary="Canary {{ $labels.version }} fails on {{ $labels.stage }} for tenant {{ $labels.tenant }}",
        description=(
            "The pipeline's canary verdict for version {{ $labels.version }} of tenant {{ $labels.tenant }} on "
            f"{{{{ $labels.stage }}}} was fail in each of the last {canary.for_windows} windows "
            "(canary_verdicts holds the ratios, tail test and strata)."
        ),
        labels=("tenant", "stage", "version"),
    )


def _draft_acceptance(settings: Settings, rules: RulesConfig) -> dict[str, Any]:
    draft = rules.draft_acceptance
    span = _span(settings, 1)
    sql = (
        "SELECT tenant_id AS tenant, 'llm_ttft' AS stage, version_id AS version,\n"
        "       arrayElement(arraySort(groupArray(draft_accept_rate)),\n"
        "                    toUInt64(floor(0.5 * (count(draft_accept_rate) - 1))) + 1) AS draft_accept_p50\n"
        "FROM requests FINAL\n"
        f"WHERE $__timeFilter(window_start) AND {span} AND draft_accept_rate IS NOT NULL\n"
        f"GROUP BY tenant_id, version_id HAVING count(draft_accept_rate) >= {draft.min_samples}"
    )
    return _rule(
        "ttft-draft-acceptance-low",
        "TTFTDraftAcceptanceLow",
        sql,
        settings.windows.window_s,
        settings,
        evaluator=("lt", draft.threshold),
        recovery=("gt", draft.recovery_threshold),
        for_windows=draft.for_windows,
        severity="ticket",
        summary="Draft acceptance of version {{ $labels.version }} is low for tenant {{ $labels.tenant }}",
        description=(
            "Median draft acceptance of version {{ $labels.version }} of tenant {{ $labels.tenant }} is "
            f"{{{{ $values.B.Value }}}}, below {draft.threshold:g} (at least {draft.min_samples} requests): "
            "speculative decoding costs more first-token time than it saves."
        ),
        labels=("tenant", "stage", "version"),
    )


def _telemetry(settings: Settings, rules: RulesConfig) -> dict[str, Any]:
    tel = rules.telemetry
    span = _span(settings, 1)
    sql = (
        "SELECT tenant_id AS tenant, sum(complete) / sum(total) AS complete_ratio\n"
        "FROM window_health FINAL\n"
        f"WHERE $__timeFilter(window_start) AND {span}\n"
        f"GROUP BY tenant_id HAVING sum(total) >= {tel.min_requests}"
    )
    return _rule(
        "ttft-telemetry-degraded",
        "TTFTTelemetryDegraded",
        sql,
        settings.windows.window_s,
        settings,
        evaluator=("lt", tel.completeness_floor),
        recovery=None,
        for_windows=1,
        severity="ticket",
        summary="Telemetry of tenant {{ $labels.tenant }} is incomplete",
        description=(
            "Only {{ $values.B.Value }} of tenant {{ $labels.tenant }}'s requests are complete (floor "
            f"{tel.completeness_floor:.0%}): Completeness per tenant shows why (missing_stage, no_first_chunk, "
            "timed_out, orphan)."
        ),
        labels=("tenant",),
    )


def _slo_burn(settings: Settings, rules: RulesConfig) -> dict[str, Any]:
    pair = rules.slo_burn.pairs[0]
    long_, short = _span(settings, pair.long_windows), _span(settings, pair.short_windows)
    budget = f"(1 - {slo_target(settings)})"
    sql = (
        f"SELECT tenant_id AS tenant, 'ttft' AS stage, least(bad_long / n_long, bad_short / n_short) / {budget} "
        "AS burn_rate\n"
        "FROM (\n"
        f"  SELECT tenant_id, sumIf(slo_bad_count, {long_}) AS bad_long,\n"
        f"         sumIf(slo_bad_count, {short}) AS bad_short\n"
        "  FROM stage_windows FINAL\n"
        f"  WHERE $__timeFilter(window_start) AND stage = 'ttft'\n"
        "  GROUP BY tenant_id\n"
        ") AS b\n"
        "JOIN (\n"
        f"  SELECT tenant_id, sumIf(total - no_first_chunk, {long_}) AS n_long,\n"
        f"         sumIf(total - no_first_chunk, {short}) AS n_short\n"
        "  FROM window_health FINAL\n"
        "  WHERE $__timeFilter(window_start)\n"
        f"  GROUP BY tenant_id HAVING n_long >= {rules.slo_burn.min_long_events} AND n_short > 0\n"
        ") AS n USING (tenant_id)"
    )
    return _rule(
        "ttft-slo-burn",
        "TTFTSLOBurn",
        sql,
        pair.long_windows * settings.windows.window_s,
        settings,
        evaluator=("gt", pair.burn_rate),
        recovery=None,
        for_windows=1,
        severity=pair.severity,
        summary="Tenant {{ $labels.tenant }} burns its TTFT SLO",
        description=(
            "Tenant {{ $labels.tenant }} burns its TTFT error budget x{{ $values.B.Value }} over both "
            f"{pair.long_windows} and {pair.short_windows} windows (threshold {pair.burn_rate:g}; timed-out and "
            "orphaned requests count as bad)."
        ),
        labels=("tenant", "stage"),
    )


def slo_target(settings: Settings) -> str:
    """Each tenant's SLO target as SQL (``tenants.<id>.slo_target``, else the default)."""
    tenants = sorted(t for t, cfg in settings.tenants.items() if cfg.slo_target is not None)
    default = number(settings.default_slo_target)
    if not tenants:
        return default
    names = "[" + ", ".join(literal(t) for t in tenants) + "]"
    values = "[" + ", ".join(number(settings.slo_target(t)) for t in tenants) + "]"
    return f"transform(CAST(tenant_id AS String), {names}, {values}, {default})"


def alert_rules(settings: Settings, rules: RulesConfig) -> dict[str, Any]:
    """The ``provisioning/alerting/rules.yaml`` document (every rule paused)."""
    builders = (
        (rules.stage_regression.enabled, _stage_regression),
        (rules.canary.enabled, _canary_failed),
        (rules.draft_acceptance.enabled, _draft_acceptance),
        (rules.telemetry.enabled, _telemetry),
        (rules.slo_burn.enabled, _slo_burn),
    )
    return {
        "apiVersion": 1,
        "groups": [
            {
                "orgId": 1,
                "name": GROUP,
                "folder": FOLDER,
                "interval": f"{settings.windows.window_s}s",
                "rules": [build(settings, rules) for enabled, build in builders if enabled],
            }
        ],
    }


HEADER: Final = (
    "# GENERATED by `ttft grafana build` from TTFT_CONFIG (streams/grafana/alert_rules.py): do not edit.\n"
    "# Optional Grafana-side alert rules, PAUSED (isPaused: true). The pipeline already pages through\n"
    "# Alertmanager: enable these only if you turn the pipeline's paging off (docs/grafana.md).\n"
)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the SQL) as literal blocks, so the file reads like the code."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render_rules(document: dict[str, Any]) -> str:
    """YAML text of the rules file (stable order, header comment)."""
    return HEADER + yaml.dump(document, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100_000)
