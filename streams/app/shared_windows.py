"""Several writers over one ClickHouse server: who closes a window, and when (issue 13).

Each writer owns some partitions of ``ttft.requests``. It sees the join's heartbeats, and inserts the
records, of those partitions only, so on its own it can neither tell when a window is complete nor
aggregate it. So:

- Every writer records its progress on the partitions it owns in ``writer_progress`` (the event time
  the join's heartbeats vouch for there, written after the records before them are inserted).
- The *owner*, the writer of the lowest ``ttft.requests`` partition, closes a window once the progress
  of every partition has passed it, aggregates it from ``requests FINAL`` (all writers' rows) and runs
  the rule engine: each window is closed and judged once, by one writer.
- A record that arrives after its window closed, at any writer, is folded in by the owner's
  reconciliation, which compares the recent closed windows' stored aggregates with their records
  (count and sum of record versions) every ``RECONCILE_S`` and recomputes those that differ.

The exchange is throttled (``interval_s``); a writer that owns every partition never uses it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from streams.store.aggregates_store import record_writer_progress, writer_progress

StoreCall = Callable[..., Awaitable[Any]]

#: Seconds between two reconciliations of the owner's recently closed windows.
RECONCILE_S = 30.0
#: Closed windows the reconciliation looks at (the most recent ones).
RECONCILE_WINDOWS = 10


class SharedProgress:
    """This writer's side of the ``writer_progress`` exchange."""

    def __init__(
        self,
        store_call: StoreCall,
        database: str,
        writer_id: str,
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store_call = store_call
        self.db = database
        self.writer_id = writer_id
        self.interval_s = interval_s
        self.clock = clock
        self._last_exchange: float | None = None
        self._written: dict[int, float] = {}
        self.cluster: dict[int, float] = {}

    async def exchange(self, own: Mapping[int, float], partitions: Iterable[int]) -> float | None:
        """Write ``own`` progress (what moved), read everyone's; the minimum over ``partitions``, or None
        while a partition has no progress yet. At most once per ``interval_s``; in between, the last
        reading (with this writer's own newer values) is used."""
        now = self.clock()
        if self._last_exchange is None or now - self._last_exchange >= self.interval_s:
            moved = {p: ms for p, ms in own.items() if ms > self._written.get(p, float("-inf"))}
            if moved:
                await self.store_call(record_writer_progress, self.db, moved, self.writer_id)
                self._written.update(moved)
            self.cluster = dict(await self.store_call(writer_progress, self.db) or {})
            self._last_exchange = now
        known = {**self.cluster, **{p: ms for p, ms in self._written.items() if p in own}}
        values = [known.get(p) for p in partitions]
        if not values or any(v is None for v in values):
            return None
        return min(v for v in values if v is not None)
