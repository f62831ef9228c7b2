"""Issue 14 item 4 in the store: ``requests`` is keyed by ``(tenant_id, request_id)`` (migration 0008, with
the rows of an existing store kept), and one tenant's record or amendment never replaces another's."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client

from streams.core.join import merge_records
from streams.store.aggregates_store import table_columns
from streams.store.migrate import apply_migrations, load_migrations, migrations_dir
from streams.store.requests_store import (
    INSERT_COLUMNS,
    apply_amendments,
    fetch_request,
    fetch_request_all_tenants,
    fetch_requests_by_key,
    insert_requests,
)
from streams.store.requests_store import _row as request_row
from tests.support.recent import RECENT_DAY_MS
from tests.support.records import make_record

pytestmark = [pytest.mark.clickhouse]


@pytest.fixture
def old_store(ch_client: Client, tmp_path: Path) -> Iterator[str]:
    """A database migrated up to 0007 (keyed by request_id alone), with rows in it."""
    before = tmp_path / "migrations"
    before.mkdir()
    for path in migrations_dir().glob("*.sql"):
        if path.name < "0008":
            shutil.copy(path, before / path.name)
    database = f"m_{uuid.uuid4().hex[:12]}"
    apply_migrations(ch_client, database, before)
    # Rows as a writer of that time wrote them: the columns the table had then (later fields came with
    # later migrations, e.g. 0012's llm_unmeasured_ms).
    columns = table_columns(ch_client, database, "requests")
    records = [make_record(f"r{i}", tenant_id=f"t{i % 3}") for i in range(30)]
    rows = [[v for c, v in zip(INSERT_COLUMNS, request_row(r), strict=True) if c in columns] for r in records]
    ch_client.insert("requests", rows, column_names=[c for c in INSERT_COLUMNS if c in columns], database=database)
    try:
        yield database
    finally:
        ch_client.command(f"DROP DATABASE IF EXISTS {database} SYNC")


def _key(client: Client, db: str) -> str:
    rows = client.query(
        "SELECT sorting_key FROM system.tables WHERE database = {d:String} AND name = 'requests'",
        parameters={"d": db},
    ).result_rows
    return str(rows[0][0])


def test_migration_keeps_every_row_and_rekeys(ch_client: Client, old_store: str) -> None:
    assert _key(ch_client, old_store) == "request_id"
    before = ch_client.query(f"SELECT * EXCEPT inserted_at FROM {old_store}.requests FINAL ORDER BY request_id")
    assert apply_migrations(ch_client, old_store)[0] == "0008_requests_tenant_key"
    assert _key(ch_client, old_store) == "tenant_id, request_id"
    later = "inserted_at, llm_unmeasured_ms, event_keys"  # the columns of 0012 and 0013: NULL and [] for these rows
    after = ch_client.query(f"SELECT * EXCEPT ({later}) FROM {old_store}.requests FINAL ORDER BY request_id")
    assert after.result_rows == before.result_rows and len(after.result_rows) == 30
    nulls = ch_client.query(f"SELECT countIf(llm_unmeasured_ms IS NULL) FROM {old_store}.requests FINAL")
    assert nulls.result_rows == [(30,)]
    tables = {r[0] for r in ch_client.query(f"SHOW TABLES FROM {old_store}").result_rows}
    assert "requests_by_tenant" not in tables


def test_migration_rerun_after_a_crash_past_the_exchange_ends_rekeyed(ch_client: Client, old_store: str) -> None:
    """Crash between EXCHANGE and the ledger: the next run starts over from the (new) table, rows intact."""
    (migration,) = [m for m in load_migrations() if m.version == "0008"]
    statements = migration.statements(old_store)
    for statement in statements[:-1]:  # everything but the final DROP, and no ledger entry
        ch_client.command(statement)
    assert apply_migrations(ch_client, old_store)[0] == "0008_requests_tenant_key"
    assert _key(ch_client, old_store) == "tenant_id, request_id"
    assert ch_client.query(f"SELECT count() FROM {old_store}.requests FINAL").result_rows == [(30,)]


def test_two_tenants_may_share_a_request_id(ch_client: Client, ch_database: str) -> None:
    a = make_record("same-id", tenant_id="tenant-a", retrieval_ms=100.0)
    b = make_record("same-id", tenant_id="tenant-b", retrieval_ms=900.0, record_version=a["record_version"] + 5)
    insert_requests(ch_client, ch_database, [a])
    insert_requests(ch_client, ch_database, [b])  # used to replace tenant-a's row (a higher version)
    both = fetch_request_all_tenants(ch_client, ch_database, "same-id")
    assert [(r["tenant_id"], r["retrieval_ms"]) for r in both] == [("tenant-a", 100.0), ("tenant-b", 900.0)]
    assert fetch_request(ch_client, ch_database, "same-id", "tenant-b")["retrieval_ms"] == 900.0  # type: ignore[index]


def test_an_amendment_only_touches_its_own_tenants_record(ch_client: Client, ch_database: str) -> None:
    insert_requests(ch_client, ch_database, [make_record("same-id", tenant_id="tenant-a", fallback_level=0)])
    amendment = {**make_record("same-id", tenant_id="tenant-b", fallback_level=7), "amend": True}
    apply_amendments(ch_client, ch_database, [amendment], lambda s, a: merge_records(s, a, 60_000))
    stored = fetch_requests_by_key(ch_client, ch_database, [("tenant-a", "same-id"), ("tenant-b", "same-id")])
    assert stored[("tenant-a", "same-id")]["fallback_level"] == 0  # untouched
    assert stored[("tenant-b", "same-id")]["amend"] is True  # kept on its own, flagged


def test_stored_window_series_are_pinned_on_recompute(ch_client: Client, ch_database: str) -> None:
    """Issue 14 item 5: a late record's series never displaces a series already stored for its window."""
    from streams.core.series import SeriesAdmission
    from streams.core.windows import aggregate_window
    from streams.settings import Settings
    from streams.store.aggregates_store import insert_window_aggregates, stored_window_series

    def rec(rid: str, tenant: str) -> dict[str, Any]:
        return {**make_record(rid, tenant_id=tenant), "window_start": float(RECENT_DAY_MS)}

    admission = SeriesAdmission(max_series=1)
    first = aggregate_window([rec("a", "tenant-a")], RECENT_DAY_MS, Settings(), admission=admission)
    insert_window_aggregates(ch_client, ch_database, {"window_health": first.window_health})
    pinned = stored_window_series(ch_client, ch_database, RECENT_DAY_MS)
    # A recent window: the store's retention TTL hides rows of 1970 from queries (tests/support/recent.py).
    assert pinned and pinned[0][0] == "tenant-a", pinned
    late = [rec("a", "tenant-a"), *[rec(f"z{i}", f"tenant-z{i}") for i in range(20)]]
    again = aggregate_window(late, RECENT_DAY_MS, Settings(), admission=admission, pinned_series=pinned)
    assert ("tenant-a", pinned[0][1]) in {(r["tenant_id"], r["version_id"]) for r in again.window_health}
