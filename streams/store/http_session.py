"""One read of the store's HTTP interface, run on the embedded engine in a session of its own.

Every request gets a fresh chDB connection on the store's directory (a connection is a session: ``USE`` and
``SET`` stay in it; opening one costs ~0.3 ms). It switches to the request's database, applies the
settings the request may change, the interface's caps, then ``readonly = 1``, and runs the one statement.
After ``readonly = 1`` the engine refuses every write, every further setting change (``SET``, a
``SETTINGS`` clause, ``readonly = 0``) and the file/URL table functions.

Settings, as on a ClickHouse server whose user has ``readonly = 1`` and these settings
``CHANGEABLE_IN_READONLY``: a request may change :data:`CHANGEABLE` (limits, output shape); the caps of
:class:`~streams.settings.StoreConfig` bound time, result size and memory whatever it asks. Any other
setting passes only with the value the engine already has (a client restating a default), else the
request gets ClickHouse's ``Cannot modify 'X' setting in readonly mode`` (READONLY). Transport parameters
(:data:`TRANSPORT`) are the interface's own and never reach the engine.

The functions here block: call them on the store thread (they share the engine with the writer).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import chdb
import orjson

from streams.settings import StoreConfig
from streams.store.http_errors import READONLY, UNKNOWN_SETTING, InterfaceError

#: URL parameters of the HTTP protocol itself (consumed by the interface, or harmless to ignore).
TRANSPORT = frozenset(
    {
        "query", "database", "default_format", "user", "password", "quota_key", "query_id", "session_id",
        "session_timeout", "session_check", "compress", "decompress", "client_protocol_version", "buffer_size",
        "wait_end_of_query", "role", "send_progress_in_http_headers", "http_headers_progress_interval_ms",
        "cancel_http_readonly_queries_on_client_close", "enable_http_compression", "http_zlib_compression_level",
        "http_native_compression_disable_checksumming_on_decompress", "add_http_cors_header", "stacktrace",
    }
)  # fmt: skip
#: Settings a request may change, as ``CHANGEABLE_IN_READONLY`` on a server (the caps still bound them).
CHANGEABLE = frozenset(
    {
        "max_execution_time", "max_result_bytes", "max_memory_usage", "max_result_rows", "result_overflow_mode",
        "timeout_overflow_mode", "max_rows_to_read", "max_bytes_to_read", "read_overflow_mode",
        "max_rows_to_group_by", "group_by_overflow_mode", "limit", "offset", "final", "extremes",
        "use_skip_indexes_if_final", "use_skip_indexes_if_final_exact_mode", "date_time_input_format",
        "date_time_output_format", "cast_string_to_dynamic_use_inference", "session_timezone", "join_use_nulls",
        "use_query_condition_cache", "enable_analyzer", "allow_experimental_analyzer",
    }
)  # fmt: skip
CHANGEABLE_PREFIXES = ("output_format_",)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"-?\d+(\.\d+)?")


@dataclass(frozen=True, slots=True)
class EngineFacts:
    """What the engine says about itself, read once when the interface starts."""

    version: str
    timezone: str
    display_name: str
    settings: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReadQuery:
    """One statement to run: its text, the output format, the database, query parameters and settings."""

    sql: str
    output_format: str
    database: str | None
    params: Mapping[str, str]
    settings: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class ReadResult:
    """The formatted result and what ``X-ClickHouse-Summary`` reports about it."""

    data: bytes
    result_rows: int
    result_bytes: int
    read_rows: int
    read_bytes: int
    elapsed_s: float

    def summary(self) -> dict[str, str]:
        """``X-ClickHouse-Summary`` (numbers as strings, as a server sends them)."""
        return {
            "read_rows": str(self.read_rows),
            "read_bytes": str(self.read_bytes),
            "written_rows": "0",
            "written_bytes": "0",
            "total_rows_to_read": str(self.read_rows),
            "result_rows": str(self.result_rows),
            "result_bytes": str(self.result_bytes),
            "elapsed_ns": str(int(self.elapsed_s * 1e9)),
        }


def engine_facts(path: str) -> EngineFacts:
    """Version, time zone, display name and every setting's current value (on the store thread)."""
    conn = chdb.connect(path)  # type: ignore[no-untyped-call]
    try:
        version, timezone, display = _rows(conn, "SELECT version(), timezone(), displayName()")[0]
        settings = dict(_rows(conn, "SELECT name, value FROM system.settings"))
    finally:
        conn.close()
    return EngineFacts(version, timezone, display, settings)


def _rows(conn: Any, sql: str) -> list[list[str]]:
    lines = bytes(conn.query(sql, "JSONCompactEachRow").bytes() or b"").splitlines()
    return [[str(v) for v in orjson.loads(line)] for line in lines]


def request_settings(params: Mapping[str, str], facts: EngineFacts, caps: StoreConfig) -> dict[str, str]:
    """The settings to apply for a request's URL parameters, caps included; raises :class:`InterfaceError`."""
    settings: dict[str, str] = {}
    for name, value in params.items():
        if name in TRANSPORT or name.startswith("param_"):
            continue
        if name == "readonly":
            if value.strip() not in ("1", "2"):  # 2 is readonly too: it would allow less than we give anyway
                raise InterfaceError(READONLY, "Cannot modify 'readonly' setting in readonly mode")
            continue
        if not _NAME.fullmatch(name) or name not in facts.settings:
            raise InterfaceError(UNKNOWN_SETTING, f"Unknown setting '{name}'")
        if name in CHANGEABLE or name.startswith(CHANGEABLE_PREFIXES):
            settings[name] = value
        elif value != facts.settings[name]:
            raise InterfaceError(READONLY, f"Cannot modify '{name}' setting in readonly mode")
    settings["max_execution_time"] = _capped(settings.get("max_execution_time"), caps.http_max_execution_s)
    settings["max_result_bytes"] = _capped(settings.get("max_result_bytes"), caps.http_max_result_bytes)
    settings["max_memory_usage"] = _capped(settings.get("max_memory_usage"), caps.http_max_memory_bytes)
    return settings


def _capped(asked: str | None, cap: float) -> str:
    """``min(asked, cap)``; a missing, zero (unlimited) or unreadable value is the cap."""
    try:
        value = float(asked) if asked is not None else 0.0
    except ValueError:
        value = 0.0
    bounded = cap if value <= 0 else min(value, cap)
    return str(int(bounded)) if float(bounded).is_integer() else str(bounded)


def run_read(path: str, query: ReadQuery) -> ReadResult:
    """Run ``query`` in a fresh read-only session on the engine at ``path`` (on the store thread)."""
    conn = chdb.connect(path)  # type: ignore[no-untyped-call]
    try:
        if query.database:
            conn.query(f"USE {quote_identifier(query.database)}")
        if query.settings:
            conn.query("SET " + ", ".join(f"{k} = {_literal(v)}" for k, v in query.settings.items()))
        conn.query("SET readonly = 1")
        result = conn.query(query.sql, query.output_format, params=dict(query.params) or None)
        data = bytes(result.bytes() or b"")
        return ReadResult(
            data,
            result_rows=int(result.rows_read()),
            result_bytes=int(result.bytes_read()),
            read_rows=int(result.storage_rows_read()),
            read_bytes=int(result.storage_bytes_read()),
            elapsed_s=float(result.elapsed()),
        )
    except (chdb.ChdbError, RuntimeError) as exc:
        raise InterfaceError.from_engine(exc) from None
    finally:
        conn.close()


def quote_identifier(name: str) -> str:
    """``name`` as a back-quoted identifier."""
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def _literal(value: str) -> str:
    """A setting value as SQL: numbers bare, anything else as a quoted string."""
    if _NUMBER.fullmatch(value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
