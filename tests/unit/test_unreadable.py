"""streams/kafka/unreadable.py on a fake consumer: a record ``getmany`` cannot parse becomes a stand-in at its
offset, the records before it are returned, nothing is skipped, and the folds dead-letter the stand-in
(the real client, broker and workers: tests/integration/test_unreadable_records.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from aiokafka import ConsumerRecord, TopicPartition

from streams.kafka.unreadable import UNREADABLE_HEADER, salvage, stand_in, unreadable_letter

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


def _record(tp: TopicPartition, offset: int) -> ConsumerRecord[Any, Any]:
    return ConsumerRecord(tp.topic, tp.partition, offset, 0, 0, b"k", b"v%d" % offset, None, 1, 2, [])


class PoisonedConsumer:
    """Records 0..9 on each partition; reading the record at ``poison[tp]`` raises, as aiokafka does."""

    def __init__(self, poison: dict[TopicPartition, int]) -> None:
        self.poison = poison
        self.position = {A: 0, B: 0}
        self._fetcher = SimpleNamespace(_records={})

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.position[tp] = offset
        self._fetcher._records.pop(tp, None)

    def paused(self) -> set[TopicPartition]:
        return set()

    async def getmany(self, *tps: TopicPartition, timeout_ms: int, max_records: int) -> dict[TopicPartition, Any]:
        out: dict[TopicPartition, list[ConsumerRecord[Any, Any]]] = {}
        for tp in tps:
            start = self.position[tp]
            for offset in range(start, min(10, start + max_records)):
                if self.poison.get(tp) == offset:
                    self._fetcher._records[tp] = SimpleNamespace(
                        _partition_records=SimpleNamespace(next_fetch_offset=offset)
                    )
                    b"\xff".decode()  # raises UnicodeDecodeError, the records read so far are lost
                out.setdefault(tp, []).append(_record(tp, offset))
            self.position[tp] = start + len(out.get(tp, []))
        return out


def test_the_unreadable_record_becomes_a_stand_in_and_nothing_is_skipped() -> None:
    consumer = PoisonedConsumer({B: 6})
    consumer.position = {A: 9, B: 9}  # the failed fetch moved both partitions past what was returned
    got = asyncio.run(salvage(consumer, {A: 3, B: 2}, poll_ms=0, batch_max=100))  # type: ignore[arg-type]
    assert [r.offset for r in got[A]] == list(range(3, 10))
    assert [r.offset for r in got[B]] == [2, 3, 4, 5, 6]
    assert got[B][-1].value is None and got[B][-1].headers[0][0] == UNREADABLE_HEADER
    assert consumer.position[B] == 7  # reading goes on after it
    assert [r.value for r in got[B][:-1]] == [b"v2", b"v3", b"v4", b"v5"]


def test_the_stand_in_is_dead_lettered_not_utf8_with_where_its_bytes_are() -> None:
    error = UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
    letter = unreadable_letter(stand_in(B, 6, error), 1_000.0, 1024)
    assert letter is not None and letter.reason_code == "not_utf8"
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == ("t", 1, 6)
    assert "header key is not UTF-8" in letter.detail and "kcat -C -t t -p 1 -o 6 -c 1" in letter.detail
    tombstone = ConsumerRecord("t", 1, 7, 0, 0, b"k", None, None, 1, -1, [])
    assert unreadable_letter(tombstone, 1_000.0, 1024) is None  # a tombstone is no stand-in
