"""The store over HTTP, against a STAND-IN for a ClickHouse server.

No ClickHouse server runs on this machine, so this is not a test against a real server. The stand-in is
a small HTTP server, written here, that speaks just enough of the ClickHouse HTTP interface for
clickhouse-connect (Basic auth, SQL in the body, ``param_*`` query parameters, chunked and lz4
compressed ``INSERT ... FORMAT Native`` bodies) and executes everything on the same ClickHouse engine
through chDB. It checks that ``http://user:pass@host:port`` builds a working HTTP client with those
credentials, that the store code runs unchanged over HTTP, that every insert asks for a synchronous
insert (``async_insert=0``, ``wait_for_async_insert=1``) and that a wrong password never shows up in an
error. What it cannot check: server-only behaviour (real async inserts, TLS, replication, auth rules).
"""

from __future__ import annotations

import base64
import http.server
import os
import re
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import chdb
import lz4.frame
import pytest
from clickhouse_connect.driver.client import Client
from pydantic import SecretStr

from streams.settings import Settings
from streams.store.client import StoreUnavailable, is_server, make_client
from streams.store.dead_letter_store import count_dead_letters, insert_dead_letters
from streams.store.migrate import apply_migrations
from streams.store.requests_store import count_requests, fetch_request, insert_requests
from tests.integration.test_store_clickhouse import full_record, make_record
from tests.support.recent import RECENT_DAY_MS

pytestmark = pytest.mark.clickhouse

USER, PASSWORD = "alice", "s3cr:et@pw"
_INSERT = re.compile(rb"(?s)(INSERT INTO .*?)\s+FORMAT\s+(\w+)\n(.*)")


class _StandIn(http.server.ThreadingHTTPServer):
    def __init__(self, engine_path: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.engine = chdb.connect(engine_path)  # type: ignore[no-untyped-call]
        self.lock = threading.Lock()
        self.requests: list[tuple[dict[str, str], bytes]] = []


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _StandIn

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding") == "chunked":
            body = b""
            while size := int(self.rfile.readline().strip(), 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        encoding = self.headers.get("Content-Encoding")
        if encoding == "lz4":
            return bytes(lz4.frame.decompress(body))
        if encoding:
            raise NotImplementedError(f"stand-in: Content-Encoding {encoding}")
        return body

    def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _serve(self) -> None:
        query = dict(parse_qsl(urlsplit(self.path).query, keep_blank_values=True))
        body = self._body()
        self.server.requests.append((query, body[:200]))
        expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        if self.headers.get("Authorization") != expected:
            message = b"Code: 516. DB::Exception: alice: Authentication failed. (AUTHENTICATION_FAILED)"
            self._reply(403, message, {"X-ClickHouse-Exception-Code": "516"})
            return
        params = {k.removeprefix("param_"): v for k, v in query.items() if k.startswith("param_")}
        try:
            with self.server.lock:
                out = self._execute(query, body, params)
        except Exception as exc:
            message = f"Code: 1000. DB::Exception: {exc}".encode()
            self._reply(500, message, {"X-ClickHouse-Exception-Code": "1000"})
            return
        self._reply(200, out)

    def _execute(self, query: dict[str, str], body: bytes, params: dict[str, str]) -> bytes:
        insert = _INSERT.fullmatch(query.get("query", "").encode() + body)
        if insert is None:
            sql = query.get("query", "") + body.decode()
            return bytes(self.server.engine.query(sql, "TabSeparated", params=params).bytes() or b"")
        with tempfile.NamedTemporaryFile(suffix=".native", delete=False) as data:
            data.write(insert[3])
        try:
            sql = f"{insert[1].decode()} FROM INFILE '{data.name}' FORMAT {insert[2].decode()}"
            self.server.engine.query(sql, "TabSeparated", params=params)
        finally:
            os.unlink(data.name)
        return b""


@pytest.fixture
def stand_in(ch_client: Client, ch_session_path: Path) -> Iterator[_StandIn]:
    server = _StandIn(os.path.realpath(ch_session_path))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)
    # Close the engine handle here, in the main thread. Left to the garbage collector, the serving thread
    # dropped it last and closed it while the interpreter shut down: SIGSEGV at exit (issue 11).
    server.engine.close()


def _url(server: _StandIn, password: str = "s3cr%3Aet%40pw") -> str:
    return f"http://{USER}:{password}@127.0.0.1:{server.server_address[1]}"


def test_store_works_over_http_with_synchronous_inserts(stand_in: _StandIn, ch_client: Client) -> None:
    client = make_client(Settings(clickhouse_url=SecretStr(_url(stand_in))))
    assert is_server(client)
    database = f"h_{uuid.uuid4().hex[:12]}"
    try:
        assert "0001_requests" in apply_migrations(client, database)
        assert apply_migrations(client, database) == []
        record = full_record("it's 'quoted'", "租户")
        first = make_record("it's 'quoted'", status="orphan", event_count=1, tenant_id=record["tenant_id"])
        insert_requests(client, database, [first])  # the same (tenant, request id): replaced by the next one
        insert_requests(client, database, [record])
        assert fetch_request(client, database, "it's 'quoted'") == record
        assert count_requests(client, database) == 1
        letter = {
            "reason_code": "schema",
            "detail": "ts_ms: must be epoch milliseconds",
            "original": base64.b64encode(b"\xff{}").decode(),
            "original_length": 3,
            "sha256": "0" * 64,
            "source_topic": "ttft.stage-events",
            "source_partition": 3,
            "source_offset": 17,
            "received_at": float(RECENT_DAY_MS),
        }
        insert_dead_letters(client, database, [letter, letter])
        assert count_dead_letters(client, database) == 1
    finally:
        ch_client.command(f"DROP DATABASE IF EXISTS {database} SYNC")
    inserts = [q for q, body in stand_in.requests if b"INSERT INTO" in body or "INSERT" in q.get("query", "")]
    assert len(inserts) >= 5  # migrations ledger rows, requests, dead letters
    for params in inserts:
        assert (params.get("async_insert"), params.get("wait_for_async_insert")) == ("0", "1")
    assert all("session_id" not in q for q, _ in stand_in.requests)


def test_wrong_password_is_never_shown(stand_in: _StandIn) -> None:
    settings = Settings(clickhouse_url=SecretStr(_url(stand_in)), clickhouse_password=SecretStr("wrong-hunter2"))
    with pytest.raises(StoreUnavailable) as info:
        make_client(settings)
    text = str(info.value)
    assert "Authentication failed" in text
    assert "hunter2" not in text and "s3cr" not in text
    assert f"{USER}:***@127.0.0.1" in text
