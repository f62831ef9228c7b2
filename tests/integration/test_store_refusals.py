"""A value the ``requests`` columns cannot hold is refused by real chDB: the row is isolated and reported,
every other row of the batch is stored, and amendments behave the same."""

from __future__ import annotations

from typing import Any

import pytest
from clickhouse_connect.driver.client import Client

from streams.core.join import merge_records
from streams.store.requests_store import apply_amendments_checked, insert_requests_checked
from tests.support.records import make_record

pytestmark = [pytest.mark.clickhouse]


def _stored(client: Client, db: str) -> dict[str, Any]:
    rows = client.query(f"SELECT request_id, fallback_level FROM {db}.requests FINAL").result_rows
    return dict(rows)


def test_refused_rows_are_isolated_and_the_rest_is_stored(ch_client: Client, ch_database: str) -> None:
    records = [make_record(f"r{i}") for i in range(40)]
    records[7]["stage_repeats"] = {"retrieval": 70_000}  # Map(String, UInt16)
    records[31]["fallback_level"] = 1_000_000  # UInt16
    refused = insert_requests_checked(ch_client, ch_database, records)
    assert sorted(r["request_id"] for r, _ in refused) == ["r31", "r7"]
    reasons = dict((r["request_id"], reason) for r, reason in refused)
    assert "stage_repeats" in reasons["r7"] and "fallback_level" in reasons["r31"]
    assert set(_stored(ch_client, ch_database)) == {f"r{i}" for i in range(40)} - {"r7", "r31"}


def test_refused_amendments_are_isolated(ch_client: Client, ch_database: str) -> None:
    assert insert_requests_checked(ch_client, ch_database, [make_record("a1"), make_record("a2")]) == []
    good = {**make_record("a1"), "amend": True, "fallback_level": 3}
    bad = {**make_record("a2"), "amend": True, "fallback_level": 1_000_000}  # merged by max: UInt16 overflows
    merged, refused = apply_amendments_checked(
        ch_client, ch_database, [good, bad], lambda s, a: merge_records(s, a, 60_000)
    )
    assert [r["request_id"] for r, _ in refused] == ["a2"]
    assert [m["request_id"] for m in merged] == ["a1"]
    assert _stored(ch_client, ch_database)["a1"] == 3
