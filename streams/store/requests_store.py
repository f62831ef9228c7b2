"""Joined request records in ``{database}.requests``: batched inserts, amendments and reads.

Records are plain dicts with the fields of :class:`schemas.records.RequestRecord` (times in epoch ms as
floats). In ClickHouse the three time fields are ``DateTime64(3, 'UTC')``, so they are stored rounded to
the millisecond. Every write is a synchronous native insert: when it returns, the rows are durable, so a
caller may acknowledge the Kafka offsets they came from.

Idempotency (see migrations 0001 and 0008): the table keeps, per ``(tenant_id, request_id)``, the row with the highest
``record_version``. Re-inserting the same records, or older partial versions of them, changes nothing
after ``FINAL``; every read here uses ``FINAL``.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson
from clickhouse_connect.driver.client import Client

from schemas.records import RequestRecord
from streams.store.client import check_identifier
from streams.store.reject import isolate

#: (stored, amendment) -> merged record; streams.core.join.merge_records with the window bound.
MergeFn = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]

RECORD_FIELDS: tuple[str, ...] = tuple(RequestRecord.model_fields)
TIME_FIELDS: frozenset[str] = frozenset({"started_at", "first_token_at", "window_start"})
#: Columns of the table that are not record fields.
_AMENDMENT_IDS = "amendment_ids"
INSERT_COLUMNS: tuple[str, ...] = (*RECORD_FIELDS, _AMENDMENT_IDS)
#: Forces a synchronous insert on a server whose profile enables async inserts (chDB ignores them).
SYNC_INSERT: dict[str, Any] = {"async_insert": 0, "wait_for_async_insert": 1}
_FETCH_CHUNK = 5_000
#: Record fields stored as ``Array`` columns.
_ARRAY_FIELDS = frozenset({"missing_stages", "event_keys"})


def _select_list() -> str:
    # Distinct aliases: an alias named like its column would shadow the column in WHERE clauses.
    cols = [f"toUnixTimestamp64Milli({c}) AS {c}_ms" if c in TIME_FIELDS else c for c in INSERT_COLUMNS]
    return ", ".join(cols)


_SELECT = _select_list()


# Optional scalar fields and their defaults; the collection fields are handled by name in _row.
_DEFAULTS: dict[str, Any] = {
    name: field.default
    for name, field in RequestRecord.model_fields.items()
    if not field.is_required() and field.default_factory is None
}


def _ms_to_ticks(value: Any) -> int | None:
    # clickhouse-connect writes an int into DateTime64(3) as raw milliseconds: exact, no float datetime.
    return None if value is None else round(value)


def _row(record: dict[str, Any], amendment_ids: Sequence[str] = ()) -> list[Any]:
    row: list[Any] = []
    for name in RECORD_FIELDS:
        if name in TIME_FIELDS:
            row.append(_ms_to_ticks(record.get(name)))
        elif name in _ARRAY_FIELDS:
            row.append(list(record.get(name) or ()))
        elif name in ("custom_stages", "stage_repeats"):
            row.append(dict(record.get(name) or {}))
        elif name in _DEFAULTS:
            row.append(record.get(name, _DEFAULTS[name]))
        else:
            row.append(record[name])  # a required field: a KeyError names it
    row.append(list(amendment_ids))
    return row


def _record(row: Sequence[Any]) -> tuple[dict[str, Any], list[str]]:
    values = dict(zip(INSERT_COLUMNS, row, strict=True))
    amendment_ids = list(values.pop(_AMENDMENT_IDS))
    for name in TIME_FIELDS:
        if values[name] is not None:
            values[name] = float(values[name])
    values["missing_stages"] = list(values["missing_stages"])
    values["event_keys"] = [int(k) for k in values["event_keys"]]
    values["custom_stages"] = {str(k): float(v) for k, v in values["custom_stages"].items()}
    values["stage_repeats"] = {str(k): int(v) for k, v in values["stage_repeats"].items()}
    values["amend"] = bool(values["amend"])
    return values, amendment_ids


def store_form(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` as a ``FINAL`` read returns it after an insert (times rounded to the millisecond, optional
    fields defaulted), without the store: what the writer's own copy of a window must equal."""
    return _record(_row(record))[0]


_ALL_FIELDS = operator.itemgetter(*RECORD_FIELDS)
_TIME_COLUMNS = tuple(i for i, name in enumerate(RECORD_FIELDS) if name in TIME_FIELDS)
_ARRAY_COLUMNS = tuple(i for i, name in enumerate(RECORD_FIELDS) if name in _ARRAY_FIELDS)
_MAP_COLUMNS = tuple(i for i, name in enumerate(RECORD_FIELDS) if name in ("custom_stages", "stage_repeats"))


def _columns(
    records: Sequence[dict[str, Any]], amendment_ids: Sequence[Sequence[str]] | None = None
) -> list[list[Any]]:
    """The insert's columns (``INSERT_COLUMNS`` order): the values :func:`_row` gives, built one column at a
    time. A batch then allocates a list per column, not a list per row plus copies of every row's
    collections; the store serialises columns anyway, so it need not transpose rows either.

    Records as the join emits them carry every field: they are read in one C call each and transposed by
    ``zip``, and only the time and collection columns are converted. A record lacking a field (optional
    ones default, as in :func:`_row`) sends the batch through the field-by-field path."""
    try:
        columns = [list(column) for column in zip(*map(_ALL_FIELDS, records), strict=True)]
    except KeyError:
        columns = _columns_by_field(records)
    else:
        if not columns:
            columns = [[] for _ in RECORD_FIELDS]
        for i in _TIME_COLUMNS:
            columns[i] = [None if v is None else round(v) for v in columns[i]]
        for i in _ARRAY_COLUMNS:
            columns[i] = [v if type(v) is list else list(v or ()) for v in columns[i]]
        for i in _MAP_COLUMNS:
            columns[i] = [v if type(v) is dict else dict(v or {}) for v in columns[i]]
    columns.append([list(ids) for ids in amendment_ids] if amendment_ids is not None else [[] for _ in records])
    return columns


def _columns_by_field(records: Sequence[dict[str, Any]]) -> list[list[Any]]:
    """The record columns of :func:`_columns` for records that may lack optional fields."""
    columns: list[list[Any]] = []
    for name in RECORD_FIELDS:
        if name in TIME_FIELDS:
            columns.append([None if (v := r.get(name)) is None else round(v) for r in records])
        elif name in _ARRAY_FIELDS:
            columns.append([v if type(v := r.get(name)) is list else list(v or ()) for r in records])
        elif name in ("custom_stages", "stage_repeats"):
            columns.append([v if type(v := r.get(name)) is dict else dict(v or {}) for r in records])
        elif name in _DEFAULTS:
            default = _DEFAULTS[name]
            columns.append([r.get(name, default) for r in records])
        else:
            columns.append([r[name] for r in records])  # a required field: a KeyError names it
    return columns


def _insert_columns(client: Client, database: str, columns: list[list[Any]]) -> None:
    if not columns[0]:
        return
    client.insert(
        "requests",
        columns,
        column_names=list(INSERT_COLUMNS),
        database=check_identifier(database),
        column_oriented=True,
        settings=SYNC_INSERT,
    )


def insert_requests(client: Client, database: str, records: Sequence[dict[str, Any]]) -> None:
    """Insert request records in one synchronous batch. Idempotent per ``(tenant_id, request_id)``.

    Records flagged ``amend`` belong to :func:`apply_amendments`.
    """
    _insert_columns(client, database, _columns(records))


def amendment_id(amendment: dict[str, Any]) -> str:
    """Stable identity of an amendment record: a replayed amendment has the same id and merges once."""
    return hashlib.sha256(orjson.dumps(amendment, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


def apply_amendments(
    client: Client,
    database: str,
    amend_records: Sequence[dict[str, Any]],
    merge_fn: MergeFn,
) -> list[dict[str, Any]]:
    """Merge late-event amendments into the stored records, insert the merged rows and return them.

    ``merge_fn(stored, amendment)`` is e.g. ``lambda s, a: merge_records(s, a, window_ms)``. Stored rows are
    read with ``FINAL``; several amendments of one request fold in input order. An amendment already merged
    into the stored row (same :func:`amendment_id`, e.g. after a replay) is skipped. An amendment whose
    request is not stored is inserted as it is, with ``amend`` true, so its events stay visible (a later full
    record of that request replaces it). Insert the batch's full records first, so an amendment of a
    request emitted earlier in the same batch finds its row.
    """
    if not amend_records:
        return []
    stored = _fetch_with_ids(client, database, {request_key(r) for r in amend_records})
    merged: dict[RequestKey, tuple[dict[str, Any], list[str]]] = {}
    for amendment in amend_records:
        key = request_key(amendment)  # another tenant's row with the same id is never touched
        ident = amendment_id(amendment)
        current = merged.get(key) or stored.get(key)
        if current is None:
            merged[key] = ({**amendment, "amend": True}, [ident])
            continue
        record, ids = current
        if ident in ids:
            continue
        result = merge_fn(record, amendment)
        merged[key] = ({**result, "amend": bool(record.get("amend"))}, [*ids, ident])
    _insert_columns(client, database, _columns([r for r, _ in merged.values()], [ids for _, ids in merged.values()]))
    return [record for record, _ in merged.values()]


def insert_requests_checked(
    client: Client, database: str, records: Sequence[dict[str, Any]]
) -> list[tuple[dict[str, Any], str]]:
    """:func:`insert_requests`, storing every row the store accepts; returns the refused records with the
    reason (a value the columns cannot hold: :mod:`streams.store.reject`). Infrastructure errors raise."""
    _, refused = isolate(lambda part: insert_requests(client, database, part), records)
    return refused


def apply_amendments_checked(
    client: Client, database: str, amend_records: Sequence[dict[str, Any]], merge_fn: MergeFn
) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], str]]]:
    """:func:`apply_amendments` with refused amendments isolated: (merged records, refused amendments)."""
    return isolate(lambda part: apply_amendments(client, database, part, merge_fn), amend_records)


def final_read_settings(client: Client) -> dict[str, Any]:
    """Per-query settings that keep skip indexes correct under ``FINAL``.

    Pruning granules by a skip index before FINAL can drop a row's newest version and resurrect an older
    one in another window; exact mode prevents that. A server without exact mode reads without the
    indexes instead (slower, never wrong).
    """
    if "use_skip_indexes_if_final_exact_mode" in client.server_settings:
        return {"use_skip_indexes_if_final_exact_mode": 1}
    return {"use_skip_indexes_if_final": 0}


def _query_records(client: Client, sql: str, parameters: dict[str, Any]) -> list[tuple[dict[str, Any], list[str]]]:
    result = client.query(sql, parameters=parameters, settings=final_read_settings(client))
    return [_record(row) for row in result.result_rows]


RequestKey = tuple[str, str]


def request_key(record: dict[str, Any]) -> RequestKey:
    """A request's identity: ``(tenant_id, request_id)`` (docs/design.md: two tenants' ids never collide)."""
    return str(record["tenant_id"]), str(record["request_id"])


def _fetch_with_ids(
    client: Client, database: str, keys: Iterable[RequestKey]
) -> dict[RequestKey, tuple[dict[str, Any], list[str]]]:
    db = check_identifier(database)
    wanted = set(keys)
    ids = sorted({rid for _, rid in wanted})
    found: dict[RequestKey, tuple[dict[str, Any], list[str]]] = {}
    for start in range(0, len(ids), _FETCH_CHUNK):
        chunk = ids[start : start + _FETCH_CHUNK]
        sql = f"SELECT {_SELECT} FROM {db}.requests FINAL WHERE request_id IN {{ids:Array(String)}}"
        for record, amendment_ids in _query_records(client, sql, {"ids": chunk}):
            key = request_key(record)
            if key in wanted:
                found[key] = (record, amendment_ids)
    return found


def fetch_requests_by_key(
    client: Client, database: str, keys: Iterable[RequestKey]
) -> dict[RequestKey, dict[str, Any]]:
    """The stored records of ``(tenant_id, request_id)`` keys (those that exist)."""
    return {key: record for key, (record, _) in _fetch_with_ids(client, database, keys).items()}


def stored_windows(client: Client, database: str, keys: Iterable[RequestKey]) -> dict[RequestKey, int]:
    """The stored ``window_start`` (epoch ms) of each ``(tenant_id, request_id)`` key that exists (``FINAL``)."""
    return {key: int(record["window_start"]) for key, record in fetch_requests_by_key(client, database, keys).items()}


def vacated_windows(before: Mapping[RequestKey, int], records: Iterable[dict[str, Any]]) -> set[int]:
    """The windows requests left: the stored ``window_start`` of each record now stored under another."""
    out: set[int] = set()
    for record in records:
        old = before.get(request_key(record))
        if old is not None and old != int(record["window_start"]):
            out.add(old)
    return out


def fetch_request_all_tenants(client: Client, database: str, request_id: str) -> list[dict[str, Any]]:
    """Every tenant's stored record with this request id (ordered by tenant)."""
    db = check_identifier(database)
    sql = f"SELECT {_SELECT} FROM {db}.requests FINAL WHERE request_id = {{rid:String}} ORDER BY tenant_id"
    return [record for record, _ in _query_records(client, sql, {"rid": request_id})]


def fetch_requests_by_trace(client: Client, database: str, trace_id: str) -> list[dict[str, Any]]:
    """The stored records linked to an OpenTelemetry trace (``attrs.trace_id``), ordered by tenant."""
    db = check_identifier(database)
    sql = f"SELECT {_SELECT} FROM {db}.requests FINAL WHERE trace_id = {{tid:String}} ORDER BY tenant_id, request_id"
    return [record for record, _ in _query_records(client, sql, {"tid": trace_id})]


def fetch_requests(client: Client, database: str, request_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The stored records of ``request_ids`` (those that exist), by request id. When two tenants share an
    id, the first tenant's record (in tenant order) is returned: use :func:`fetch_requests_by_key`."""
    out: dict[str, dict[str, Any]] = {}
    for rid in sorted(set(request_ids)):
        records = fetch_request_all_tenants(client, database, rid)
        if records:
            out[rid] = records[0]
    return out


def fetch_request(
    client: Client, database: str, request_id: str, tenant_id: str | None = None
) -> dict[str, Any] | None:
    """The stored record of one request (of ``tenant_id``, when given), or None."""
    if tenant_id is not None:
        return fetch_requests_by_key(client, database, [(tenant_id, request_id)]).get((tenant_id, request_id))
    return fetch_requests(client, database, [request_id]).get(request_id)


def fetch_records_between(client: Client, database: str, start_ms: float, end_ms: float) -> list[dict[str, Any]]:
    """Records (all tenants) whose ``window_start`` lies in ``[start_ms, end_ms)``, ordered by request id."""
    db = check_identifier(database)
    sql = (
        f"SELECT {_SELECT} FROM {db}.requests FINAL"
        " WHERE window_start >= fromUnixTimestamp64Milli({start:Int64}, 'UTC')"
        " AND window_start < fromUnixTimestamp64Milli({end:Int64}, 'UTC')"
        " ORDER BY request_id"
    )
    params = {"start": _ms_to_ticks(start_ms), "end": _ms_to_ticks(end_ms)}
    return [record for record, _ in _query_records(client, sql, params)]


def fetch_window_records(client: Client, database: str, window_start_ms: float, window_ms: int) -> list[dict[str, Any]]:
    """Records (all tenants) of the window starting at ``window_start_ms`` and lasting ``window_ms``."""
    return fetch_records_between(client, database, window_start_ms, window_start_ms + window_ms)


def count_requests(client: Client, database: str) -> int:
    """Number of distinct stored requests (``FINAL``: replays and amendments count once)."""
    db = check_identifier(database)
    return int(client.query(f"SELECT count() FROM {db}.requests FINAL").result_rows[0][0])


def window_tenants(client: Client, database: str, window_start_ms: float) -> list[str]:
    """The tenants with a request in one window of ``requests FINAL`` (promotion, streams.core.tenancy)."""
    result = client.query(
        f"SELECT DISTINCT tenant_id FROM {check_identifier(database)}.requests FINAL "
        "WHERE window_start = fromUnixTimestamp64Milli({ws:Int64})",
        parameters={"ws": int(window_start_ms)},
        settings=final_read_settings(client),
    )
    return [str(r[0]) for r in result.result_rows]


def steady_history(
    client: Client, database: str, since_ms: float, until_ms: float, every_from_ms: float, min_windows: int
) -> dict[int, list[str]]:
    """Window start -> its tenants in ``requests FINAL`` from ``since_ms`` to ``until_ms`` (both included), of
    the tenants with requests in at least ``min_windows`` of those windows or in one from ``every_from_ms``
    (the others cannot be promoted: SteadyLedger.history_span)."""
    result = client.query(
        "SELECT tenant_id, groupUniqArray(toUnixTimestamp64Milli(window_start)) "
        f"FROM {check_identifier(database)}.requests FINAL "
        "WHERE window_start >= fromUnixTimestamp64Milli({since:Int64}) "
        "AND window_start <= fromUnixTimestamp64Milli({until:Int64}) "
        "GROUP BY tenant_id "
        "HAVING uniqExact(window_start) >= {n:UInt32} OR max(window_start) >= fromUnixTimestamp64Milli({every:Int64})",
        parameters={"since": int(since_ms), "until": int(until_ms), "every": int(every_from_ms), "n": min_windows},
        settings=final_read_settings(client),
    )
    out: dict[int, list[str]] = {}
    for tenant, windows in result.result_rows:
        for ws in windows:
            out.setdefault(int(ws), []).append(str(tenant))
    return out
