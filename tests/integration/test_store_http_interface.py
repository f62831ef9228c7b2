"""The embedded store's read-only ClickHouse HTTP interface, against real clients, in this process.

A chDB store filled with simulated traffic through the pure core (``tests/support/fill_store_pure.py``) is
served by :class:`~streams.store.http_interface.StoreHttpInterface` on a free port, its queries on one
store thread as in the writer. clickhouse-connect (``get_client(host, port)``) and the ClickHouse Go driver
clickhouse-go v2 over HTTP (``tests/go/chquery``, configured as Grafana's plugin configures it) run every
dashboard panel's, variable's and annotation's SQL, expanded as the plugin does, and must get the rows the
same SQL gets in-process. Writes of every kind are refused with READONLY (164), a wrong password with
AUTHENTICATION_FAILED (516).
"""

from __future__ import annotations

import gzip
import statistics
import threading
import time
import urllib.error
import urllib.request
import uuid
import zlib
from collections.abc import Iterator
from typing import Any

import clickhouse_connect
import lz4.frame
import pytest
from backports import zstd
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError

from streams.grafana.macros import Variable
from streams.settings import Settings
from tests.support.fill_store_pure import fill
from tests.support.panel_check import hex_value
from tests.support.store_http import (
    DashboardQuery,
    Served,
    canonical_rows,
    dashboard_queries,
    go_client,
    run_go,
    serve,
)

pytestmark = [pytest.mark.clickhouse, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def store(ch_session_client: Client) -> Iterator[tuple[str, list[float]]]:
    """A database of 15 minutes of simulated traffic ending 20 minutes ago: (name, event time range in ms)."""
    db = f"h_{uuid.uuid4().hex[:10]}"
    summary = fill(ch_session_client, db, Settings(), minutes=15, rate=4, end_ago_min=20)
    yield db, summary["time_range_ms"]
    ch_session_client.command(f"DROP DATABASE IF EXISTS {db} SYNC")


@pytest.fixture(scope="module")
def served(ch_session_path: Any, store: Any) -> Iterator[Served]:
    with serve(str(ch_session_path)) as running:
        yield running


@pytest.fixture(scope="module")
def http(served: Served, store: tuple[str, list[float]]) -> Client:
    return clickhouse_connect.get_client(host="127.0.0.1", port=served.port, database=store[0])


def _runs(client: Client, db: str, time_range: list[float]) -> list[DashboardQuery]:
    """The plugin's queries at three settings: 1 h around the traffic, 24 h, and 24 h with one tenant,
    version and two stages selected."""
    end = int(time_range[1]) + 60_000
    now = int(time.time() * 1000)
    tenant, version = client.query(
        f"SELECT tenant_id, version_id FROM {db}.window_health FINAL GROUP BY tenant_id, version_id "
        "ORDER BY sum(total) DESC LIMIT 1"
    ).result_rows[0]
    selected = {
        "tenant": Variable("tenant", (hex_value(tenant),), (hex_value(tenant),)),
        "version": Variable("version", (hex_value(version),), (hex_value(version),)),
        "stage": Variable("stage", ("llm_ttft", "ttft"), ("llm_ttft", "ttft")),
    }
    items = []
    for name, (lo, hi, chosen) in {
        "1h": (end - 3_600_000, end, None),
        "24h": (now - 86_400_000, now, None),
        "24h-selected": (now - 86_400_000, now, selected),
    }.items():
        items += [DashboardQuery(f"{name}:{q.id}", q.sql) for q in dashboard_queries(lo, hi, chosen)]
    return items


def _in_process(client: Client, db: str, items: list[DashboardQuery]) -> dict[str, list[Any]]:
    previous = client.database
    client.database = db
    try:
        return {q.id: canonical_rows(client.query(q.sql).result_rows) for q in items}
    finally:
        client.database = previous


@pytest.fixture(scope="module")
def expected(ch_session_client: Client, store: tuple[str, list[float]]) -> tuple[list[DashboardQuery], dict[str, Any]]:
    db, time_range = store
    items = _runs(ch_session_client, db, time_range)
    return items, _in_process(ch_session_client, db, items)


def test_clickhouse_connect_gets_every_panels_rows(http: Client, expected: Any) -> None:
    items, want = expected
    got = {q.id: canonical_rows(http.query(q.sql).result_rows) for q in items}
    differ = [k for k in want if got[k] != want[k]]
    assert not differ, {k: (got[k][:2], want[k][:2]) for k in differ[:3]}
    with_rows = [k for k, rows in want.items() if rows]
    assert len(items) >= 90 and len(with_rows) >= len(items) // 2, (len(items), len(with_rows))
    print(f"clickhouse-connect: {len(items)} queries, {sum(map(len, want.values()))} rows, all equal")


@pytest.mark.slow
def test_clickhouse_go_gets_every_panels_rows(served: Served, store: Any, expected: Any) -> None:
    """clickhouse-go v2 over HTTP as Grafana's plugin drives it (database/sql, gzip, a query deadline)."""
    items, want = expected
    got = run_go(go_client(), served.port, items, database=store[0])
    errors = {k: v["error"] for k, v in got.items() if "error" in v}
    assert not errors, dict(list(errors.items())[:3])
    differ = [k for k in want if got[k]["rows"] != want[k]]
    assert not differ, {k: (got[k]["rows"][:2], want[k][:2]) for k in differ[:3]}
    print(f"clickhouse-go: {len(items)} queries, {sum(map(len, want.values()))} rows, all equal")


def test_numpy_arrow_pandas_and_parameters(http: Client, ch_session_client: Client, store: Any) -> None:
    db = store[0]
    sql = f"SELECT tenant_id, ttft_ms, started_at FROM {db}.requests FINAL ORDER BY tenant_id, request_id LIMIT 500"
    local = ch_session_client.query_np(sql)
    remote = http.query_np(sql)
    assert remote.shape == local.shape == (500,) and remote.dtype == local.dtype
    assert canonical_rows(remote.tolist()) == canonical_rows(local.tolist())
    assert http.query_arrow(sql).equals(ch_session_client.query_arrow(sql))
    assert http.query_df(sql).equals(ch_session_client.query_df(sql))
    tenant = http.query(f"SELECT any(tenant_id) FROM {db}.requests").result_rows[0][0]
    count = f"SELECT count() FROM {db}.requests FINAL WHERE tenant_id = {{t:String}} AND ttft_ms > %(floor)s"
    parameters = {"t": tenant, "floor": 100}
    assert http.query(count.replace("%(floor)s", "{floor:Float64}"), parameters=parameters).result_rows == (
        ch_session_client.query(count.replace("%(floor)s", "{floor:Float64}"), parameters=parameters).result_rows
    )
    assert http.command(f"EXISTS TABLE {db}.requests") == 1
    assert http.server_version and http.protocol_version == 54405  # it honours client_protocol_version


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO {db}.requests (request_id, tenant_id) VALUES ('x', 'y')",
        "INSERT INTO {db}.requests SELECT * FROM {db}.requests LIMIT 1",
        "CREATE TABLE {db}.evil (a Int8) ENGINE = Memory",
        "DROP TABLE {db}.requests",
        "TRUNCATE TABLE {db}.requests",
        "ALTER TABLE {db}.requests DELETE WHERE 1",
        "OPTIMIZE TABLE {db}.requests FINAL",
        "SYSTEM STOP MERGES",
        "KILL QUERY WHERE 1",
        "SET readonly = 0",
        "SELECT 1 SETTINGS readonly = 0",
        "SELECT 1; DROP TABLE {db}.requests",
        "SELECT 1;\nINSERT INTO {db}.requests (request_id) VALUES ('x')",
        "SELECT * FROM {db}.requests INTO OUTFILE '/tmp/ttft-outfile-test'",
        "SELECT $$'$$ INTO OUTFILE '/tmp/ttft-outfile-test' --'",
        "SELECT * FROM file('/etc/hostname', 'LineAsString')",
        "DESCRIBE TABLE file('/etc/hostname', 'CSVWithNames')",
        "SELECT * FROM url('http://127.0.0.1:1/', 'LineAsString')",
        "CREATE TEMPORARY TABLE t (a Int8)",
    ],
)
def test_writes_are_refused_with_readonly(http: Client, ch_session_client: Client, store: Any, statement: str) -> None:
    db = store[0]
    before = ch_session_client.query(f"SELECT count() FROM {db}.requests").result_rows
    with pytest.raises(DatabaseError) as info:
        http.command(statement.format(db=db))
    assert "Code: 164." in str(info.value) and "(READONLY)" in str(info.value), str(info.value)[:300]
    assert ch_session_client.query(f"SELECT count() FROM {db}.requests").result_rows == before
    assert ch_session_client.command(f"EXISTS TABLE {db}.requests") == 1


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_ping_get_headers_and_errors_as_a_server_sends_them(served: Served, store: Any) -> None:
    assert _get(f"{served.url}/ping")[2] == b"Ok.\n"
    assert _get(f"{served.url}/")[2] == b"Ok.\n"
    status, headers, body = _get(f"{served.url}/?query=SELECT%201&query_id=q-1")
    assert (status, body) == (200, b"1\n")
    assert headers["X-ClickHouse-Format"] == "TabSeparated" and headers["X-ClickHouse-Query-Id"] == "q-1"
    assert headers["X-ClickHouse-Timezone"] and headers["X-ClickHouse-Server-Display-Name"]
    assert '"result_rows":"1"' in headers["X-ClickHouse-Summary"]
    status, headers, body = _get(f"{served.url}/?query=SELECT%20*%20FROM%20nope")
    assert status == 404 and headers["X-ClickHouse-Exception-Code"] == "60"
    assert body.startswith(b"Code: 60. DB::Exception: ") and b"(UNKNOWN_TABLE)" in body
    for query, code, http_status in (
        ("SELECT 1&readonly=0", "164", 500),
        ("SELECT 1&max_threads=1", "164", 500),  # not changeable in readonly mode
        ("SELECT 1&no_such_setting=1", "115", 404),
        ("SELECT 1&compress=1", "48", 501),
        ("", "62", 400),
    ):
        status, headers, _ = _get(f"{served.url}/?query={query.replace(' ', '%20')}")
        assert (status, headers.get("X-ClickHouse-Exception-Code")) == (http_status, code), query
    # Settings a readonly user may change: applied, the caps still bounding them.
    assert _get(f"{served.url}/?query=SELECT%20number%20FROM%20numbers(10)&max_result_rows=3")[0] == 500
    timed = f"{served.url}/?query=SELECT%20getSetting('max_execution_time')&max_execution_time=3600"
    assert _get(timed)[2] == b"10\n"  # capped at store.http_max_execution_s


@pytest.mark.parametrize(
    ("encoding", "decode"),
    [("gzip", gzip.decompress), ("deflate", zlib.decompress), ("zstd", zstd.decompress), ("lz4", lz4.frame.decompress)],
)
def test_response_compression(served: Served, store: Any, encoding: str, decode: Any) -> None:
    url = f"{served.url}/?query=SELECT%20number%20FROM%20numbers(1000)&enable_http_compression=1"
    status, headers, body = _get(url, {"Accept-Encoding": encoding})
    assert status == 200 and headers["Content-Encoding"] == encoding
    assert decode(body) == b"".join(b"%d\n" % i for i in range(1000))
    _, headers, body = _get(url.replace("=1", "=0"), {"Accept-Encoding": encoding})
    assert "Content-Encoding" not in headers and body.startswith(b"0\n1\n")


def test_password_and_users(ch_session_path: Any, store: Any) -> None:
    with serve(str(ch_session_path), http_password="s3cret") as running:
        good = clickhouse_connect.get_client(host="127.0.0.1", port=running.port, password="s3cret")
        assert good.command("SELECT 1") == 1
        for user, password in (("default", "wrong"), ("default", ""), ("alice", "s3cret")):
            with pytest.raises(DatabaseError) as info:
                clickhouse_connect.get_client(host="127.0.0.1", port=running.port, username=user, password=password)
            assert "Code: 516." in str(info.value) and "s3cret" not in str(info.value)
        status, headers, _ = _get(f"{running.url}/?query=SELECT%201", {"X-ClickHouse-User": "default"})
        assert (status, headers["X-ClickHouse-Exception-Code"]) == (403, "516")
        ok = {"X-ClickHouse-User": "default", "X-ClickHouse-Key": "s3cret"}
        assert _get(f"{running.url}/?query=SELECT%201", ok)[2] == b"1\n"


def test_a_query_past_the_time_cap_is_stopped(ch_session_path: Any, store: Any) -> None:
    with serve(str(ch_session_path), http_max_execution_s=1.0) as running:
        client = clickhouse_connect.get_client(host="127.0.0.1", port=running.port)
        started = time.monotonic()
        with pytest.raises(DatabaseError) as info:
            client.query("SELECT count() FROM numbers(100000000000) WHERE sipHash64(number) % 7 = 3")
        assert "Code: 159." in str(info.value)  # TIMEOUT_EXCEEDED
        assert time.monotonic() - started < 10


def test_insert_latency_while_a_dashboard_polls(ch_session_client: Client, served: Served, store: Any) -> None:
    """Inserts on the store thread, alone and while a client runs dashboard queries in a loop: each insert
    waits behind at most one query, so its latency stays bounded (figures printed for the record)."""
    db, time_range = store
    items = _runs(ch_session_client, db, time_range)[:40]
    writer = clickhouse_connect.get_client(interface="chdb", path=str(served.interface.path))
    writer.command(f"CREATE TABLE IF NOT EXISTS {db}.latency_probe (n UInt64) ENGINE = MergeTree ORDER BY n")

    def inserts(count: int) -> list[float]:
        seconds = []
        for n in range(count):
            started = time.perf_counter()
            served.on_store_thread(writer.insert, f"{db}.latency_probe", [[n]], ["n"])
            seconds.append(time.perf_counter() - started)
            time.sleep(0.02)
        return seconds

    alone = inserts(40)
    stop = threading.Event()
    query_s: list[float] = []

    def poll() -> None:
        client = clickhouse_connect.get_client(host="127.0.0.1", port=served.port, database=db)
        while not stop.is_set():
            for q in items:
                started = time.perf_counter()
                client.query(q.sql)
                query_s.append(time.perf_counter() - started)
                if stop.is_set():
                    return

    pollers = [threading.Thread(target=poll) for _ in range(2)]
    for t in pollers:
        t.start()
    try:
        busy = inserts(40)
    finally:
        stop.set()
        for t in pollers:
            t.join(timeout=60)
    ms = [1000 * statistics.median(alone), 1000 * max(alone), 1000 * statistics.median(busy), 1000 * max(busy)]
    print(
        f"insert latency ms: alone p50 {ms[0]:.1f} max {ms[1]:.1f}; with 2 dashboard pollers p50 {ms[2]:.1f} max "
        f"{ms[3]:.1f} ({len(query_s)} queries meanwhile, the longest {1000 * max(query_s):.0f} ms end to end)"
    )
    assert query_s
    # One interface query at a time on the store thread: an insert waits for one query, not the pollers' queue.
    assert max(busy) < max(query_s) + max(alone) + 1.0
