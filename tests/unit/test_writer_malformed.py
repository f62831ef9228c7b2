"""Issue 27 item 6: one malformed message on ``ttft.requests`` (or the dead-letter topic) crash-looped the
writer: it raised out of the batch, so the restart read it again. Now each such message becomes a dead
letter (``invalid_json`` or ``schema``, its bytes kept) and the batch's good records are written."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition

from streams.app.metrics import WorkerMetrics
from streams.app.writer import StoreWriter
from streams.core.watermarks import WATERMARK_KEY
from streams.settings import Settings
from tests.support.records import make_record

REQUESTS = "ttft.requests"
DEAD_LETTER = "ttft.dead-letter"


def message(offset: int, value: bytes, key: bytes | None = b"r") -> SimpleNamespace:
    return SimpleNamespace(offset=offset, key=key, value=value, timestamp=1_800_000_000_000)


def process(batch: dict[TopicPartition, list[Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run one batch through the writer's fold; returns (request rows, dead-letter rows) it inserted."""
    writer = StoreWriter(Settings(), WorkerMetrics("writer", "w-1"), stats_interval_s=None)
    inserted: dict[str, list[dict[str, Any]]] = {"requests": [], "dead_letters": []}

    async def fake_insert(table: str, fn: Callable[..., Any], db: str, rows: list[dict[str, Any]], *_: Any) -> Any:
        inserted[table].extend(rows)
        return [] if table == "requests" else None

    writer._insert = fake_insert  # type: ignore[method-assign]
    asyncio.run(writer._process(batch))
    return inserted["requests"], inserted["dead_letters"]


GOOD = make_record("r-good", started_at=1_800_000_000_000.0)


@pytest.mark.parametrize(
    ("value", "reason", "detail"),
    [
        (b"\xff not json", "invalid_json", "not a request record"),
        (b"[1, 2]", "schema", "not a request record"),
        (orjson.dumps({"request_id": "r-x"}), "schema", "tenant_id"),
        (orjson.dumps({**GOOD, "started_at": "yesterday"}), "schema", "started_at"),
    ],
)
def test_a_malformed_record_is_dead_lettered_and_the_good_ones_written(value: bytes, reason: str, detail: str) -> None:
    tp = TopicPartition(REQUESTS, 3)
    rows, letters = process({tp: [message(0, orjson.dumps(GOOD)), message(1, value), message(2, orjson.dumps(GOOD))]})
    assert [r["request_id"] for r in rows] == ["r-good"]
    assert len(letters) == 1
    letter = letters[0]
    assert (letter["reason_code"], letter["source_topic"], letter["source_partition"], letter["source_offset"]) == (
        reason,
        REQUESTS,
        3,
        1,
    )
    assert detail in letter["detail"]


def test_a_malformed_heartbeat_or_dead_letter_is_dead_lettered_too() -> None:
    requests, dead = TopicPartition(REQUESTS, 0), TopicPartition(DEAD_LETTER, 0)
    beat = message(0, orjson.dumps({"watermark_ms": "soon"}), key=WATERMARK_KEY)
    rows, letters = process({requests: [beat, message(1, orjson.dumps(GOOD))], dead: [message(5, b'{"reason": 1}')]})
    assert [r["request_id"] for r in rows] == ["r-good"]
    assert sorted((dl["source_topic"], dl["reason_code"]) for dl in letters) == [
        (DEAD_LETTER, "schema"),
        (REQUESTS, "schema"),
    ]
    assert any("not a watermark heartbeat" in dl["detail"] for dl in letters)
    assert any("not a dead letter" in dl["detail"] for dl in letters)


def test_a_late_record_whose_start_moved_names_the_window_it_left(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27 item 6 (the writer's half; the closer's is in test_window_memory): the stored window of each
    late record is read before it is replaced, and a window it left is handed to the closer as vacated."""
    old_ws = int(GOOD["window_start"]) - 60_000
    asked: list[set[tuple[str, str]]] = []

    def fake_stored_windows(client: Any, db: str, keys: set[tuple[str, str]]) -> dict[tuple[str, str], int]:
        asked.append(set(keys))
        return {("acme", "r-late"): old_ws}

    monkeypatch.setattr("streams.app.writer.stored_windows", fake_stored_windows)
    writer = StoreWriter(Settings(), WorkerMetrics("writer", "w-1"), stats_interval_s=None)

    async def fake_insert(table: str, fn: Callable[..., Any], *args: Any) -> Any:
        return [] if table == "requests" else None

    writer._insert = fake_insert  # type: ignore[method-assign]
    late = {**GOOD, "request_id": "r-late", "late_events": 1}
    tp = TopicPartition(REQUESTS, 0)
    asyncio.run(writer._process({tp: [message(0, orjson.dumps(GOOD)), message(1, orjson.dumps(late))]}))
    assert asked == [{("acme", "r-late")}]  # only the late one is looked up
    assert writer.vacated == {old_ws}
