"""Dashboard JSON for the ``grafana-clickhouse-datasource`` plugin, from small typed panel specs.

A :class:`PanelSpec` is one panel: its SQL (with the plugin's macros and template variables), the
query format, and what the tests need to judge it: the columns it returns, a count query saying when it
must return rows, and, for percentile panels, how numpy recomputes each percentile from ``requests``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

DATASOURCE_TYPE: Final = "grafana-clickhouse-datasource"
DATASOURCE_UID: Final = "ttft-clickhouse"
DATASOURCE: Final = {"type": DATASOURCE_TYPE, "uid": DATASOURCE_UID}
PLUGIN_VERSION: Final = "4.20.0"
FORMAT_TIME_SERIES: Final = 0
FORMAT_TABLE: Final = 1
#: Panels bucket by at least one event-time window; Grafana's interval is computed over this many points.
MIN_INTERVAL: Final = "1m"
MAX_DATA_POINTS: Final = 500
SCHEMA_VERSION: Final = 39
GRID_WIDTH: Final = 24


@dataclass(frozen=True, slots=True)
class PercentileCheck:
    """How numpy recomputes a panel's percentile columns from ``requests`` (``method='lower'``).

    ``stage`` names the value (a stage, ``ttft``, ``other`` or ``draft_accept_rate``), or ``stage_column``
    names the result column that holds it. ``group`` are the result's label columns (besides ``time``
    when ``by_time``); ``columns`` maps a result column to its level. ``stages`` restricts the stages the
    panel selects (empty: all). ``argmax_over``: the row's stage must have the largest P95 among ``stages``.
    """

    columns: Mapping[str, float]
    group: tuple[str, ...] = ()
    stage: str | None = None
    stage_column: str | None = None
    by_time: bool = False
    stages: tuple[str, ...] = ()
    argmax_over: bool = False


@dataclass(frozen=True, slots=True)
class WhatIfCheck:
    """How a what-if panel is checked: each row's ``column`` (the ``quantile`` of TTFT) equals the pure replay
    (:mod:`streams.core.whatif`) of the interval's requests with the series' stage scaled by ``$scale``, or
    their observed TTFT for the ``observed`` series; ``series_column`` holds ``observed`` or ``<stage> x<F>``."""

    quantile: float
    column: str
    series_column: str
    observed: str


@dataclass(frozen=True, slots=True)
class PanelSpec:
    """One panel. ``expect_sql`` counts the source rows that oblige the panel to return rows."""

    title: str
    kind: str
    sql: str
    fmt: int
    columns: tuple[str, ...]
    expect_sql: str
    description: str = ""
    unit: str = "ms"
    width: int = 12
    height: int = 8
    check: PercentileCheck | None = None
    whatif: WhatIfCheck | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    field_config: Mapping[str, Any] = field(default_factory=dict)
    overrides: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class VariableSpec:
    """A multi-value query variable with *All* (the plugin runs ``sql`` through the same query path), or with
    ``kind="custom"`` a single-value variable whose options are ``sql``'s comma-separated values (no query),
    ``default`` selected."""

    name: str
    label: str
    sql: str
    kind: str = "query"
    default: str = ""


@dataclass(frozen=True, slots=True)
class AnnotationSpec:
    """An annotation query returning ``time``, ``text`` and ``tags``."""

    name: str
    sql: str
    color: str = "purple"


@dataclass(frozen=True, slots=True)
class DashboardSpec:
    """One dashboard: ``slug`` names the JSON file (``dashboards/<slug>.json``) and the tests."""

    uid: str
    slug: str
    title: str
    description: str
    variables: tuple[VariableSpec, ...]
    panels: tuple[PanelSpec, ...]
    annotations: tuple[AnnotationSpec, ...] = ()


def _target(sql: str, fmt: int, ref_id: str = "A") -> dict[str, Any]:
    return {
        "refId": ref_id,
        "datasource": dict(DATASOURCE),
        "editorType": "sql",
        "format": fmt,
        "queryType": "timeseries" if fmt == FORMAT_TIME_SERIES else "table",
        "pluginVersion": PLUGIN_VERSION,
        "rawSql": sql,
    }


def _legend() -> dict[str, Any]:
    # Only order statistics in legends: a mean or sum of percentiles is not a percentile.
    return {
        "showLegend": True,
        "displayMode": "table",
        "placement": "bottom",
        "calcs": ["lastNotNull", "max"],
    }


def _panel_json(spec: PanelSpec, panel_id: int, grid: dict[str, int]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    custom: dict[str, Any] = {}
    if spec.kind == "timeseries":
        options = {"legend": _legend(), "tooltip": {"mode": "multi", "sort": "desc"}}
        custom = {"drawStyle": "line", "lineWidth": 1, "spanNulls": False, "showPoints": "never"}
    elif spec.kind == "table":
        options = {"showHeader": True, "cellHeight": "sm", "footer": {"show": False}}
    options.update(spec.options)
    defaults: dict[str, Any] = {"unit": spec.unit, "custom": custom}
    defaults.update(spec.field_config)
    return {
        "id": panel_id,
        "type": spec.kind,
        "title": spec.title,
        "description": spec.description,
        "datasource": dict(DATASOURCE),
        "gridPos": grid,
        "interval": MIN_INTERVAL,
        "maxDataPoints": MAX_DATA_POINTS,
        "targets": [_target(spec.sql, spec.fmt)],
        "fieldConfig": {"defaults": defaults, "overrides": [dict(o) for o in spec.overrides]},
        "options": options,
    }


def _variable_json(spec: VariableSpec) -> dict[str, Any]:
    if spec.kind == "custom":
        values = spec.sql.split(",")
        return {
            "name": spec.name,
            "label": spec.label,
            "type": "custom",
            "query": spec.sql,
            "multi": False,
            "includeAll": False,
            "current": {"selected": True, "text": spec.default, "value": spec.default},
            "options": [{"selected": v == spec.default, "text": v, "value": v} for v in values],
            "hide": 0,
        }
    return {
        "name": spec.name,
        "label": spec.label,
        "type": "query",
        "datasource": dict(DATASOURCE),
        "query": spec.sql,
        "definition": spec.sql,
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "sort": 1,
        "hide": 0,
    }


def _annotation_json(spec: AnnotationSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "datasource": dict(DATASOURCE),
        "enable": True,
        "hide": False,
        "iconColor": spec.color,
        "target": _target(spec.sql, FORMAT_TABLE, "Anno"),
    }


def _layout(panels: Sequence[PanelSpec]) -> list[dict[str, int]]:
    grids: list[dict[str, int]] = []
    x = y = row_height = 0
    for spec in panels:
        if x + spec.width > GRID_WIDTH:
            x, y, row_height = 0, y + row_height, 0
        grids.append({"x": x, "y": y, "w": spec.width, "h": spec.height})
        x += spec.width
        row_height = max(row_height, spec.height)
    return grids


def dashboard_json(spec: DashboardSpec) -> dict[str, Any]:
    """The dashboard model Grafana provisions from ``dashboards/<slug>.json`` (``id`` null, stable uid)."""
    builtin = {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }
    return {
        "id": None,
        "uid": spec.uid,
        "title": spec.title,
        "description": spec.description,
        "tags": ["ttft"],
        "timezone": "utc",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "refresh": "1m",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [_variable_json(v) for v in spec.variables]},
        "annotations": {"list": [builtin, *(_annotation_json(a) for a in spec.annotations)]},
        "panels": [
            _panel_json(p, i + 1, grid)
            for i, (p, grid) in enumerate(zip(spec.panels, _layout(spec.panels), strict=True))
        ],
    }


def render(model: Mapping[str, Any]) -> str:
    """Stable JSON text for a committed file (sorted keys, two-space indent, trailing newline)."""
    return json.dumps(model, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def slugify(title: str) -> str:
    """``"TTFT P95 and P99 per tenant"`` -> ``"ttft-p95-and-p99-per-tenant"`` (test ids)."""
    out = "".join(c.lower() if c.isalnum() else "-" for c in title)
    return "-".join(part for part in out.split("-") if part)
