"""The writer's view of the join's event time, from the heartbeats the join interleaves with its records.

Every join worker periodically sends, for each stage-events partition ``p`` it owns, a heartbeat
``(p, watermark_ms)`` to *every* partition ``r`` of ``ttft.requests``, after the records of the batch. On
one partition ``r`` a heartbeat therefore follows every record it vouches for, so the minimum over ``r`` of
the latest heartbeat from ``p`` is safe whatever order the writer reads partitions in; the minimum over
all ``p`` is how far the whole join has progressed. A request may still be open until the join's request
timeout after its start, so records can start up to ``timeout + grace`` before that point.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

#: Key of a heartbeat message on ``ttft.requests`` (records are keyed by request id).
WATERMARK_KEY = b"__watermark__"


@dataclass(slots=True)
class SourceWatermarks:
    """Latest heartbeat per (source partition, requests partition)."""

    source_partitions: int
    seen: dict[int, dict[int, float]] = field(default_factory=dict)

    def observe(self, source_partition: int, requests_partition: int, watermark_ms: float) -> None:
        by_target = self.seen.setdefault(source_partition, {})
        if watermark_ms > by_target.get(requests_partition, float("-inf")):
            by_target[requests_partition] = watermark_ms

    def progress(self, requests_partitions: Iterable[int]) -> float | None:
        """Event time every source partition with data has passed on every given requests partition.

        A partition that never carried an event sends no heartbeat and does not hold the others back (its
        first, possibly older events become late amendments). None until a heartbeat arrived.
        """
        targets = list(requests_partitions)
        if not targets:
            return None
        lows: list[float] = []
        for by_target in self.seen.values():
            if any(r not in by_target for r in targets):
                return None
            lows.append(min(by_target[r] for r in targets))
        return min(lows) if lows else None
