"""The column-oriented insert stores exactly what the row-oriented one did (issue 13: writer CPU)."""

from __future__ import annotations

from typing import Any

import pytest

from streams.store.requests_store import INSERT_COLUMNS, RECORD_FIELDS, _columns, _row
from tests.support.records import make_record


def _varied_records() -> list[dict[str, Any]]:
    full = make_record(
        "r-1",
        first_token_at=1_000_000.4,
        ttft_ms=12.5,
        missing_stages=["rerank"],
        custom_stages={"guard": 3.5},
        stage_repeats={"rerank": 2},
        prompt_cache_hit=True,
        trace_id="abc",
    )
    sparse = {name: value for name, value in make_record("r-2").items() if value is not None}
    sparse.pop("custom_stages")
    sparse.pop("missing_stages")
    as_tuples = {**make_record("r-3", missing_stages=["llm"]), "missing_stages": ("llm",)}
    rounded = make_record("r-4", started_at=1_800_000_000_123.5)
    return [full, sparse, as_tuples, rounded]


@pytest.mark.parametrize("complete_only", [True, False], ids=["every-field", "sparse-record"])
def test_columns_hold_the_values_of_the_rows(complete_only: bool) -> None:
    records = _varied_records()
    if complete_only:  # as the join emits them: read in one call per record, then transposed
        records = [r for r in records if set(RECORD_FIELDS) <= set(r)]
        assert len(records) == 3
    columns = _columns(records)
    assert len(columns) == len(INSERT_COLUMNS)
    assert [list(row) for row in zip(*columns, strict=True)] == [_row(r) for r in records]


def test_no_records_no_rows() -> None:
    assert _columns([]) == [[] for _ in INSERT_COLUMNS]


def test_amendment_ids_fill_the_last_column() -> None:
    records = _varied_records()[:2]
    columns = _columns(records, [("a",), ["b", "c"]])
    assert columns[-1] == [["a"], ["b", "c"]]
    assert [list(row) for row in zip(*columns, strict=True)] == [
        _row(records[0], ("a",)),
        _row(records[1], ["b", "c"]),
    ]


def test_a_missing_required_field_is_named() -> None:
    record = make_record("r-5")
    del record["status"]
    try:
        _columns([record])
    except KeyError as exc:
        assert exc.args == ("status",)
    else:
        raise AssertionError("a record without status was accepted")
    assert "status" in RECORD_FIELDS
