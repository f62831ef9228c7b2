"""What the join's and the OTLP mapping's folds share: a core whose state is one changelog value per key.

Both keep their open work (requests, traces) in a core that marks what it touched as dirty and can restore
and drop it by partition; :class:`KeyedStateFold` turns that into the runner's ``take_dirty``, ``restore``
and ``revoke`` (:class:`streams.kafka.batches.BatchFold`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Protocol

from aiokafka import TopicPartition

from streams.app.join_changelog import restore_partitions
from streams.app.metrics import WorkerMetrics
from streams.kafka.batches import Outputs
from streams.settings import Settings


class KeyedCore(Protocol):
    """A core with one packed state per key on a partition (None: forgotten, a tombstone)."""

    def dirty(self) -> dict[str, tuple[int, bytes | None]]: ...

    def restore(self, key: str, packed: bytes, partition: int) -> object: ...

    def revoke(self, partitions: set[int]) -> object: ...


class KeyedStateFold:
    """The state half of a fold over a :class:`KeyedCore` whose changelog is ``changelog``."""

    core: KeyedCore

    def __init__(
        self, settings: Settings, metrics: WorkerMetrics, changelog: str, wall_clock: Callable[[], float] = time.time
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.changelog = changelog
        self._wall = wall_clock
        self.dead_letter_topic = settings.topic("dead-letter")

    def take_dirty(self) -> Outputs:
        """One changelog write per key touched since the last call, on its partition."""
        state: Outputs = defaultdict(list)
        for key, (partition, packed) in self.core.dirty().items():
            state[(self.changelog, partition)].append((key.encode(), packed))
        return state

    async def restore(self, partitions: list[TopicPartition]) -> None:
        await restore_partitions(self.settings, self.changelog, _numbers(partitions), self.core)

    def revoke(self, partitions: set[TopicPartition]) -> None:
        self.core.revoke(set(_numbers(partitions)))


def _numbers(partitions: Iterable[TopicPartition]) -> list[int]:
    return sorted(tp.partition for tp in partitions)
