"""The dashboards as small typed specs; :mod:`streams.grafana.render` turns them into Grafana's JSON model
with grafana-foundation-sdk.

A :class:`PanelSpec` is one panel: its SQL (with the plugin's macros and template variables), the
query format, and what the tests need to judge it: the columns it returns, a count query saying when it
must return rows, and, for percentile panels, how numpy recomputes each percentile from ``requests``.
Table columns get their unit from :func:`column_unit` (one per column, as a field override), links on
their cells from ``links``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

DATASOURCE_TYPE: Final = "grafana-clickhouse-datasource"
DATASOURCE_UID: Final = "ttft-clickhouse"
DATASOURCE: Final = {"type": DATASOURCE_TYPE, "uid": DATASOURCE_UID}
#: The plugin version the panel SQL and macros.py are written against; deploy/compose.yaml installs it.
PLUGIN_VERSION: Final = "4.20.0"
PLUGIN_NAME: Final = "ClickHouse"
#: ``__inputs`` name of the data source in the import files (a UI import asks for it).
DATASOURCE_INPUT: Final = "DS_TTFT_CLICKHOUSE"
FORMAT_TIME_SERIES: Final = 0
FORMAT_TABLE: Final = 1
#: Panels bucket by at least one event-time window; Grafana's interval is computed over this many points.
MIN_INTERVAL: Final = "1m"
MAX_DATA_POINTS: Final = 500
#: The time units Grafana formats as durations: a count or a share must never carry one.
TIME_UNITS: Final = frozenset(
    {"ns", "µs", "ms", "s", "m", "h", "d", "dtdurationms", "dtdurations", "dthms", "dtdhms", "timeticks", "clockms"}
)
#: Units of table columns: counts are exact numbers with separators, shares are percentages of 1.
COUNT_UNIT: Final = "locale"
SHARE_UNIT: Final = "percentunit"
#: Table columns by what they hold (the name decides; :func:`column_unit`).
COUNT_COLUMNS: Final = frozenset(
    {
        "requests",
        "attributed_windows",
        "negative_values",
        "n_canary",
        "n_stable",
        "min_samples",
        "span_windows",
        "samples",
        "repeats",
        "rerank_top_k",
    }
)
SHARE_COLUMNS: Final = frozenset({"slo_bad_share", "complete_share", "mix_coverage", "share_of_ttft"})
#: Plain numbers without a unit: ratios of two P95s and probabilities.
PLAIN_COLUMNS: Final = frozenset({"ratio", "naive_ratio", "ratio_threshold", "critical_ratio", "alpha", "tail_p"})
#: Columns that hold text, times, flags or arrays: no unit applies.
TEXT_COLUMNS: Final = frozenset(
    {
        "tenant_id",
        "version_id",
        "stage",
        "request_id",
        "trace_id",
        "started_at",
        "first_token_at",
        "recall_mode",
        "route",
        "status",
        "biggest_p95_stage",
        "tail_dominant_stage",
        "exemplar_request_ids",
        "window_start",
        "canary_version",
        "verdict",
        "reason",
        "naive_verdict",
        "mix_adjusted",
        "explanation",
        "first_seen",
        "last_seen",
        "rule",
        "outcome",
        "last_window",
        "last_decided",
        "attribute",
        "value",
        "tenant_key",
        "version_key",
        "canary_key",
        "gate",
        "scope",
        "detail",
        "since",
    }
)


def column_unit(column: str) -> str | None:
    """The unit of a table column: ``ms`` for durations (``p50``.., ``*_ms``), :data:`COUNT_UNIT` for counts,
    :data:`SHARE_UNIT` for shares, ``none`` for plain numbers, None for text and times. An unknown column is
    an error: a new column must be placed in one of the sets above."""
    if column in TEXT_COLUMNS:
        return None
    if column in COUNT_COLUMNS:
        return COUNT_UNIT
    if column in SHARE_COLUMNS:
        return SHARE_UNIT
    if column in PLAIN_COLUMNS:
        return "none"
    if column.endswith("_ms") or (len(column) == 3 and column[0] == "p" and column[1:].isdigit()):
        return "ms"
    raise ValueError(f"table column {column!r} has no unit: add it to streams/grafana/model.py's column sets")


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
class DataLink:
    """A link on the cells of one table column (a Grafana data link). ``url`` may hold ``${__value.raw}``,
    ``${__data.fields.<column>}`` (a column of the same row, hidden ones included), ``${__url_time_range}`` and
    dashboard variables (``${tenant:queryparam}``)."""

    title: str
    url: str
    target_blank: bool = False


@dataclass(frozen=True, slots=True)
class PanelSpec:
    """One panel. ``expect_sql`` counts the source rows that oblige the panel to return rows. ``links`` maps
    a column to the links on its cells; ``hidden`` columns are returned (links read them) but not shown."""

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
    links: Mapping[str, tuple[DataLink, ...]] = field(default_factory=dict)
    hidden: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class VariableSpec:
    """A multi-value query variable with *All* (the plugin runs ``sql`` through the same query path), or with
    ``kind="custom"`` a single-value variable whose options are ``sql``'s comma-separated values (no query),
    ``default`` selected, or with ``kind="textbox"`` a free text (``default`` until typed or linked)."""

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


def board_url(uid: str, slug: str) -> str:
    """The path of a dashboard in Grafana (``/d/<uid>/<slug>``)."""
    return f"/d/{uid}/{slug}"


def render(model: Mapping[str, Any]) -> str:
    """Stable JSON text for a committed file (sorted keys, two-space indent, trailing newline)."""
    return json.dumps(model, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def slugify(title: str) -> str:
    """``"TTFT P95 and P99 per tenant"`` -> ``"ttft-p95-and-p99-per-tenant"`` (test ids)."""
    out = "".join(c.lower() if c.isalnum() else "-" for c in title)
    return "-".join(part for part in out.split("-") if part)
