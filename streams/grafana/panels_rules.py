"""Panels over ``rule_evaluations`` and ``rule_gates``: whether the alert rules could decide, per outcome
and per series, and what keeps a rule silent.

A rule that lacks samples even over its largest span reports ``insufficient_traffic``; a rule can also be
switched off, paging muted, the silence rule limited to registered tenants, a source quarantined. These
panels make that silence visible (on-call must be able to tell "fine" from "never looked").
"""

from __future__ import annotations

from typing import Final

from streams.grafana.boards_latency import IN_RANGE
from streams.grafana.model import FORMAT_TABLE, FORMAT_TIME_SERIES, PanelSpec
from streams.grafana.sql import TENANT, count_rows, where

#: The rules whose span grows with traffic (the others decide on fixed spans).
SPAN_RULES: Final = "rule IN ('TTFTStageRegression', 'TTFTCanaryFailed')"


def rule_outcomes() -> PanelSpec:
    """Evaluations of the regression and canary rules per outcome over time."""
    sql = (
        "SELECT $__timeInterval(window_start) AS time, outcome, count() AS evaluations\n"
        "FROM rule_evaluations FINAL\n"
        f"{where(IN_RANGE, TENANT, SPAN_RULES)}\n"
        "GROUP BY time, outcome\nORDER BY time, outcome"
    )
    return PanelSpec(
        title="Rule evaluations by outcome",
        kind="timeseries",
        sql=sql,
        fmt=FORMAT_TIME_SERIES,
        columns=("time", "outcome", "evaluations"),
        expect_sql=count_rows("rule_evaluations", SPAN_RULES),
        description="Stage-regression and canary evaluations per outcome. insufficient_traffic: even the "
        "largest span (max_span_windows) lacked samples, so the rule could not decide; silence from it "
        "means 'never looked'. ttft rules status shows the same per tenant and rule.",
        unit="short",
        field_config={"custom": {"drawStyle": "bars", "stacking": {"mode": "normal", "group": "A"}}},
    )


def undecided_series() -> PanelSpec:
    """The last evaluation of every regression/canary series in range that did not decide."""
    sql = (
        "SELECT tenant_id, rule, stage, version_id, outcome, span_windows, samples, last_window, last_decided\n"
        "FROM (\n"
        "  SELECT tenant_id, rule, stage, version_id, argMax(outcome, window_start) AS outcome,\n"
        "         argMax(span_windows, window_start) AS span_windows, argMax(samples, window_start) AS samples,\n"
        "         max(window_start) AS last_window, argMax(last_decided_at, window_start) AS last_decided\n"
        "  FROM rule_evaluations FINAL\n"
        f"  {where(IN_RANGE, TENANT, SPAN_RULES)}\n"
        "  GROUP BY tenant_id, rule, stage, version_id\n"
        ")\n"
        "WHERE outcome NOT IN ('ok', 'breach', 'hold')\n"
        "ORDER BY tenant_id, rule, stage, version_id"
    )
    expect = (
        "SELECT count() FROM (\n"
        "  SELECT argMax(outcome, window_start) AS outcome FROM rule_evaluations FINAL\n"
        f"  {where(IN_RANGE, SPAN_RULES)}\n"
        "  GROUP BY tenant_id, rule, stage, version_id\n"
        ") WHERE outcome NOT IN ('ok', 'breach', 'hold')"
    )
    return PanelSpec(
        title="Rules that cannot decide",
        kind="table",
        sql=sql,
        fmt=FORMAT_TABLE,
        columns=(
            "tenant_id",
            "rule",
            "stage",
            "version_id",
            "outcome",
            "span_windows",
            "samples",
            "last_window",
            "last_decided",
        ),
        expect_sql=expect,
        description="Series whose last evaluation in range did not decide, with the span and samples it had "
        "and when it last could decide (empty: never). A tenant undecidable for rules.undecidable."
        "after_windows gets a TTFTRuleUndecidable ticket.",
        unit="short",
        width=24,
    )


def rule_gates() -> PanelSpec:
    """The gates in force now (the latest row of each, active): not time-ranged, a gate is current state."""
    return PanelSpec(
        title="What keeps rules silent",
        kind="table",
        sql="SELECT gate, rule, scope, detail, since\nFROM rule_gates FINAL\nWHERE active\nORDER BY gate, rule, scope",
        fmt=FORMAT_TABLE,
        columns=("gate", "rule", "scope", "detail", "since"),
        expect_sql="SELECT count() FROM rule_gates FINAL WHERE active",
        description="Gates in force that keep a rule from paging, whatever the time range: paging_muted (alerts "
        "stored, never paged), rule_paused (rules.<rule>.enabled false), registered_only "
        "(TTFTTenantSilent watches only registered tenants: those configured and those steady for "
        "tenancy.steady_windows windows; the shared pool's tenants are not watched), quarantined (a source "
        "the join's dead-letter guard holds; its invalid events are not "
        "judged). Written by the writer at start and as quarantines change; ttft rules status shows the same.",
        unit="short",
        width=24,
        height=6,
    )
