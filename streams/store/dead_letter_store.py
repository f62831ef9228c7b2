"""Dead letters in ``{database}.dead_letters``: one row per bad Kafka message.

Rows are dead-letter envelopes (:class:`schemas.dead_letter.DeadLetter`, whose fields are the table's
columns): the model itself, its ``model_dump()``, or the dict of its JSON, where ``original`` is base64
text. Times are epoch ms.
The table is idempotent on (source_topic, source_partition, source_offset, span_id): a replay of the same
bad message (or OTLP span) leaves one row after ``FINAL``.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from schemas.dead_letter import DeadLetter
from streams.store.client import check_identifier
from streams.store.requests_store import SYNC_INSERT

DEAD_LETTER_COLUMNS: tuple[str, ...] = (
    "source_topic",
    "source_partition",
    "source_offset",
    "reason_code",
    "detail",
    "original",
    "original_length",
    "sha256",
    "kafka_timestamp",
    "request_id",
    "tenant_id",
    "received_at",
    "trace_id",
    "span_id",
)
_OPTIONAL = frozenset({"kafka_timestamp", "request_id", "tenant_id", "trace_id", "span_id"})


def _ms(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("dead-letter timestamps must be epoch ms or timezone-aware datetimes")
        return round(value.timestamp() * 1000)
    ticks: int = round(value)
    return ticks


def _original_bytes(value: Any) -> bytes:
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    # In JSON the envelope carries the bytes as standard base64 (schemas/dead_letter.py).
    return base64.b64decode(str(value), validate=True)


def _row(letter: DeadLetter | dict[str, Any]) -> list[Any]:
    fields = letter.model_dump() if isinstance(letter, DeadLetter) else letter
    row: list[Any] = []
    for column in DEAD_LETTER_COLUMNS:
        value = fields.get(column) if column in _OPTIONAL else fields[column]
        if column in ("kafka_timestamp", "received_at"):
            value = _ms(value)
        elif column == "original":
            value = _original_bytes(value)
        elif column == "span_id":
            value = value or ""  # part of the sorting key, so not Nullable: '' for a message that is no span
        row.append(value)
    return row


def insert_dead_letters(client: Client, database: str, rows: Sequence[DeadLetter | dict[str, Any]]) -> None:
    """Insert dead letters in one synchronous batch (idempotent on the Kafka coordinates)."""
    if rows:
        client.insert(
            "dead_letters",
            [_row(r) for r in rows],
            column_names=list(DEAD_LETTER_COLUMNS),
            database=check_identifier(database),
            settings=SYNC_INSERT,
        )


def fetch_dead_letters(client: Client, database: str) -> list[dict[str, Any]]:
    """All stored dead letters (``FINAL``) as envelope-shaped dicts, in Kafka order; times in epoch ms."""
    db = check_identifier(database)
    select = ", ".join(
        f"toUnixTimestamp64Milli({c}) AS {c}_ms" if c in ("kafka_timestamp", "received_at") else c
        for c in DEAD_LETTER_COLUMNS
    )
    result = client.query(
        f"SELECT {select} FROM {db}.dead_letters FINAL ORDER BY source_topic, source_partition, source_offset, span_id",
        column_formats={"original": "bytes"},
    )
    rows = [dict(zip(DEAD_LETTER_COLUMNS, row, strict=True)) for row in result.result_rows]
    for row in rows:
        row["span_id"] = row["span_id"] or None
    return rows


def count_dead_letters(client: Client, database: str) -> int:
    """Number of distinct dead letters (``FINAL``)."""
    db = check_identifier(database)
    return int(client.query(f"SELECT count() FROM {db}.dead_letters FINAL").result_rows[0][0])
