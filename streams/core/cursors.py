"""Where the join is in each stage-events partition: the next offset it expects, and when it last moved.

Faust's consumer can hand the join a partition's records with a hole in them. ``Consumer.getmany`` stops
yielding mid-fetch when the group generation changes and skips records of partitions it thinks are not
active, while aiokafka's fetch position has already moved past them. Faust then files the hole as a
"gap" (as if compaction or transaction markers had made it) and commits past it once a later offset is
acked: the records are lost, and the consumer lag still reaches zero. When the hole is at the end of a
partition, nothing is ever committed past it and the lag never reaches zero.

:class:`OffsetCursors` lets the adapter see both. Each event is classified against the partition's cursor:

* ``"next"``: the expected offset (or the first after a legitimate gap the adapter has checked);
* ``"replay"``: below the cursor, so already folded and made durable: skip it (e.g. Faust re-delivering
  from the committed offset after a rebalance);
* ``"gap"``: above the cursor: read ``[cursor, offset)`` directly from the partition and fold those
  records first, so nothing is lost and per-partition order holds.

A partition whose log end is past its cursor and that has not moved for a while is ``stalled``: the
adapter seeks Faust's consumer back to the cursor, so the records come through the normal path (and
are acked and committed).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Literal

Position = Literal["next", "replay", "gap"]


class OffsetCursors:
    """Per partition: the next offset to fold, and the clock reading when it last moved."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._next: dict[int, int] = {}
        self._moved: dict[int, float] = {}

    def known(self, partition: int) -> bool:
        return partition in self._next

    def next_offset(self, partition: int) -> int | None:
        return self._next.get(partition)

    def partitions(self) -> list[int]:
        return sorted(self._next)

    def start(self, partition: int, committed: int) -> None:
        """(Re)start a partition at its committed offset; a cursor already past it stays where it is.

        A worker that kept a partition through a rebalance has folded beyond the committed offset (commits
        trail processing); one that gets a partition back after another worker moved it on must jump ahead.
        """
        current = self._next.get(partition)
        self._next[partition] = committed if current is None else max(current, committed)
        self._moved[partition] = self._clock()

    def classify(self, partition: int, offset: int) -> Position:
        expected = self._next[partition]
        if offset == expected:
            return "next"
        return "replay" if offset < expected else "gap"

    def advance(self, partition: int, offset: int) -> None:
        """``offset`` has been folded: expect ``offset + 1`` next."""
        if offset + 1 > self._next.get(partition, -1):
            self._next[partition] = offset + 1
            self._moved[partition] = self._clock()

    def stalled(self, partition: int, log_end: int | None, after_s: float) -> bool:
        """True when records wait below ``log_end`` and the cursor has not moved for ``after_s`` seconds."""
        expected = self._next.get(partition)
        if expected is None or log_end is None or log_end <= expected:
            return False
        return self._clock() - self._moved[partition] >= after_s

    def touch(self, partition: int) -> None:
        """Restart the stall timer (after a repair was asked for), so one stall triggers one repair."""
        if partition in self._next:
            self._moved[partition] = self._clock()

    def forget(self, partitions: Iterable[int]) -> None:
        for partition in partitions:
            self._next.pop(partition, None)
            self._moved.pop(partition, None)
