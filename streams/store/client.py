"""One way to reach the ClickHouse store: a clickhouse-connect client for ``settings.store_url``.

``chdb:///abs/dir`` runs the ClickHouse engine inside this process (the local and test default);
``http(s)://[user:pass@]host[:port]`` talks to a server. Everything above this module uses the same
client API for both, and qualifies every table with its database (no ``USE``), so a client never
depends on a session's current database.

Threads and executors. Both kinds of client serialise their own calls, so one client may be shared by
several threads (calls queue on the client's lock). For parallel work from an executor, give each thread
its own client: ``make_client(settings, shared=False)`` opens another handle on the same chDB engine (or
another HTTP client). Faust agents are coroutines and the client is synchronous: call the store functions
through ``loop.run_in_executor(executor, fn, client, ...)``, never directly in the event loop.

chDB holds one data directory per process: the first chDB client fixes the path, a second path in the
same process is an error, and a second *process* cannot open a directory that another process holds.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import weakref
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import clickhouse_connect
from clickhouse_connect.driver.client import Client

from streams.settings import Settings, redact_url

log = logging.getLogger(__name__)

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_DEFAULT_PORTS = {"http": 8123, "https": 8443}

_chdb_lock = threading.Lock()
_chdb_clients: dict[str, Client] = {}
#: Unshared chDB clients still alive, so shutdown can close them before the shared one.
_chdb_unshared: weakref.WeakSet[Client] = weakref.WeakSet()
_chdb_path_in_use: str | None = None


class StoreConfigError(ValueError):
    """The store URL or a name in it is unusable (raised before any connection is tried)."""


class StoreUnavailable(RuntimeError):
    """The store could not be opened; the message names the redacted URL, never a password."""


def check_identifier(name: str) -> str:
    """Return ``name`` if it is a plain SQL identifier; identifiers are the only text put into SQL."""
    if not _IDENTIFIER.fullmatch(name):
        raise StoreConfigError(f"{name!r} is not a valid ClickHouse identifier")
    return name


def make_client(settings: Settings, *, shared: bool = True) -> Client:
    """A clickhouse-connect client for ``settings.store_url``.

    With ``shared=True`` (default) a chDB store returns the process-wide client for its directory, created
    on first use; ``shared=False`` opens a separate client (for one executor thread). HTTP clients are
    always new. Raises :class:`StoreConfigError` for a bad URL and :class:`StoreUnavailable` when the
    store cannot be opened.
    """
    url = settings.store_url
    scheme = urlsplit(url).scheme.lower()
    if scheme == "chdb":
        return _chdb_client(url, shared=shared)
    if scheme in _DEFAULT_PORTS:
        return _http_client(settings, url)
    raise StoreConfigError(f"unsupported ClickHouse URL {redact_url(url)!r}: use chdb:///DIR or http(s)://HOST")


def chdb_path(url: str) -> str:
    """The absolute data directory of a ``chdb:///abs/dir`` URL."""
    parts = urlsplit(url)
    # chdb://relative/dir would silently put the netloc into the path: insist on an absolute path.
    if parts.netloc or not parts.path.startswith("/"):
        raise StoreConfigError(f"chDB URL must be chdb:///absolute/dir, got {redact_url(url)!r}")
    # Resolved like chDB resolves it, so two spellings of one directory count as one store.
    return os.path.realpath(unquote(parts.path))


def _chdb_client(url: str, *, shared: bool) -> Client:
    global _chdb_path_in_use
    path = chdb_path(url)
    with _chdb_lock:
        if _chdb_path_in_use is not None and _chdb_path_in_use != path:
            raise StoreConfigError(
                f"this process already uses the chDB store {_chdb_path_in_use}; "
                "chDB allows one data directory per process"
            )
        if shared and path in _chdb_clients:
            return _chdb_clients[path]
        try:
            client = clickhouse_connect.get_client(interface="chdb", path=path)
        except Exception as exc:
            raise StoreUnavailable(
                f"cannot open the chDB store {path}: {exc} (is another ttft process holding it?)"
            ) from exc
        _chdb_path_in_use = path
        if shared:
            _chdb_clients[path] = client
        else:
            _chdb_unshared.add(client)
        return client


def chdb_path_in_use() -> str | None:
    """The chDB data directory this process has opened, or None if it has opened none."""
    return _chdb_path_in_use


def close_chdb_clients() -> int:
    """Close every chDB client of this process, unshared ones first, then the shared one.

    Returns how many were closed. The process keeps its claim on the path (``chdb_path_in_use``): this is
    for the end of a process (:mod:`streams.store.shutdown`), not for switching stores.
    """
    with _chdb_lock:
        clients = [*_chdb_unshared, *_chdb_clients.values()]
        _chdb_unshared.clear()
        _chdb_clients.clear()
    for client in clients:
        try:
            client.close()
        except Exception:  # closing at exit: report, never raise
            log.debug("closing a chDB client failed", exc_info=True)
    return len(clients)


def _http_client(settings: Settings, url: str) -> Client:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if parts.path not in ("", "/"):
        raise StoreConfigError(f"{redact_url(url)}: put the database in TTFT_CLICKHOUSE_DATABASE, not in the URL path")
    if not parts.hostname:
        raise StoreConfigError(f"{redact_url(url)}: no host")
    username = settings.clickhouse_user or (unquote(parts.username) if parts.username else "default")
    password = (
        settings.clickhouse_password.get_secret_value()
        if settings.clickhouse_password is not None
        else unquote(parts.password or "")
    )
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    tls: dict[str, Any] = {}
    if scheme == "https":
        tls["verify"] = query.get("verify", "true").lower() not in ("false", "0", "no")
        if "ca_cert" in query:
            tls["ca_cert"] = query["ca_cert"]
    try:
        port = parts.port or _DEFAULT_PORTS[scheme]
    except ValueError as exc:
        raise StoreConfigError(f"{redact_url(url)}: bad port") from exc
    try:
        return clickhouse_connect.get_client(
            interface=scheme,
            host=parts.hostname,
            port=port,
            username=username,
            password=password,
            secure=scheme == "https",
            # No session: one client may then serve several threads without "session is locked" errors.
            autogenerate_session_id=False,
            connect_timeout=10,
            send_receive_timeout=120,
            **tls,
        )
    except Exception as exc:
        message = str(exc).replace(password, "***") if password else str(exc)
        raise StoreUnavailable(f"cannot connect to ClickHouse at {redact_url(url)}: {message}") from None


def ensure_database(client: Client, name: str) -> None:
    """Create the database ``name`` if it does not exist (idempotent)."""
    client.command(f"CREATE DATABASE IF NOT EXISTS {check_identifier(name)}")


def is_server(client: Client) -> bool:
    """True for a ClickHouse server reached over HTTP, False for the embedded chDB engine."""
    return not type(client).__name__.startswith("Chdb")
