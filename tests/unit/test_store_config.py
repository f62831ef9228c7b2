from __future__ import annotations

from pathlib import Path
from typing import Any

import clickhouse_connect
import pytest
from pydantic import SecretStr

from schemas.records import RequestRecord, record_version
from streams.settings import Settings
from streams.store.client import StoreConfigError, StoreUnavailable, chdb_path, check_identifier, make_client
from streams.store.migrate import load_migrations, migrations_dir, split_statements
from streams.store.requests_store import INSERT_COLUMNS, _record, _row, final_read_settings


def test_split_statements_on_semicolon_at_end_of_line() -> None:
    sql = """
-- a comment that ends with a semicolon;
CREATE TABLE a (x String DEFAULT 'a;b') ENGINE = Memory;
-- between
ALTER TABLE a
    ADD COLUMN IF NOT EXISTS y UInt8;

-- trailing comment only
"""
    assert split_statements(sql) == [
        "-- a comment that ends with a semicolon;\nCREATE TABLE a (x String DEFAULT 'a;b') ENGINE = Memory",
        "-- between\nALTER TABLE a\n    ADD COLUMN IF NOT EXISTS y UInt8",
    ]


def test_split_statements_keeps_last_statement_without_semicolon() -> None:
    assert split_statements("SELECT 1;\nSELECT 2") == ["SELECT 1", "SELECT 2"]


def test_repository_migrations_are_numbered_and_parse() -> None:
    migrations = load_migrations()
    names = [m.name for m in migrations]
    assert {"0001_requests", "0002_dead_letters", "0005_pipeline_stats"} <= set(names)
    assert names == sorted(names)
    for migration in migrations:
        statements = migration.statements("ttft_x")
        assert statements, migration.name
        assert all("{database}" not in s for s in statements)
        assert all("IF NOT EXISTS" in s for s in statements if s.lstrip("- \n").upper().startswith("CREATE"))
    assert migrations_dir().name == "migrations"


def test_migration_files_must_be_numbered(tmp_path: Path) -> None:
    (tmp_path / "1_bad.sql").write_text("SELECT 1;")
    with pytest.raises(ValueError, match="NNNN_lowercase_name"):
        load_migrations(tmp_path)


def test_two_migrations_cannot_share_a_number(tmp_path: Path) -> None:
    (tmp_path / "0001_a.sql").write_text("SELECT 1;")
    (tmp_path / "0001_b.sql").write_text("SELECT 1;")
    with pytest.raises(ValueError, match="share number 0001"):
        load_migrations(tmp_path)


@pytest.mark.parametrize("name", ["ttft", "_x1", "T_9"])
def test_identifiers_accepted(name: str) -> None:
    assert check_identifier(name) == name


@pytest.mark.parametrize("name", ["", "1abc", "a-b", "a;DROP", "a b", "x" * 65, "`t`"])
def test_identifiers_rejected(name: str) -> None:
    with pytest.raises(StoreConfigError):
        check_identifier(name)


def test_migration_rejects_bad_database_name() -> None:
    migration = load_migrations()[0]
    with pytest.raises(StoreConfigError):
        migration.statements("ttft; DROP DATABASE x")


def test_chdb_path_needs_an_absolute_path() -> None:
    assert chdb_path("chdb:///tmp/a/b/") == "/tmp/a/b"
    with pytest.raises(StoreConfigError):
        chdb_path("chdb://relative/dir")


def test_unsupported_scheme_is_rejected_and_redacted() -> None:
    settings = Settings(clickhouse_url=SecretStr("tcp://u:hunter2@host:9000"))
    with pytest.raises(StoreConfigError) as info:
        make_client(settings)
    assert "hunter2" not in str(info.value)


class _Captured:
    def __init__(self) -> None:
        self.kwargs: dict[str, Any] = {}

    def __call__(self, **kwargs: Any) -> object:
        self.kwargs = kwargs
        return object()


def test_http_url_builds_http_client_with_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _Captured()
    monkeypatch.setattr(clickhouse_connect, "get_client", fake)
    make_client(Settings(clickhouse_url=SecretStr("http://alice:p%40ss%3Aword@ch.example:8124")))
    assert fake.kwargs["interface"] == "http"
    assert fake.kwargs["host"] == "ch.example"
    assert fake.kwargs["port"] == 8124
    assert fake.kwargs["username"] == "alice"
    assert fake.kwargs["password"] == "p@ss:word"
    assert fake.kwargs["secure"] is False
    assert fake.kwargs["autogenerate_session_id"] is False
    assert "database" not in fake.kwargs


def test_settings_credentials_override_the_url_and_https_uses_tls(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _Captured()
    monkeypatch.setattr(clickhouse_connect, "get_client", fake)
    settings = Settings(
        clickhouse_url=SecretStr("https://alice:old@ch.example?ca_cert=/etc/ca.pem"),
        clickhouse_user="bob",
        clickhouse_password=SecretStr("new"),
    )
    make_client(settings)
    assert fake.kwargs["interface"] == "https"
    assert fake.kwargs["port"] == 8443
    assert (fake.kwargs["username"], fake.kwargs["password"]) == ("bob", "new")
    assert fake.kwargs["secure"] is True
    assert fake.kwargs["verify"] is True
    assert fake.kwargs["ca_cert"] == "/etc/ca.pem"


def test_http_url_without_user_defaults_to_default_user(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _Captured()
    monkeypatch.setattr(clickhouse_connect, "get_client", fake)
    make_client(Settings(clickhouse_url=SecretStr("http://ch.example")))
    assert (fake.kwargs["username"], fake.kwargs["password"], fake.kwargs["port"]) == ("default", "", 8123)


def test_database_in_url_path_is_rejected() -> None:
    with pytest.raises(StoreConfigError, match="TTFT_CLICKHOUSE_DATABASE"):
        make_client(Settings(clickhouse_url=SecretStr("http://u:secret@ch.example:8123/ttft")))


def test_connection_errors_never_show_the_password(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(**kwargs: Any) -> object:
        raise OSError(f"cannot reach {kwargs['host']} as {kwargs['username']}:{kwargs['password']}")

    monkeypatch.setattr(clickhouse_connect, "get_client", refuse)
    with pytest.raises(StoreUnavailable) as info:
        make_client(Settings(clickhouse_url=SecretStr("http://u:hunter2@127.0.0.1:1")))
    text = str(info.value)
    assert "hunter2" not in text
    assert "u:***@127.0.0.1:1" in text
    assert info.value.__cause__ is None


def test_record_row_conversion_round_trips() -> None:
    record = RequestRecord(
        request_id="r1",
        tenant_id="t",
        status="missing_stage",
        missing_stages=["llm_ttft"],
        started_at=1_700_000_000_123.0,
        first_token_at=1_700_000_001_000.0,
        window_start=1_700_000_000_000.0,
        custom_stages={"guard": 1.5},
        stage_repeats={"retrieval": 1},
        event_count=4,
        record_version=record_version(4, "missing_stage"),
    ).model_dump()
    row = _row(record, ["a1"])
    assert len(row) == len(INSERT_COLUMNS)
    assert row[INSERT_COLUMNS.index("started_at")] == 1_700_000_000_123
    assert _record(row) == (record, ["a1"])


def test_record_without_a_required_field_is_refused() -> None:
    with pytest.raises(KeyError, match="tenant_id"):
        _row({"request_id": "r1"})


class _FakeServer:
    def __init__(self, settings: set[str]) -> None:
        self.server_settings = dict.fromkeys(settings)


def test_final_reads_use_exact_skip_index_mode_or_no_skip_indexes() -> None:
    exact = _FakeServer({"use_skip_indexes_if_final", "use_skip_indexes_if_final_exact_mode"})
    older = _FakeServer({"use_skip_indexes_if_final"})
    assert final_read_settings(exact) == {"use_skip_indexes_if_final_exact_mode": 1}  # type: ignore[arg-type]
    assert final_read_settings(older) == {"use_skip_indexes_if_final": 0}  # type: ignore[arg-type]
