"""The SQL twin of :func:`streams.core.sketch.quantile_from_bins`, and the documented rollup query.

Given a merged bin map (e.g. ``sumMap(bins)``), a zero count (e.g. ``sum(zero_count)``), a level ``q`` and
the relative accuracy ``a``, the expression returns the same Float64 as Python, bit for bit:

- ``n = zero_count + sum(bins)``; NULL when ``n = 0``;
- ``rank = floor(q * (n - 1))`` (numpy ``method='lower'``); 0 when ``rank < zero_count``;
- else the first bin key ``k`` (ascending) whose cumulative count, plus the zero count, exceeds ``rank``,
  and its representative ``2 * gamma**k / (gamma + 1)`` with ``gamma = (1 + a) / (1 - a)``.

``gamma**k`` is computed by squaring with IEEE multiplications only, in the same order as Python's
``bin_value``: ClickHouse's ``pow`` and glibc's differ in the last bit for a few percent of keys, while
``+ - * /`` round identically everywhere. All subexpressions are bound once through one-element
``arrayMap`` lambdas, so an aggregate such as ``sumMap(bins)`` is written (and evaluated) once and never
ends up inside a lambda body.

Migration ``0004_functions.sql`` defines the same expression as the SQL UDF ``ttftSketchQuantile(bins,
zero_count, q, relative_accuracy)``, for dashboards and ad-hoc queries; a test pins the file to
:func:`quantile_sql`. ClickHouse ``quantile*`` functions are never used (see docs/rollups.md).
"""

from __future__ import annotations

from typing import Final

from streams.core.sketch import DEFAULT_RELATIVE_ACCURACY

UDF_NAME: Final = "ttftSketchQuantile"
UDF_PARAMS: Final = ("bins", "zero_count", "q", "relative_accuracy")
#: Bits of ``|k|`` the power by squaring covers; 32 covers every Int32 bin key.
POWER_BITS: Final = 32
LEVELS: Final = (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99))


def _literal(value: float | str) -> str:
    # repr() of a float round-trips, and ClickHouse parses decimal literals correctly rounded.
    return repr(float(value)) if isinstance(value, int | float) else f"({value})"


def _power(gamma: str, key: str) -> str:
    """``gamma ** key`` by squaring: (acc, power) folded over the bits of ``|key|``."""
    fold = (
        f"arrayFold((st_, bit_) -> (if(bitTest(abs({key}), bit_), st_.1 * st_.2, st_.1), st_.2 * st_.2), "
        f"range({POWER_BITS}), (toFloat64(1), {gamma})).1"
    )
    return f"if({key} >= 0, {fold}, 1 / {fold})"


def quantile_sql(
    bins: str, zero_count: str, q: float | str, relative_accuracy: float | str = DEFAULT_RELATIVE_ACCURACY
) -> str:
    """A ``Nullable(Float64)`` SQL expression equal to ``quantile_from_bins(bins, zero_count, q, a)``.

    ``bins`` and ``zero_count`` are SQL expressions (columns or aggregates); ``q`` and
    ``relative_accuracy`` are floats (inlined as literals) or SQL expressions.
    """
    key = "toInt64(ks_[arrayFirstIndex(c_ -> z_ + c_ > r_, arrayCumSum(arrayMap(x_ -> m_[x_], ks_)))])"
    value = f"2 * {_power('g_', 'k_')} / (g_ + 1)"
    pick = f"arrayMap(k_ -> {value}, [{key}])[1]"
    ranked = "arrayMap(r_ -> if(r_ < z_, toFloat64(0), " + pick + "), [toInt64(floor(q_ * (toFloat64(n_) - 1)))])[1]"
    per_sketch = (
        f"arrayMap((ks_, n_, g_) -> if(n_ = 0, NULL, {ranked}), "
        "[arraySort(mapKeys(m_))], [z_ + arraySum(mapValues(m_))], [(1 + a_) / (1 - a_)])[1]"
    )
    return (
        f"arrayMap((m_, z_, q_, a_) -> {per_sketch}, [{bins}], [toUInt64({zero_count})], "
        f"[toFloat64({_literal(q)})], [toFloat64({_literal(relative_accuracy)})])[1]"
    )


def quantile_udf_sql(
    bins: str, zero_count: str, q: float | str, relative_accuracy: float | str = DEFAULT_RELATIVE_ACCURACY
) -> str:
    """The same value through the UDF of migration 0004 (shorter SQL; needs the migration applied)."""
    return f"{UDF_NAME}({bins}, {zero_count}, {_literal(q)}, {_literal(relative_accuracy)})"


def udf_statement() -> str:
    """The ``CREATE FUNCTION`` statement of migration ``0004_functions.sql``."""
    body = quantile_sql(*UDF_PARAMS)
    return f"CREATE OR REPLACE FUNCTION {UDF_NAME} AS ({', '.join(UDF_PARAMS)}) -> {body}"


def rollup_sql(database: str, *, use_udf: bool = False) -> str:
    """Stage percentiles merged from stored bins over ``[{start}, {end})`` per tenant x version x stage.

    Server-side parameters: ``start`` and ``end`` (``DateTime64(3)``) and ``tenant`` (``String``, empty for
    all tenants). ``FINAL`` collapses recomputed window rows before ``sumMap`` adds them up. Output
    aliases differ from the column names on purpose: a ClickHouse alias is visible in the whole SELECT, so
    ``sumMap(bins) AS bins`` would nest the aggregate inside the quantile expressions.
    """
    quantile = quantile_udf_sql if use_udf else quantile_sql
    levels = ",\n       ".join(
        f"{quantile('sumMap(bins)', 'sum(zero_count)', q, 'any(relative_accuracy)')} AS {name}" for name, q in LEVELS
    )
    return (
        "SELECT tenant_id, version_id, stage, sum(count) AS requests,\n"
        f"       {levels},\n"
        "       max(max) AS max_ms, sum(slo_bad_count) AS slo_bad, sumMap(bins) AS merged_bins,\n"
        "       sum(zero_count) AS merged_zero_count, count() AS windows\n"
        f"FROM {database}.stage_windows FINAL\n"
        "WHERE window_start >= {start:DateTime64(3)} AND window_start < {end:DateTime64(3)}\n"
        "  AND ({tenant:String} = '' OR tenant_id = {tenant:String})\n"
        "GROUP BY tenant_id, version_id, stage\n"
        "ORDER BY tenant_id, version_id, stage"
    )
