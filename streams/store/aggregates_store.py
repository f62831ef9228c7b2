"""Window aggregates in ClickHouse: ``stage_windows``, ``stage_strata``, ``tail_attribution``,
``window_health`` and ``llm_signals`` (migration 0003).

Rows come from :func:`streams.core.windows.aggregate_window`. Every table is a ReplacingMergeTree keyed
by the window key, so writing a window again (late record, replay, restart) replaces its rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from clickhouse_connect.driver.client import Client

from streams.store.client import check_identifier
from streams.store.requests_store import SYNC_INSERT, final_read_settings

AGGREGATE_TABLES: tuple[str, ...] = (
    "stage_windows",
    "stage_strata",
    "tail_attribution",
    "window_health",
    "llm_signals",
)
_TIME_COLUMNS = frozenset({"window_start"})
_columns_cache: dict[tuple[int, str, str], list[str]] = {}


def table_columns(client: Client, database: str, table: str) -> list[str]:
    """Column names of a table, in order (cached per client)."""
    key = (id(client), database, table)
    cols = _columns_cache.get(key)
    if cols is None:
        result = client.query(
            "SELECT name FROM system.columns WHERE database = {db:String} AND table = {t:String} ORDER BY position",
            parameters={"db": database, "t": table},
        )
        cols = [str(r[0]) for r in result.result_rows]
        _columns_cache[key] = cols
    return cols


def _cell(column: str, value: Any) -> Any:
    if column in _TIME_COLUMNS and isinstance(value, int | float):
        return round(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value


def insert_rows(client: Client, database: str, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert aggregate rows (dicts keyed by column name; missing columns take their defaults)."""
    if not rows:
        return
    db = check_identifier(database)
    columns = [c for c in table_columns(client, db, table) if c in rows[0]]
    data = [[_cell(c, row.get(c)) for c in columns] for row in rows]
    client.insert(table, data, column_names=columns, database=db, settings=SYNC_INSERT)


def insert_window_aggregates(client: Client, database: str, tables: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
    """Insert every table's rows of one or more windows."""
    for table in AGGREGATE_TABLES:
        insert_rows(client, database, table, tables.get(table, ()))


def stored_window_fingerprints(client: Client, database: str, since_ms: float) -> dict[int, tuple[int, int]]:
    """Per window since ``since_ms``: (record count, sum of record versions) as last aggregated."""
    result = client.query(
        f"SELECT toUnixTimestamp64Milli(window_start) AS ws, sum(total), sum(computed_version) "
        f"FROM {check_identifier(database)}.window_health FINAL "
        "WHERE window_start >= fromUnixTimestamp64Milli({since:Int64}) GROUP BY ws",
        parameters={"since": int(since_ms)},
    )
    return {int(r[0]): (int(r[1]), int(r[2])) for r in result.result_rows}


def request_window_fingerprints(client: Client, database: str, since_ms: float) -> dict[int, tuple[int, int]]:
    """Per window since ``since_ms`` in ``requests FINAL``: (record count, sum of record versions)."""
    result = client.query(
        f"SELECT toUnixTimestamp64Milli(window_start) AS ws, count(), sum(record_version) "
        f"FROM {check_identifier(database)}.requests FINAL "
        "WHERE window_start >= fromUnixTimestamp64Milli({since:Int64}) GROUP BY ws",
        parameters={"since": int(since_ms)},
        settings=final_read_settings(client),
    )
    return {int(r[0]): (int(r[1]), int(r[2])) for r in result.result_rows}


def window_fingerprint(client: Client, database: str, window_start_ms: float) -> tuple[int, int]:
    """One window of ``requests FINAL``: (record count, sum of record versions)."""
    result = client.query(
        f"SELECT count(), sum(record_version) FROM {check_identifier(database)}.requests FINAL "
        "WHERE window_start = fromUnixTimestamp64Milli({ws:Int64})",
        parameters={"ws": int(window_start_ms)},
        settings=final_read_settings(client),
    )
    count, versions = result.result_rows[0]
    return int(count), int(versions or 0)


def record_writer_progress(client: Client, database: str, progress: Mapping[int, float], writer_id: str) -> None:
    """This writer's progress (event time, ms) on the ``ttft.requests`` partitions it owns."""
    rows = [[int(p), float(ms), writer_id] for p, ms in sorted(progress.items())]
    if rows:
        client.insert(
            "writer_progress",
            rows,
            column_names=["requests_partition", "progress_ms", "writer_id"],
            database=check_identifier(database),
            settings=SYNC_INSERT,
        )


def writer_progress(client: Client, database: str) -> dict[int, float]:
    """The latest progress recorded for each ``ttft.requests`` partition (by any writer)."""
    result = client.query(
        f"SELECT requests_partition, argMax(progress_ms, updated_at) "
        f"FROM {check_identifier(database)}.writer_progress GROUP BY requests_partition"
    )
    return {int(p): float(ms) for p, ms in result.result_rows}


def stored_window_series(client: Client, database: str, window_start_ms: float) -> list[tuple[str, str]]:
    """The (tenant, version) series already stored for one window: the series cap keeps their slots, so
    a re-aggregation never displaces a row that is already written (it would then count twice)."""
    result = client.query(
        f"SELECT DISTINCT tenant_id, version_id FROM {check_identifier(database)}.window_health FINAL "
        "WHERE window_start = fromUnixTimestamp64Milli({ws:Int64}) AND version_id != '__other__'",
        parameters={"ws": int(window_start_ms)},
    )
    return [(str(t), str(v)) for t, v in result.result_rows]


def latest_window_start(client: Client, database: str) -> int | None:
    result = client.query(
        f"SELECT toUnixTimestamp64Milli(max(window_start)), count() FROM {check_identifier(database)}.requests"
    )
    row = result.result_rows[0]
    return int(row[0]) if row[1] else None


def dead_letter_counts(client: Client, database: str, start_ms: float, end_ms: float) -> dict[str, int]:
    """Dead letters per tenant (``unknown`` when unreadable) by Kafka timestamp within a window."""
    result = client.query(
        f"SELECT ifNull(tenant_id, 'unknown') AS t, count() FROM {check_identifier(database)}.dead_letters FINAL "
        "WHERE kafka_timestamp >= fromUnixTimestamp64Milli({s:Int64}) "
        "AND kafka_timestamp < fromUnixTimestamp64Milli({e:Int64}) GROUP BY t",
        parameters={"s": int(start_ms), "e": int(end_ms)},
    )
    return {str(r[0]): int(r[1]) for r in result.result_rows}


_SNAPSHOT_TABLES: tuple[str, ...] = (
    "stage_windows",
    "stage_strata",
    "window_health",
    "llm_signals",
    "tail_attribution",
)


def fetch_window_rows(client: Client, database: str, since_ms: float, until_ms: float) -> dict[int, Any]:
    """Stored aggregate rows per window in ``[since_ms, until_ms)`` as rule-engine snapshots.

    Returns ``{window_start_ms: WindowSnapshot}``; the arms come from the records' ``rollout``.
    """
    from streams.rules import WindowSnapshot

    db = check_identifier(database)
    params = {"s": int(since_ms), "e": int(until_ms)}
    where = (
        "WHERE window_start >= fromUnixTimestamp64Milli({s:Int64}) "
        "AND window_start < fromUnixTimestamp64Milli({e:Int64})"
    )
    per_table: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for table in _SNAPSHOT_TABLES:
        cols = [c for c in table_columns(client, db, table) if c != "window_start"]
        result = client.query(
            f"SELECT toUnixTimestamp64Milli(window_start) AS ws_ms, {', '.join(cols)} FROM {db}.{table} FINAL "
            f"{where} ORDER BY ws_ms",
            parameters=params,
        )
        by_window: dict[int, list[dict[str, Any]]] = {}
        for row in result.result_rows:
            ws = int(row[0])
            values = dict(zip(cols, row[1:], strict=True))
            values["window_start"] = ws
            by_window.setdefault(ws, []).append(values)
        per_table[table] = by_window
    arms_rows = client.query(
        f"SELECT toUnixTimestamp64Milli(window_start) AS ws_ms, tenant_id, version_id, rollout, count() "
        f"FROM {db}.requests FINAL {where} AND rollout IS NOT NULL GROUP BY ws_ms, tenant_id, version_id, rollout",
        parameters=params,
        settings=final_read_settings(client),
    ).result_rows
    votes: dict[int, dict[tuple[str, str], dict[str, int]]] = {}
    for ws, tenant, version, rollout, n in arms_rows:
        votes.setdefault(int(ws), {}).setdefault((str(tenant), str(version)), {})[str(rollout)] = int(n)
    windows = set().union(*(set(t) for t in per_table.values()))
    out: dict[int, Any] = {}
    for ws in sorted(windows):
        arms: dict[tuple[str, str], Any] = {
            k: max(v, key=lambda arm: (v[arm], arm)) for k, v in votes.get(ws, {}).items()
        }
        out[ws] = WindowSnapshot(
            stage_windows=per_table["stage_windows"].get(ws, []),
            stage_strata=per_table["stage_strata"].get(ws, []),
            window_health=per_table["window_health"].get(ws, []),
            llm_signals=per_table["llm_signals"].get(ws, []),
            arms=arms,
            tail_attribution=per_table["tail_attribution"].get(ws, []),
        )
    return out


def stored_alert_keys(client: Client, database: str, since_ms: float) -> set[tuple[str, str, int]]:
    """(fingerprint, state, event_at ms) of the stored alert transitions since ``since_ms``."""
    result = client.query(
        f"SELECT fingerprint, state, toUnixTimestamp64Milli(event_at) FROM {check_identifier(database)}.alerts "
        "WHERE event_at >= fromUnixTimestamp64Milli({s:Int64})",
        parameters={"s": int(since_ms)},
    )
    return {(str(r[0]), str(r[1]), int(r[2])) for r in result.result_rows}
