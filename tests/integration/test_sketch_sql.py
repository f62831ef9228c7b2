from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client

from streams.core.rollup import rollup_rows
from streams.core.sketch import quantile_from_bins
from streams.core.windows import WindowAggregates, aggregate_windows
from streams.settings import Settings
from streams.store.sketch_sql import LEVELS, quantile_sql, quantile_udf_sql, rollup_sql
from tests.support.window_records import HOUR_START_MS, WINDOW_MS, synthetic_records

pytestmark = pytest.mark.clickhouse

TABLES = ("stage_windows", "stage_strata", "tail_attribution", "window_health", "llm_signals")
Q_LEVELS = (0.0, 0.01, 0.1, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0)


def _ts(ms: float) -> datetime:
    return datetime.fromtimestamp(ms / 1000.0, tz=UTC)


def _insert(client: Client, database: str, table: str, rows: Sequence[dict[str, Any]]) -> None:
    columns = list(rows[0])
    data = [[_ts(r[c]) if c == "window_start" else r[c] for c in columns] for r in rows]
    client.insert(table, data, column_names=columns, database=database, settings={"async_insert": 0})


def _insert_all(client: Client, database: str, windows: dict[int, WindowAggregates]) -> None:
    for table in TABLES:
        rows = [row for agg in windows.values() for row in getattr(agg, table)]
        _insert(client, database, table, rows)


@pytest.fixture(scope="module")
def hour() -> tuple[list[dict[str, Any]], dict[int, WindowAggregates]]:
    records = synthetic_records(100_000)
    return records, aggregate_windows(records, Settings())


def _random_sketches(count: int) -> list[tuple[dict[int, int], int]]:
    rng = random.Random(11)
    sketches: list[tuple[dict[int, int], int]] = [({}, 0), ({}, 7), ({0: 1}, 0), ({-400: 3, 1_100: 2}, 1)]
    for _ in range(count):
        low = rng.randint(-350, 700)
        bins = {rng.randint(low, low + 300): rng.randint(1, 10_000) for _ in range(rng.randint(1, 60))}
        sketches.append((bins, rng.choice([0, 0, 0, 1, 50])))
    return sketches


def test_sql_quantile_equals_python_on_many_sketches(ch_client: Client, ch_database: str) -> None:
    ch_client.command(
        f"CREATE TABLE {ch_database}.sketches (id UInt32, bins Map(Int32, UInt64), zero_count UInt64)"
        " ENGINE = MergeTree ORDER BY id"
    )
    sketches = _random_sketches(500)
    ch_client.insert(
        "sketches",
        [[i, bins, zeros] for i, (bins, zeros) in enumerate(sketches)],
        column_names=["id", "bins", "zero_count"],
        database=ch_database,
        settings={"async_insert": 0},
    )
    inline = ", ".join(quantile_sql("bins", "zero_count", q) for q in Q_LEVELS)
    udf = ", ".join(quantile_udf_sql("bins", "zero_count", q) for q in Q_LEVELS)
    result = ch_client.query(f"SELECT id, [{inline}], [{udf}] FROM {ch_database}.sketches ORDER BY id")
    assert len(result.result_rows) == len(sketches)
    mismatches = []
    for sketch_id, from_inline, from_udf in result.result_rows:
        bins, zeros = sketches[sketch_id]
        expected = [quantile_from_bins(bins, zeros, q) for q in Q_LEVELS]
        if list(from_inline) != expected or list(from_udf) != expected:
            mismatches.append((sketch_id, expected, from_inline, from_udf))
    assert mismatches == []


def test_hour_rollup_in_sql_equals_python(
    ch_client: Client, ch_database: str, hour: tuple[list[dict[str, Any]], dict[int, WindowAggregates]]
) -> None:
    _, windows = hour
    _insert_all(ch_client, ch_database, windows)
    python = rollup_rows(row for agg in windows.values() for row in agg.stage_windows)
    params = {"start": _ts(HOUR_START_MS), "end": _ts(HOUR_START_MS + 3_600_000), "tenant": ""}
    for use_udf in (False, True):
        result = ch_client.query(rollup_sql(ch_database, use_udf=use_udf), parameters=params)
        rows = {(r[0], r[1], r[2]): dict(zip(result.column_names, r, strict=True)) for r in result.result_rows}
        assert set(rows) == set(python)
        for key, rollup in python.items():
            sql = rows[key]
            assert sql["requests"] == rollup.count
            assert dict(sql["merged_bins"]) == rollup.bins
            assert sql["merged_zero_count"] == rollup.zero_count
            assert sql["max_ms"] == rollup.max
            assert sql["slo_bad"] == rollup.slo_bad_count
            assert sql["windows"] == rollup.windows == 60
            for name, q in LEVELS:
                assert sql[name] == rollup.quantile(q), (key, name, use_udf)


def test_recomputed_windows_replace_their_rows(
    ch_client: Client, ch_database: str, hour: tuple[list[dict[str, Any]], dict[int, WindowAggregates]]
) -> None:
    records, windows = hour
    _insert_all(ch_client, ch_database, windows)
    first_window = min(windows)
    late = [r for r in records if int(r["window_start"]) == first_window]
    late.append(late[0] | {"request_id": "late-1", "ttft_ms": 99_000.0, "late_events": 1})
    amended = aggregate_windows(late, Settings(), amendments=1)
    _insert_all(ch_client, ch_database, amended)
    _insert_all(ch_client, ch_database, amended)  # a replay of the recompute
    count = ch_client.query(
        f"SELECT sum(count) FROM {ch_database}.stage_windows FINAL WHERE stage = 'ttft'"
    ).result_rows[0][0]
    assert count == sum(r["count"] for agg in windows.values() for r in agg.stage_windows if r["stage"] == "ttft") + 1
    health = ch_client.query(
        f"SELECT sum(total), sum(amendments) FROM {ch_database}.window_health FINAL"
        " WHERE window_start = {start:DateTime64(3)}",
        parameters={"start": _ts(first_window)},
    ).result_rows[0]
    assert health == (len(late), len(amended[first_window].window_health))


def test_rolling_p95_from_stored_bins(
    ch_client: Client, ch_database: str, hour: tuple[list[dict[str, Any]], dict[int, WindowAggregates]]
) -> None:
    _, windows = hour
    _insert_all(ch_client, ch_database, windows)
    p95 = quantile_udf_sql("rolling_bins", "rolling_zeros", 0.95)
    result = ch_client.query(
        f"""
        SELECT window_start, {p95} AS rolling_p95
        FROM (
            SELECT window_start,
                   sumMap(bins) OVER w AS rolling_bins,
                   sum(zero_count) OVER w AS rolling_zeros
            FROM {ch_database}.stage_windows FINAL
            WHERE tenant_id = 'acme' AND version_id = 'v1' AND stage = 'ttft'
            WINDOW w AS (ORDER BY toUnixTimestamp(window_start) RANGE BETWEEN 840 PRECEDING AND CURRENT ROW)
        )
        ORDER BY window_start
        """
    )
    rows = [r for agg in windows.values() for r in agg.stage_windows if r["stage"] == "ttft"]
    rows = [r for r in rows if (r["tenant_id"], r["version_id"]) == ("acme", "v1")]
    assert len(result.result_rows) == len(rows) == 60
    for window_start, rolling in result.result_rows:
        end = int(window_start.timestamp() * 1000)
        span = [r for r in rows if end - 14 * WINDOW_MS <= r["window_start"] <= end]
        expected = rollup_rows(span, group_by=("stage",))[("ttft",)].quantile(0.95)
        assert rolling == expected
