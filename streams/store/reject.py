"""Deterministic insert errors: find the rows a store refuses, so the writer can dead-letter them and move on.

An insert that fails because of a *value* (a number out of its column's range, a type the column cannot
take) fails the same way on every retry: retrying it forever stalls the writer with nothing committed.
Such an error is told from an infrastructure error (the server or the network) by its type and code
(:func:`is_deterministic`). :func:`isolate` then bisects the batch: halves are inserted separately until
every refused row stands alone, so one bad row costs about ``2 log2(n)`` inserts, and every good row is
stored. Infrastructure errors propagate unchanged (the caller keeps retrying the whole batch; inserts
are idempotent, so the rows of halves that did succeed are absorbed).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Sequence
from typing import Final, TypeVar

from clickhouse_connect.driver.exceptions import DatabaseError, DataError

T = TypeVar("T")
R = TypeVar("R")

#: ClickHouse error codes caused by a value, never by the server's health: CANNOT_PARSE_TEXT (6),
#: CANNOT_PARSE_INPUT_ASSERTION_FAILED (27), CANNOT_PARSE_DATE (38), CANNOT_PARSE_DATETIME (41),
#: TYPE_MISMATCH (53), ARGUMENT_OUT_OF_BOUND (69), CANNOT_CONVERT_TYPE (70), CANNOT_PARSE_NUMBER (72),
#: TOO_LARGE_STRING_SIZE (131), VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE (321).
DETERMINISTIC_CODES: Final = frozenset({6, 27, 38, 41, 53, 69, 70, 72, 131, 321})
_CODE = re.compile(r"Code: (\d+)")
_MAX_REASON_CHARS: Final = 300


def is_deterministic(exc: BaseException) -> bool:
    """True when ``exc`` is about the inserted values (retrying cannot help)."""
    if isinstance(exc, DataError | struct.error | OverflowError):
        return True
    if isinstance(exc, DatabaseError):
        found = _CODE.search(str(exc))
        return found is not None and int(found.group(1)) in DETERMINISTIC_CODES
    return False


def describe(exc: BaseException) -> str:
    """A bounded, one-line description of a refusal, with the cause the driver chained (``struct.error``)."""
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__
    if cause is not None:
        text += f" ({type(cause).__name__}: {cause})"
    text = " ".join(text.split())
    return text if len(text) <= _MAX_REASON_CHARS else text[: _MAX_REASON_CHARS - 1] + "…"


def isolate(
    insert: Callable[[Sequence[T]], Sequence[R] | None],
    items: Sequence[T],
    deterministic: Callable[[BaseException], bool] = is_deterministic,
) -> tuple[list[R], list[tuple[T, str]]]:
    """``insert(items)``, bisecting on deterministic errors: (what the inserts returned, refused items
    with the reason). Any other error propagates."""
    if not items:
        return [], []
    try:
        return list(insert(items) or ()), []
    except Exception as exc:
        if not deterministic(exc):
            raise
        if len(items) == 1:
            return [], [(items[0], describe(exc))]
        mid = len(items) // 2
        left, left_refused = isolate(insert, items[:mid], deterministic)
        right, right_refused = isolate(insert, items[mid:], deterministic)
        return left + right, left_refused + right_refused
