"""SQL building blocks shared by the dashboards.

Tables are unqualified: the datasource's ``defaultDatabase`` (``TTFT_CLICKHOUSE_DATABASE``) picks them,
so the same dashboards serve any database name. ReplacingMergeTree tables are always read with
``FINAL``. Percentiles over any span are re-aggregated from the stored bins (``sumMap``) with the
project's one SQL quantile, inlined (:func:`streams.store.sketch_sql.quantile_sql`) so that panels need
neither the ``ttftSketchQuantile`` UDF on every server nor any privilege beyond ``SELECT``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from streams.settings import PARENT_STAGES, Settings
from streams.store.sketch_sql import quantile_sql

PARENTS: Final = PARENT_STAGES
BREAKDOWN_STAGES: Final = (*PARENT_STAGES, "other", "ttft")


def selected(column: str, variable: str) -> str:
    """``column`` is one of the values chosen in ``variable`` (a free-form id: tenant, version).

    Grafana's ``singlequote`` format escapes ``'`` but not ``\\``, so an id ending in a backslash breaks
    out of its quotes. Here no byte of an id ever reaches the SQL text: the variable's value is the hex of
    the id (:func:`hex_variable_sql`), and the selection is interpolated ``percentencode``d, whose output
    is only ``[A-Za-z0-9._~%-]`` whatever the value (even one typed into a URL); ClickHouse decodes it,
    splits the ``{a,b}`` list on commas (hex has none) and unhexes each item.
    """
    chosen = f"decodeURLComponent('${{{variable}:percentencode}}')"
    items = f"splitByChar(',', trim(BOTH '{{}}' FROM {chosen}))"
    return f"$__conditionalAll({column} IN (SELECT unhex(arrayJoin({items}))), ${variable})"


def hex_variable_sql(column: str, source: str) -> str:
    """A variable query: value = ``hex(column)`` (what :func:`selected` expects), text = the id itself.

    The plugin takes a two-column result as (value, text): its first column is the value.
    """
    return f"SELECT hex({column}) AS value, {column} AS text FROM (SELECT DISTINCT {column} {source}) ORDER BY text"


TENANT: Final = selected("tenant_id", "tenant")
VERSION: Final = selected("version_id", "version")
#: Stage names are ``[a-z][a-z0-9_]{0,47}`` (contract), so the plain quoted list cannot be broken out of.
STAGE: Final = "$__conditionalAll(stage IN (${stage:singlequote}), $stage)"
CANARY_VERSION: Final = selected("canary_version", "version")


def literal(text: str) -> str:
    """A ClickHouse string literal (backslash and quote escaped): tenant ids may hold any Unicode."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def string_array(items: Iterable[str]) -> str:
    return "[" + ", ".join(literal(i) for i in items) + "]"


def number(value: float) -> str:
    return repr(float(value))


def sketch_quantile(q: float) -> str:
    """The level-``q`` percentile of the group's merged sketch (aggregate expression)."""
    return quantile_sql("sumMap(bins)", "sum(zero_count)", q, "any(relative_accuracy)")


def percentiles(levels: Mapping[str, float]) -> str:
    """``<quantile> AS p95, ...`` for a SELECT list."""
    return ",\n       ".join(f"{sketch_quantile(q)} AS {name}" for name, q in levels.items())


def slo_expression(settings: Settings, column: str = "tenant_id") -> str:
    """Each tenant's TTFT SLO (ms), from ``tenants.<id>.slo_ms`` with ``default_slo_ms`` for the rest."""
    tenants = sorted(t for t, cfg in settings.tenants.items() if cfg.slo_ms is not None)
    default = number(settings.default_slo_ms)
    if not tenants:
        return f"toFloat64({default})"
    values = "[" + ", ".join(number(settings.slo_ms(t)) for t in tenants) + "]"
    # CAST: transform() over a LowCardinality column returns LowCardinality(Float64), which the plugin
    # does not plot.
    return f"transform(CAST({column} AS String), {string_array(tenants)}, {values}, {default})"


def where(*conditions: str) -> str:
    return "WHERE " + "\n  AND ".join(c for c in conditions if c)


def health_share(*filters: str) -> str:
    """Per-tenant completeness over the range, to join beside a number (``USING tenant_id``);
    ``slo_requests`` leaves out the ``no_first_chunk`` requests, whose TTFT is unknown (the SLO's total)."""
    return (
        "SELECT tenant_id, sum(complete) / sum(total) AS complete_share, sum(total) AS total_requests,\n"
        "       sum(total) - sum(no_first_chunk) AS slo_requests\n"
        "FROM window_health FINAL\n"
        f"{where('$__timeFilter(window_start)', *filters)}\n"
        "GROUP BY tenant_id"
    )


def stage_in(stages: Iterable[str]) -> str:
    return f"stage IN ({', '.join(literal(s) for s in stages)})"


def stage_order(column: str = "stage") -> str:
    """Order stages as the breakdown reads: parents, sub-stages, other, custom, ttft."""
    known = string_array(
        ("retrieval", "vector_recall", "bm25_recall", "rerank", "prompt_assemble", "llm_ttft", "other")
    )
    return f"if({column} = 'ttft', 100, if(has({known}, {column}), indexOf({known}, {column}), 50))"


def count_rows(table: str, *conditions: str, time_column: str = "window_start", final: bool = True) -> str:
    """Expectation query: how many source rows fall in the range (the panel must return rows iff > 0)."""
    return (
        f"SELECT count() FROM {table}{' FINAL' if final else ''}\n{where(f'$__timeFilter({time_column})', *conditions)}"
    )
