"""The stage drill-down's "What if" panel: TTFT's P95 over time as observed, and with ``$stage`` x ``$scale``.

Each stored complete request is replayed in SQL exactly as ``ttft whatif --scale STAGE=F`` replays it
(:mod:`streams.core.whatif`): the predicted TTFT is the observed one minus how much the stage's parent got
shorter, a sub-stage rolling up through retrieval's critical path (serial recall: both legs; parallel: the
longer one; then rerank), floored at the request's longest remaining parent stage and never lifted above
the observed TTFT. The P95 is the exact one of the requests in each interval: the element at sorted index
``floor(0.95 * (n - 1))`` (numpy's ``method='lower'``, the project's one definition), never ClickHouse's
``quantile``. Every lever stage selected in ``$stage`` is one series (*All*: all six), beside ``observed``.

``$scale`` is a custom variable; its value reaches SQL only ``percentencode``d inside quotes and parsed by
``toFloat64OrNull`` (so a crafted ``var-scale=`` URL can only make it NULL: then only ``observed`` is drawn).
"""

from __future__ import annotations

from typing import Final

from streams.core.whatif import RECALL_CODES, SERIAL_SLACK_MS
from streams.core.whatif_levers import LEVER_STAGES
from streams.grafana.model import FORMAT_TIME_SERIES, PanelSpec, VariableSpec, WhatIfCheck
from streams.grafana.sql import STAGE, TENANT, VERSION, count_rows, string_array, where

#: The factors offered by ``$scale`` (any other value may be typed into the URL); the first view: 20 % faster.
SCALES: Final = ("0.5", "0.7", "0.8", "0.9", "1.1", "1.25", "1.5", "2")
DEFAULT_SCALE: Final = "0.8"
OBSERVED: Final = "observed"
REPLAYABLE: Final = "status = 'complete' AND ttft_ms IS NOT NULL AND first_token_at IS NOT NULL"

#: Short names of the replayed columns inside the panel's SQL (none is a column of ``requests``).
_COLUMNS: Final = (
    ("t", "ttft_ms"),
    ("r", "retrieval_ms"),
    ("v", "vector_recall_ms"),
    ("b", "bm25_recall_ms"),
    ("k", "rerank_ms"),
    ("p", "prompt_assemble_ms"),
    ("l", "llm_ttft_ms"),
    ("mode", "recall_mode"),
)


def scale_variable() -> VariableSpec:
    return VariableSpec(
        "scale",
        "What-if scale",
        ",".join(SCALES),
        kind="custom",
        default=DEFAULT_SCALE,
    )


def serial_recall() -> str:
    """:func:`streams.core.whatif.serial_recall` in SQL (0/1)."""
    known = ", ".join(f"'{mode}'" for mode in RECALL_CODES)
    fits = f"v + b + ifNull(k, 0) <= r + {SERIAL_SLACK_MS!r}"
    return (
        f"ifNull(v IS NOT NULL AND b IS NOT NULL AND (ifNull(mode, '') = 'serial' OR "
        f"(ifNull(mode, '') NOT IN ({known}) AND {fits})), 0)"
    )


def _path(v: str, b: str, k: str) -> str:
    """Retrieval's critical path through its sub-stages (``_Stages._path``)."""
    return f"(if(serial, ifNull({v}, 0) + ifNull({b}, 0), greatest(ifNull({v}, 0), ifNull({b}, 0))) + ifNull({k}, 0))"


def _scaled(column: str, stage: str) -> str:
    return f"if(lever = '{stage}', {column} * f, {column})"


def predicted_ttft() -> str:
    """The replayed TTFT of one request with ``lever`` scaled by ``f`` (``_Stages`` of :mod:`.whatif`)."""
    after = _path(_scaled("v", "vector_recall"), _scaled("b", "bm25_recall"), _scaled("k", "rerank"))
    change = f"({_path('v', 'b', 'k')} - {after})"
    subs = string_array(("vector_recall", "bm25_recall", "rerank"))
    rolled_up = f"if({change} = 0, r, greatest(r - {change}, 0))"
    r_after = f"multiIf(lever = 'retrieval', r * f, has({subs}, lever), {rolled_up}, r)"
    p_after, l_after = _scaled("p", "prompt_assemble"), _scaled("l", "llm_ttft")
    reduction = (
        f"(ifNull(r, 0) - ifNull({r_after}, 0)) + (ifNull(p, 0) - ifNull({p_after}, 0)) "
        f"+ (ifNull(l, 0) - ifNull({l_after}, 0))"
    )
    longest = f"greatest(0, ifNull({r_after}, 0), ifNull({p_after}, 0), ifNull({l_after}, 0))"
    return f"greatest(assumeNotNull(t) - ({reduction}), least(assumeNotNull(t), {longest}))"


def whatif_panel() -> PanelSpec:
    columns = ", ".join(f"{column} AS {alias}" for alias, column in _COLUMNS)
    stages = string_array(LEVER_STAGES)
    chosen = f"arrayFilter(stage -> {STAGE}, {stages})"
    p95 = "arrayElement(arraySort(groupArray(ttft)), toUInt64(floor(0.95 * (count() - 1))) + 1)"
    sql = (
        f"SELECT time, series, {p95} AS ttft_p95\n"
        "FROM (\n"
        "  SELECT $__timeInterval(window_start) AS time,\n"
        f"         if(lever = '', '{OBSERVED}', concat(lever, ' x', toString(f))) AS series,\n"
        f"         if(lever = '', assumeNotNull(t), {predicted_ttft()}) AS ttft\n"
        "  FROM (\n"
        f"    SELECT window_start, {columns},\n"
        "           toFloat64OrNull('${scale:percentencode}') AS f,\n"
        f"           {serial_recall()} AS serial\n"
        "    FROM requests FINAL\n"
        f"    {where('$__timeFilter(window_start)', REPLAYABLE, TENANT, VERSION)}\n"
        "  )\n"
        f"  ARRAY JOIN arrayConcat([''], if(ifNull(isFinite(f) AND f >= 0, 0), {chosen}, [])) AS lever\n"
        ")\n"
        "GROUP BY time, series\nORDER BY time, series"
    )
    return PanelSpec(
        title="What if: TTFT P95 with $stage x$scale",
        kind="timeseries",
        sql=sql,
        fmt=FORMAT_TIME_SERIES,
        columns=("time", "series", "ttft_p95"),
        expect_sql=count_rows("requests", REPLAYABLE),
        description="TTFT's exact P95 per interval as observed, and replayed request by request with each "
        "selected stage taking $scale times as long (ttft whatif --scale STAGE=F): what a fix of that stage "
        "would do to TTFT's P95, which the stage's own P95 does not say. Sub-stages roll up through "
        "retrieval's critical path. Stages without a lever (ttft, other, custom) draw nothing.",
        check=None,
        whatif=WhatIfCheck(quantile=0.95, column="ttft_p95", series_column="series", observed=OBSERVED),
        width=24,
    )
