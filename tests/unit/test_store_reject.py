"""Deterministic insert errors are isolated to their rows by bisection; infrastructure errors propagate."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, DataError, OperationalError

from streams.store.reject import describe, is_deterministic, isolate


class FakeStore:
    """Refuses the items in ``bad`` (DataError); ``down`` raises an infrastructure error instead."""

    def __init__(self, bad: set[int], down: bool = False) -> None:
        self.bad, self.down = bad, down
        self.stored: list[int] = []
        self.calls = 0

    def insert(self, items: Sequence[int]) -> list[int]:
        self.calls += 1
        if self.down:
            raise OperationalError("connection refused")
        if self.bad & set(items):
            raise DataError("Unable to create native array for column `stage_repeats`: error")
        self.stored += items
        return list(items)


@pytest.mark.parametrize("bad", [set(), {0}, {99}, {3, 4}, {10, 50, 77}, set(range(100))])
def test_every_good_row_is_stored_and_every_bad_row_refused(bad: set[int]) -> None:
    store = FakeStore(bad)
    done, refused = isolate(store.insert, list(range(100)))
    assert sorted(store.stored) == sorted(done) == [i for i in range(100) if i not in bad]
    assert sorted(i for i, _ in refused) == sorted(bad)
    assert all("stage_repeats" in reason for _, reason in refused)
    if len(bad) == 1:
        assert store.calls <= 2 * 7 + 1  # one bad row costs about 2 log2(n) inserts


def test_infrastructure_errors_propagate() -> None:
    with pytest.raises(OperationalError):
        isolate(FakeStore(set(), down=True).insert, [1, 2, 3])


@pytest.mark.parametrize(
    ("exc", "deterministic"),
    [
        (DataError("bad value"), True),
        (DatabaseError("Code: 53. DB::Exception: Type mismatch"), True),
        (DatabaseError("Code: 321. DB::Exception: Value out of range"), True),
        (DatabaseError("Code: 241. DB::Exception: Memory limit exceeded"), False),
        (DatabaseError("Code: 60. DB::Exception: Table ttft.requests does not exist"), False),
        (OperationalError("timed out"), False),
        (OSError("connection reset"), False),
        (OverflowError("int too large"), True),
    ],
)
def test_classification(exc: BaseException, deterministic: bool) -> None:
    assert is_deterministic(exc) is deterministic


def test_describe_includes_the_chained_cause() -> None:
    try:
        try:
            raise ValueError("ushort format requires 0 <= number <= 65535")
        except ValueError as inner:
            raise DataError("Unable to create native array for column `stage_repeats`") from inner
    except DataError as exc:
        text = describe(exc)
    assert "stage_repeats" in text and "65535" in text and len(text) <= 300
