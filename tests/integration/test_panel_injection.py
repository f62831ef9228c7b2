"""Hostile identifiers in dashboard panels: no tenant id (or version id) can break out of its quotes.

Every panel, variable and annotation query of ``dashboards/*.json`` is expanded exactly as the plugin
does (:func:`streams.grafana.macros.expand_query`) with one hostile tenant selected, and run on two real
chDB stores: one holding every tenant (the hostile ones and a victim), one holding only the chosen
tenant. The answers must be identical (the chosen tenant's rows, or none), with no query error. The
same queries with a raw hostile string as the variable value (a crafted ``var-tenant=`` URL) must
answer as if an unknown tenant were chosen: nobody's rows.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from clickhouse_connect.driver.client import Client

from streams.core.windows import aggregate_windows
from streams.grafana.macros import QueryContext, Variable, expand_query, panel_interval_ms
from streams.settings import Settings
from streams.store.aggregates_store import insert_window_aggregates
from streams.store.migrate import apply_migrations
from streams.store.requests_store import insert_requests
from tests.support.fill_store_pure import join_traffic
from tests.support.panel_check import hex_value, queries
from tests.support.pipeline import REPO

pytestmark = [pytest.mark.clickhouse, pytest.mark.timeout(300)]

#: Quotes, backslashes (the one ``singlequote`` misses), newlines, comments, SQL keywords, list syntax.
HOSTILE_TENANTS = (
    "x\\') OR 1=1 --",
    "\\",
    "a'b\\",
    "q\\\\'); DROP TABLE requests; --",
    "line\nbreak' OR '1'='1",
    "x' UNION ALL SELECT * FROM requests --",
    "{a,b}",
    "$tenant ${version} $__all",
)
VICTIM = "victim"
VERSION = "v1\\' OR 1=1 --"  # a hostile version id too (the version variable is encoded the same way)
#: Two hours ago, on a window boundary (recent: the tables' TTL drops old rows at insert).
START_MS = float((int(time.time() * 1000) - 7_200_000) // 60_000 * 60_000)
WINDOWS = 3
PER_WINDOW = 12
CTX_FROM_MS = int(START_MS - 3_600_000)
CTX_TO_MS = int(START_MS + 3_600_000)


def _events(name: str) -> Iterator[tuple[bytes, bytes, float]]:
    """Complete requests of one tenant; latencies depend on the tenant so a leak changes any answer."""
    tenant = (VICTIM, *HOSTILE_TENANTS).index(name)  # the same in every store
    spans = (("retrieval", 200.0), ("prompt_assemble", 60.0), ("llm_ttft", 900.0))
    for i in range(WINDOWS * PER_WINDOW):
        rid = f"r{tenant}-{i}"
        ts = START_MS + i * 60_000 / PER_WINDOW + tenant
        base = {"request_id": rid, "tenant_id": name, "version_id": VERSION}
        out: list[dict[str, Any]] = [{**base, "stage": "request_start", "ts_ms": ts}]
        at = ts
        for stage, size in spans:
            duration = size + 37.0 * tenant + (i % 5)
            out.append({**base, "stage": stage, "ts_ms": at, "duration_ms": duration})
            at += duration
        out.append({**base, "stage": "first_token", "ts_ms": at + 15.0})
        for event in out:
            yield rid.encode(), orjson.dumps(event), ts


def _fill(client: Client, db: str, tenants: tuple[str, ...]) -> None:
    settings = Settings()
    messages = sorted((m for t in tenants for m in _events(t)), key=lambda m: m[2])
    records, letters = join_traffic(settings, messages)
    assert not letters and records
    insert_requests(client, db, records)
    for aggs in aggregate_windows(records, settings).values():
        insert_window_aggregates(
            client,
            db,
            {
                "stage_windows": aggs.stage_windows,
                "stage_strata": aggs.stage_strata,
                "tail_attribution": aggs.tail_attribution,
                "window_health": aggs.window_health,
                "llm_signals": aggs.llm_signals,
            },
        )
    _fill_tenant_tables(client, db, tenants)


def _fill_tenant_tables(client: Client, db: str, tenants: tuple[str, ...]) -> None:
    """One row per tenant (defaults, times in range) in every other table with a tenant column."""
    columns = client.query(
        "SELECT table, name, type FROM system.columns WHERE database = {db:String}", parameters={"db": db}
    ).result_rows
    by_table: dict[str, list[tuple[str, str]]] = {}
    for table, name, kind in columns:
        by_table.setdefault(table, []).append((name, kind))
    for table, cols in by_table.items():
        names = {n for n, _ in cols}
        if "tenant_id" not in names or table in ("requests", "stage_windows", "stage_strata", "window_health"):
            continue
        if table in ("tail_attribution", "llm_signals", "schema_migrations"):
            continue
        keys = ("tenant_id", "source_offset", "fingerprint")  # distinct order keys: FINAL keeps every row
        chosen = [n for n, k in cols if n in keys or k.startswith(("DateTime", "Nullable(DateTime"))]
        rows = [[_cell(n, tenant) for n in chosen] for tenant in tenants]
        client.insert(table, rows, column_names=chosen, database=db)


def _cell(column: str, tenant: str) -> Any:
    if column == "tenant_id":
        return tenant
    if column == "source_offset":
        return (VICTIM, *HOSTILE_TENANTS).index(tenant)
    if column == "fingerprint":
        return hex_value(tenant)
    return dt.datetime.fromtimestamp(START_MS / 1000 + 60, tz=dt.UTC)


@pytest.fixture(scope="module")
def stores(ch_session_client: Client) -> Iterator[dict[str, str]]:
    """Database per store: ``all`` (victim + every hostile tenant) and one per hostile tenant alone."""
    client = ch_session_client
    names: dict[str, str] = {"all": "t_inject_all"}
    names |= {t: f"t_inject_solo_{k}" for k, t in enumerate(HOSTILE_TENANTS)}
    try:
        for key, db in names.items():
            client.command(f"DROP DATABASE IF EXISTS {db} SYNC")
            apply_migrations(client, db)
            _fill(client, db, (VICTIM, *HOSTILE_TENANTS) if key == "all" else (key,))
        yield names
    finally:
        for db in names.values():
            client.command(f"DROP DATABASE IF EXISTS {db} SYNC")


def _models() -> list[dict[str, Any]]:
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted((REPO / "dashboards").glob("*.json"))]


def _answers(client: Client, db: str, value: str) -> dict[str, Any]:
    """Every tenant-filtered query of every dashboard with ``tenant`` = ``value``: sorted rows, or the error."""
    out: dict[str, Any] = {}
    previous = client.database
    client.database = db
    try:
        for model in _models():
            names = [v["name"] for v in model["templating"]["list"]]
            variables = {n: Variable(n, ()) for n in names}
            variables["tenant"] = Variable("tenant", (value,), (value,))
            for suffix, raw_sql, panel in queries(model):
                if "$tenant" not in raw_sql:
                    continue  # not filtered by tenant (the tenant list itself, pipeline-wide panels)
                panel = panel or {}
                interval = panel_interval_ms(
                    CTX_FROM_MS, CTX_TO_MS, panel.get("maxDataPoints", 500), panel.get("interval")
                )
                sql = expand_query(raw_sql, QueryContext(CTX_FROM_MS, CTX_TO_MS, interval), variables)
                try:
                    rows = client.query(sql).result_rows
                except Exception as exc:  # an error is a finding, reported with the panel's name
                    out[f"{model['uid']}/{suffix}"] = f"ERROR {type(exc).__name__}: {str(exc)[:300]}"
                    continue
                out[f"{model['uid']}/{suffix}"] = sorted(repr(r) for r in rows)
    finally:
        client.database = previous
    return out


@pytest.mark.parametrize("tenant", HOSTILE_TENANTS, ids=[f"tenant{k}" for k in range(len(HOSTILE_TENANTS))])
def test_each_panel_returns_only_the_chosen_tenants_rows(
    ch_session_client: Client, stores: dict[str, str], tenant: str
) -> None:
    mixed = _answers(ch_session_client, stores["all"], hex_value(tenant))
    alone = _answers(ch_session_client, stores[tenant], hex_value(tenant))
    errors = {k: v for k, v in mixed.items() if isinstance(v, str)}
    assert not errors, errors
    differ = sorted(k for k in mixed if mixed[k] != alone[k])
    assert not differ, {k: (mixed[k][:3], alone[k][:3]) for k in differ[:5]}
    with_rows = [k for k, v in mixed.items() if v]
    assert len(with_rows) >= 20, with_rows  # the comparison is not vacuous: most panels have rows
    assert not any(VICTIM in row for rows in mixed.values() for row in rows)


@pytest.mark.parametrize("tenant", HOSTILE_TENANTS, ids=[f"tenant{k}" for k in range(len(HOSTILE_TENANTS))])
def test_a_raw_hostile_value_selects_nobody(ch_session_client: Client, stores: dict[str, str], tenant: str) -> None:
    """A crafted URL puts the raw id (not its hex) in the variable: still no break-out, nobody's rows."""
    raw = _answers(ch_session_client, stores["all"], tenant)
    nobody = _answers(ch_session_client, stores["all"], hex_value("no such tenant"))
    assert raw == nobody


def test_the_old_singlequote_filter_did_leak(ch_session_client: Client, stores: dict[str, str]) -> None:
    """The bug this guards against, reproduced: ``singlequote`` lets ``x\\') OR 1=1 --`` read every tenant."""
    old = "SELECT DISTINCT tenant_id FROM requests FINAL WHERE tenant_id IN (${tenant:singlequote})"
    variables = {"tenant": Variable("tenant", (HOSTILE_TENANTS[0],), (HOSTILE_TENANTS[0],))}
    sql = expand_query(old, QueryContext(CTX_FROM_MS, CTX_TO_MS, 60_000), variables)
    previous = ch_session_client.database
    ch_session_client.database = stores["all"]
    try:
        leaked = {r[0] for r in ch_session_client.query(sql).result_rows}
    finally:
        ch_session_client.database = previous
    assert VICTIM in leaked and len(leaked) == 1 + len(HOSTILE_TENANTS)


def test_a_hostile_request_id_selects_nobody(ch_session_client: Client, stores: dict[str, str]) -> None:
    """The request board's text box reaches SQL only percent-encoded: a crafted ``var-request_id=`` shows no
    request and no error, in every panel of that board."""
    (model,) = [m for m in _models() if m["uid"] == "ttft-request"]
    previous = ch_session_client.database
    ch_session_client.database = stores["all"]
    try:
        (real,) = ch_session_client.query("SELECT min(request_id) FROM requests FINAL").result_rows[0]
        for hostile in (*HOSTILE_TENANTS, real):
            variables = {"tenant": Variable("tenant", ()), "request_id": Variable("request_id", (hostile,), (hostile,))}
            for suffix, raw_sql, panel in queries(model):
                if "$request_id" not in raw_sql and "${request_id" not in raw_sql:
                    continue
                interval = panel_interval_ms(CTX_FROM_MS, CTX_TO_MS, 500, (panel or {}).get("interval"))
                sql = expand_query(raw_sql, QueryContext(CTX_FROM_MS, CTX_TO_MS, interval), variables)
                rows = ch_session_client.query(sql).result_rows
                assert bool(rows) == (hostile == real), (suffix, hostile)
    finally:
        ch_session_client.database = previous
