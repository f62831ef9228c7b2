"""The embedded store's ClickHouse HTTP interface: read-only, served by the process that holds the store.

A chDB directory opens in one process only, and the writer holds it while the pipeline runs. So the writer
serves it the way a ClickHouse server serves its tables, on ``store.http_host:store.http_port`` (default
127.0.0.1:8123): clickhouse-connect, clickhouse-go over HTTP (Grafana's ClickHouse plugin) and the ``ttft``
read commands reach the live store as they would reach a server (docs/design.md, "Real components").

What it speaks (ClickHouse's HTTP interface, the parts those clients use):

- ``GET``/``POST /`` with the query in ``query=`` and/or the body (joined by a newline), ``param_<name>``
  query parameters, settings as URL parameters (:mod:`streams.store.http_session` says which), ``database``,
  ``default_format``; ``/ping`` and a bare ``GET /`` answer ``Ok.``.
- Any output format the engine writes (``FORMAT`` in the query, else ``default_format``, else
  TabSeparated); ``Native`` is rewritten for the client's ``client_protocol_version``
  (:mod:`streams.store.native_revision`). Response compression as a server does it: when
  ``enable_http_compression`` is on (the engine's default is 1), by the first of the request's
  ``Accept-Encoding`` among lz4, zstd, gzip and deflate. ClickHouse's own block compression
  (``compress=1``/``decompress=1``) is refused as not implemented.
- Headers ``X-ClickHouse-Query-Id``, ``-Format``, ``-Timezone``, ``-Server-Display-Name``, ``-Summary``;
  errors as a server writes them (:mod:`streams.store.http_errors`).
- User ``default``; its password is ``store.http_password`` (none unless set), by Basic auth,
  ``X-ClickHouse-User``/``X-ClickHouse-Key`` or ``user``/``password`` parameters.

Read-only: a request holds exactly one read statement (:mod:`streams.store.http_statements`) and runs
with the engine's ``readonly = 1``. Every query runs on the writer's store thread (chDB handles are not
shared between threads), one at a time, within ``store.http_max_execution_s`` and
``store.http_max_result_bytes``: an insert waits behind at most one dashboard query, never a queue of them.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import gzip
import hmac
import logging
import uuid
import zlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from aiohttp import BodyPartReader, web

from streams.settings import Settings
from streams.store.http_errors import (
    AUTHENTICATION_FAILED,
    CANNOT_SCHEDULE_TASK,
    NOT_IMPLEMENTED,
    READONLY,
    SYNTAX_ERROR,
    InterfaceError,
)
from streams.store.http_session import EngineFacts, ReadQuery, ReadResult, engine_facts, request_settings, run_read
from streams.store.http_statements import StatementRefused, read_statement
from streams.store.native_revision import UnsupportedNativeType, for_client_revision

log = logging.getLogger("ttft.store.http")

#: ``run(fn, *args)`` runs ``fn(*args)`` on the store thread (the writer's ``_in_store``).
StoreRunner = Callable[..., Awaitable[Any]]
USER = "default"
#: Bodies (queries) above this are refused, as a server refuses a query past ``max_query_size`` and more.
MAX_REQUEST_BYTES = 16 * 1_048_576
#: Results above this size are rewritten and compressed off the event loop.
_OFFLOAD_BYTES = 256 * 1024
_CONTENT_TYPES = {
    "TabSeparated": "text/tab-separated-values; charset=UTF-8",
    "TSV": "text/tab-separated-values; charset=UTF-8",
    "CSV": "text/csv; charset=UTF-8; header=absent",
    "JSON": "application/json; charset=UTF-8",
    "JSONCompact": "application/json; charset=UTF-8",
    "JSONEachRow": "application/x-ndjson; charset=UTF-8",
}
_BINARY = ("Native", "Arrow", "ArrowStream", "Parquet", "RowBinary", "RowBinaryWithNamesAndTypes", "ORC", "Avro")


class StoreHttpInterface:
    """The read-only ClickHouse HTTP interface of the chDB store at ``path``, served in this event loop."""

    def __init__(self, settings: Settings, path: str, run: StoreRunner) -> None:
        self.settings = settings
        self.config = settings.store
        self.path = path
        self.run = run
        self.url: str | None = None
        self.facts = EngineFacts("", "UTC", "ttft")
        self._runner: web.AppRunner | None = None
        self._one_query: asyncio.Semaphore | None = None

    async def start(self) -> str | None:
        """Listen on the configured address; returns the URL, or None when the port is taken (logged: the
        writer goes on without the interface)."""
        self.facts = await self.run(engine_facts, self.path)
        self._one_query = asyncio.Semaphore(1)
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        host, port = self.config.http_host, self.config.http_port
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as exc:
            await runner.cleanup()
            log.error(
                "the store's ClickHouse HTTP interface is OFF: cannot listen on %s:%d (%s); ingestion goes on. "
                "Set TTFT_STORE__HTTP_PORT to a free port (0 turns the interface off).",
                host,
                port,
                exc.strerror or exc,
            )
            return None
        self._runner = runner
        shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        self.url = f"http://{shown}:{port}"
        return self.url

    async def stop(self) -> None:
        """Stop listening (before the store thread goes away)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        query_id = request.query.get("query_id") or str(uuid.uuid4())
        try:
            path = request.path.rstrip("/")
            bare = not path and request.method in ("GET", "HEAD") and "query" not in request.query
            if path in ("/ping", "/replicas_status") or bare:
                return web.Response(text="Ok.\n", content_type="text/plain")
            if path:
                return web.Response(status=404, text=f"There is no handle {request.path}\n", content_type="text/plain")
            self._authenticate(request)
            return await self._query(request, query_id)
        except InterfaceError as exc:
            log.debug("http query %s refused: %s", query_id, exc.message)
            return web.Response(
                status=exc.status,
                body=exc.body(self.facts.version),
                headers={
                    "Content-Type": "text/plain; charset=UTF-8",
                    "X-ClickHouse-Exception-Code": str(exc.code),
                    "X-ClickHouse-Query-Id": query_id,
                    "X-ClickHouse-Server-Display-Name": self.facts.display_name,
                },
            )

    def _authenticate(self, request: web.Request) -> None:
        user, password = _credentials(request)
        expected = self.config.http_password.get_secret_value() if self.config.http_password is not None else ""
        if user != USER or not hmac.compare_digest(password.encode(), expected.encode()):
            raise InterfaceError(
                AUTHENTICATION_FAILED,
                f"{user}: Authentication failed: password is incorrect, or there is no user with such name",
            )

    async def _query(self, request: web.Request, query_id: str) -> web.Response:
        params = {key: request.query.getall(key)[-1] for key in request.query}
        text, form = await _request_text(request)
        params.update(form)
        for name in ("compress", "decompress"):
            if params.get(name, "0") not in ("0", ""):
                raise InterfaceError(
                    NOT_IMPLEMENTED,
                    f"{name}=1 (ClickHouse block compression) is not implemented by the embedded store's interface: "
                    "use HTTP compression (Accept-Encoding) or none",
                )
        sql = "\n".join(part for part in (params.get("query", ""), text) if part)
        try:
            statement = read_statement(sql)
        except StatementRefused as exc:
            error = SYNTAX_ERROR if str(exc).startswith(("Empty", "Unterminated")) else READONLY
            raise InterfaceError(error, f"{USER}: {exc}: this interface only reads (readonly = 1)") from None
        output_format = statement.output_format or params.get("default_format") or "TabSeparated"
        query = ReadQuery(
            sql=statement.sql,
            output_format=output_format,
            database=params.get("database") or None,
            params={k.removeprefix("param_"): v for k, v in params.items() if k.startswith("param_")},
            settings=request_settings(params, self.facts, self.config),
        )
        result = await self._read(query)
        revision = _int(params.get("client_protocol_version"))
        encoding = _encoding(request, params, self.facts) if result.data else None
        log.debug(
            "http query %s: %s, format %s, protocol %d, encoding %s, settings %s, %d bytes in %.1f ms",
            query_id,
            statement.kind,
            output_format,
            revision,
            encoding or "none",
            sorted(k for k in params if k not in ("query", "password") and not k.startswith("param_")),
            len(result.data),
            result.elapsed_s * 1000,
        )
        body = await self._finish(result.data, output_format, revision, encoding)
        headers = {
            "Content-Type": _content_type(output_format),
            "X-ClickHouse-Query-Id": query_id,
            "X-ClickHouse-Format": output_format,
            "X-ClickHouse-Timezone": self.facts.timezone,
            "X-ClickHouse-Server-Display-Name": self.facts.display_name,
            "X-ClickHouse-Summary": orjson.dumps(result.summary()).decode(),
        }
        if encoding:
            headers["Content-Encoding"] = encoding
        return web.Response(body=body, headers=headers)

    async def _read(self, query: ReadQuery) -> ReadResult:
        """Run ``query`` on the store thread, one interface query at a time."""
        assert self._one_query is not None, "start() first"
        async with self._one_query:
            try:
                result: ReadResult = await self.run(run_read, self.path, query)
            except RuntimeError as exc:  # the store thread is gone: the writer is stopping
                raise InterfaceError(CANNOT_SCHEDULE_TASK, f"the store is shutting down ({exc})") from None
        return result

    async def _finish(self, data: bytes, output_format: str, revision: int, encoding: str | None) -> bytes:
        """The body: Native for the client's revision, then compressed; large ones off the event loop."""

        def finish() -> bytes:
            body = data
            if output_format == "Native" and revision > 0:
                try:
                    body = for_client_revision(body, revision)
                except UnsupportedNativeType as exc:
                    raise InterfaceError(NOT_IMPLEMENTED, f"Native for protocol revision {revision}: {exc}") from None
            return _compress(body, encoding) if encoding else body

        if len(data) < _OFFLOAD_BYTES:
            return finish()
        return await asyncio.get_running_loop().run_in_executor(None, finish)


def _credentials(request: web.Request) -> tuple[str, str]:
    """(user, password) from Basic auth, ``X-ClickHouse-User``/``-Key``, or ``user``/``password`` parameters."""
    header = request.headers.get("Authorization", "")
    if header.lower().startswith("basic "):
        try:
            user, _, password = base64.b64decode(header[6:].strip()).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return "", ""
        return user or USER, password
    if "X-ClickHouse-User" in request.headers or "X-ClickHouse-Key" in request.headers:
        return request.headers.get("X-ClickHouse-User") or USER, request.headers.get("X-ClickHouse-Key", "")
    return request.query.get("user") or USER, request.query.get("password", "")


async def _request_text(request: web.Request) -> tuple[str, dict[str, str]]:
    """The body as query text, and the fields of a multipart form (``query``, ``param_*``)."""
    if request.content_type == "multipart/form-data":
        fields: dict[str, str] = {}
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader) or part.filename is not None:
                raise InterfaceError(NOT_IMPLEMENTED, "external data (temporary tables) needs write access")
            fields[str(part.name)] = await part.text()
        return "", fields
    body = await request.read()
    encoding = request.headers.get("Content-Encoding", "").lower()
    if encoding:
        body = _decompress(body, encoding)
    try:
        return body.decode("utf-8"), {}
    except UnicodeDecodeError:
        raise InterfaceError(SYNTAX_ERROR, "the query is not valid UTF-8") from None


def _int(value: str | None) -> int:
    try:
        return int(value) if value else 0
    except ValueError:
        return 0


def _content_type(output_format: str) -> str:
    if output_format in _CONTENT_TYPES:
        return _CONTENT_TYPES[output_format]
    if output_format.startswith(_BINARY):
        return "application/octet-stream"
    return "text/plain; charset=UTF-8"


def _encoding(request: web.Request, params: Mapping[str, str], facts: EngineFacts) -> str | None:
    """The response's Content-Encoding: as a server, only with ``enable_http_compression`` on."""
    enabled = params.get("enable_http_compression", facts.settings.get("enable_http_compression", "0"))
    if enabled.strip().lower() not in ("1", "true"):
        return None
    for item in request.headers.get("Accept-Encoding", "").split(","):
        name = item.split(";")[0].strip().lower()
        if name in ("lz4", "zstd", "gzip", "deflate"):
            return name
    return None


def _compress(data: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.compress(data, compresslevel=3)
    if encoding == "deflate":
        return zlib.compress(data, 3)
    if encoding == "zstd":
        from backports import zstd

        return bytes(zstd.compress(data))
    import lz4.frame

    return bytes(lz4.frame.compress(data))


def _decompress(body: bytes, encoding: str) -> bytes:
    try:
        if encoding == "gzip":
            return gzip.decompress(body)
        if encoding == "deflate":
            return zlib.decompress(body)
        if encoding == "zstd":
            from backports import zstd

            return bytes(zstd.decompress(body))
        if encoding == "lz4":
            import lz4.frame

            return bytes(lz4.frame.decompress(body))
    except (OSError, ValueError, RuntimeError, zlib.error) as exc:
        raise InterfaceError(SYNTAX_ERROR, f"cannot decompress the {encoding} request body: {exc}") from None
    raise InterfaceError(NOT_IMPLEMENTED, f"request Content-Encoding {encoding}")


async def serve_embedded_store(settings: Settings, run: StoreRunner) -> StoreHttpInterface | None:
    """Start the interface of the embedded store this process holds (``run`` reaches its store thread).

    None when the store is a ClickHouse server (it serves itself), when ``store.http_port`` is 0, or when the
    port is taken (logged at error; the caller goes on without it).
    """
    from urllib.parse import urlsplit

    from streams.store.client import chdb_path

    if urlsplit(settings.store_url).scheme.lower() != "chdb":
        return None
    if settings.store.http_port == 0:
        log.info("the store's ClickHouse HTTP interface is off (TTFT_STORE__HTTP_PORT=0)")
        return None
    interface = StoreHttpInterface(settings, chdb_path(settings.store_url), run)
    url = await interface.start()
    if url is None:
        return None
    log.warning("store: read-only ClickHouse HTTP interface on %s (user default)", url)
    return interface
