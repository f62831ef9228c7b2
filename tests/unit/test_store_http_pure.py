"""The pure parts of the store's HTTP interface: the statement gate, the settings policy, errors, Native."""

from __future__ import annotations

import struct

import pytest

from streams.settings import Settings, StoreConfig
from streams.store.http_errors import READONLY, InterfaceError, http_status
from streams.store.http_session import EngineFacts, request_settings
from streams.store.http_statements import StatementRefused, read_statement
from streams.store.native_revision import (
    BLOCK_INFO,
    UnsupportedNativeType,
    for_client_revision,
    parse_type,
)


@pytest.mark.parametrize(
    ("sql", "kind", "fmt"),
    [
        ("SELECT 1", "SELECT", None),
        ("select 1 FORMAT Native", "SELECT", "Native"),
        ("SELECT 1\n FORMAT JSON;", "SELECT", "JSON"),
        ("WITH 1 AS x SELECT x", "WITH", None),
        ("(SELECT 1) UNION ALL SELECT 2", "SELECT", None),
        ("-- comment; INSERT\n/* nested /* ; */ DROP */ SHOW TABLES", "SHOW", None),
        ("DESCRIBE TABLE db.requests", "DESCRIBE", None),
        ("DESC (SELECT 1)", "DESC", None),
        ("EXISTS TABLE requests", "EXISTS", None),
        ("EXPLAIN SELECT 1", "EXPLAIN", None),
        ("SELECT 'a;b', \"c;d\", `e;f`, $$g;h$$, $t$i;j$t$ #; x", "SELECT", None),
        ("SELECT 'it''s; fine', 'back\\'slash;'", "SELECT", None),
    ],
)
def test_one_read_statement_passes(sql: str, kind: str, fmt: str | None) -> None:
    statement = read_statement(sql)
    assert (statement.kind, statement.output_format) == (kind, fmt)
    assert not statement.sql.endswith(";")


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO t VALUES (1)",
        "CREATE TABLE t (a Int8) ENGINE = Memory",
        "DROP TABLE t",
        "ALTER TABLE t DELETE WHERE 1",
        "SYSTEM FLUSH LOGS",
        "SET readonly = 0",
        "KILL QUERY WHERE 1",
        "OPTIMIZE TABLE t",
        "SELECT 1; SELECT 2",
        "SELECT 1; DROP TABLE t",
        "SELECT 1 ; ; INSERT INTO t VALUES (1)",
        "SELECT * FROM t INTO OUTFILE '/tmp/x'",
        "SELECT $$'$$ INTO OUTFILE '/tmp/x' --'",
        "SELECT \u2018'\u2019; DROP TABLE t",
        "DESCRIBE file('/etc/passwd', 'CSVWithNames')",
        "DESC TABLE url('http://x/', 'CSV')",
        "",
        "   -- only a comment",
        "SELECT 'unterminated",
    ],
)
def test_anything_else_is_refused(sql: str) -> None:
    with pytest.raises(StatementRefused):
        read_statement(sql)


ENGINE_SETTINGS = {
    "max_threads": "8",
    "max_execution_time": "0",
    "output_format_json_quote_64bit_integers": "1",
    "max_result_rows": "0",
    "max_result_bytes": "0",
    "max_memory_usage": "0",
    "date_time_input_format": "best_effort",
    "limit": "0",
}
FACTS = EngineFacts("26.9", "UTC", "host", ENGINE_SETTINGS)
CAPS = StoreConfig(http_max_execution_s=10, http_max_result_bytes=1000, http_max_memory_bytes=5000)


def test_settings_a_readonly_user_may_change_are_applied_within_the_caps() -> None:
    params = {
        "query": "x",
        "database": "ttft",
        "param_t": "v",
        "session_id": "s",
        "client_protocol_version": "54460",
        "max_execution_time": "60",
        "max_result_rows": "5",
        "limit": "100",
        "output_format_json_quote_64bit_integers": "0",
        "date_time_input_format": "best_effort",  # a client restating a default
        "max_threads": "8",
        "readonly": "1",
    }
    assert request_settings(params, FACTS, CAPS) == {
        "max_execution_time": "10",
        "max_result_rows": "5",
        "limit": "100",
        "output_format_json_quote_64bit_integers": "0",
        "date_time_input_format": "best_effort",
        "max_result_bytes": "1000",
        "max_memory_usage": "5000",
    }
    assert request_settings({"max_execution_time": "2.5"}, FACTS, CAPS)["max_execution_time"] == "2.5"
    assert request_settings({"max_memory_usage": "0"}, FACTS, CAPS)["max_memory_usage"] == "5000"


@pytest.mark.parametrize(
    ("params", "code"),
    [({"readonly": "0"}, 164), ({"max_threads": "64"}, 164), ({"no_such": "1"}, 115), ({"bad name": "1"}, 115)],
)
def test_other_settings_are_refused_as_a_readonly_server_refuses_them(params: dict[str, str], code: int) -> None:
    with pytest.raises(InterfaceError) as info:
        request_settings(params, FACTS, CAPS)
    assert info.value.code == code


def test_engine_errors_keep_their_code_name_and_status() -> None:
    wrapped = (
        "Code: 164. DB::Exception: Code: 164. DB::Exception: Cannot modify 'readonly' setting in readonly mode. "
        "(READONLY) (version 26.9.2.1). (READONLY)"
    )
    error = InterfaceError.from_engine(RuntimeError(wrapped))
    assert (error.code, error.name, error.status) == (164, "READONLY", 500)
    assert error.body("26.9") == (
        b"Code: 164. DB::Exception: Cannot modify 'readonly' setting in readonly mode. (READONLY) (version 26.9)\n"
    )
    unknown = InterfaceError.from_engine(RuntimeError("Code: 60. DB::Exception: Unknown table x. (UNKNOWN_TABLE)"))
    assert (unknown.code, unknown.status) == (60, 404)
    assert InterfaceError(READONLY, "x").status == 500
    assert (http_status("AUTHENTICATION_FAILED"), http_status("SYNTAX_ERROR"), http_status("TIMEOUT_EXCEEDED")) == (
        403,
        400,
        408,
    )


def _string(text: str) -> bytes:
    data = text.encode()
    return bytes([len(data)]) + data


def _block(rows: int, *columns: tuple[str, str, bytes]) -> bytes:
    out = bytes([len(columns), rows])
    for name, kind, data in columns:
        out += _string(name) + _string(kind) + data
    return out


def test_native_gets_block_info_and_serialization_flags_for_the_clients_revision() -> None:
    u64 = struct.pack("<2Q", 7, 8)
    strings = _string("ab") + _string("")
    nullable = b"\x00\x01" + struct.pack("<2d", 1.5, 0.0)
    array = struct.pack("<2Q", 1, 3) + bytes([1, 2, 3])
    lc = (
        struct.pack("<Q", 1)
        + struct.pack("<QQ", 0x600, 2)
        + _string("")
        + _string("x")
        + struct.pack("<Q", 2)
        + b"\x01\x01"
    )
    mapped = struct.pack("<2Q", 1, 2) + _string("k") + _string("l") + struct.pack("<2I", 5, 6)
    tuple_ = _string("a") + _string("b") + struct.pack("<2h", 1, 2)
    columns = [
        ("n", "UInt64", u64),
        ("s", "String", strings),
        ("f", "Nullable(Float64)", nullable),
        ("a", "Array(UInt8)", array),
        ("lc", "LowCardinality(String)", lc),
        ("m", "Map(String, UInt32)", mapped),
        ("t", "Tuple(a String, b Int16)", tuple_),
        ("d", "DateTime64(3, 'UTC')", struct.pack("<2q", 1, 2)),
        ("e", "Enum8('a, b' = 1, 'c' = 2)", b"\x01\x02"),
        ("dec", "Decimal(20, 2)", bytes(32)),
    ]
    native = _block(2, *columns) + _block(0, ("n", "UInt64", b""))
    assert for_client_revision(native, 0) == native
    with_info = for_client_revision(native, 54405)
    assert with_info == BLOCK_INFO + _block(2, *columns) + BLOCK_INFO + _block(0, ("n", "UInt64", b""))
    flagged = for_client_revision(native, 54460)
    expected = BLOCK_INFO + bytes([len(columns), 2])
    for name, kind, data in columns:
        expected += _string(name) + _string(kind) + b"\x00" + data
    assert flagged == expected + BLOCK_INFO + bytes([1, 0]) + _string("n") + _string("UInt64") + b"\x00"


def test_native_types_it_cannot_walk_are_refused() -> None:
    with pytest.raises(UnsupportedNativeType):
        for_client_revision(_block(1, ("v", "Dynamic", b"\x00")), 54460)
    assert parse_type("Point") == parse_type("Tuple(Float64, Float64)")
    assert parse_type("SimpleAggregateFunction(sum, UInt64)") == parse_type("UInt64")


def test_settings_nest_the_store_section() -> None:
    settings = Settings(store={"http_port": 0, "http_password": "pw"})
    assert settings.store.http_port == 0 and settings.store.http_password is not None
    assert "pw" not in repr(settings.store)
    assert Settings().store.http_port == 8123 and Settings().store.http_host == "127.0.0.1"
