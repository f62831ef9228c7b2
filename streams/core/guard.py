"""The dead-letter-rate guard: quarantine the source of a dead-letter flood, never stop everyone.

When more than ``share`` of the last ``window`` messages were invalid, something upstream is broken (a bad
deploy, a producer writing garbage, a wrong topic). Halting the whole input for it let one producer stop
every tenant, and the restart replayed the same messages and halted again. So the guard names the *source*
that explains the excess and quarantines it instead; the pipeline goes on for everybody:

- the **tenant** with the most dead letters in the window, unless one producer has more (its bad deploy, on
  any partition);
- else a **producer**: the source partition and the producer named by the message's producer header
  (``caps.producer_header``), or the partition alone when the message has none. Bytes that do not parse
  carry no tenant, and a producer spraying made-up tenant ids is many small tenants but one producer;
- past ``max_quarantined`` tenants and producers, the **partition** that holds the most dead letters. There
  are only so many partitions, so this always ends.

One quarantine per judgement: if the excess had several sources, the next one is judged once the window
has filled again without the first.

A quarantined source's messages leave the window: its invalid events keep being dead-lettered (with their
bytes: nothing is lost) and its valid ones keep being joined, and the guard watches everyone else. A
source is released once ``release_after`` messages (default: five windows) have passed without one dead
letter of it (it was fixed, or went quiet), checked every ``window`` messages; it is quarantined again if it
floods again.

The guard never halts ingestion: a halt is left for what is truly global (the store refusing every row,
:mod:`streams.app.writer`). Pure, no clock: the caller reports ``newly_quarantined`` and ``released``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

K = TypeVar("K", str, int, tuple[int, str])

#: The kinds of quarantined source, in the order the guard tries them.
TENANT = "tenant"
PRODUCER = "producer"
PARTITION = "partition"


@dataclass(frozen=True, slots=True)
class Source:
    """One quarantined source: a tenant, a (partition, producer) pair, or a partition."""

    kind: str
    #: The tenant id, the producer header's value ("" when the message had none), or "".
    name: str = ""
    #: The source partition (producer and partition sources), else -1.
    partition: int = -1

    def describe(self) -> str:
        """How on-call reads it: ``tenant 'acme'``, ``partition 3 producer 'svc-a'``, ``partition 3``."""
        if self.kind == TENANT:
            return f"tenant {self.name!r}"
        if self.kind == PRODUCER and self.name:
            return f"partition {self.partition} producer {self.name!r}"
        if self.kind == PRODUCER:
            return f"partition {self.partition} (no producer header)"
        return f"partition {self.partition} (every producer)"


@dataclass(slots=True)
class DeadLetterGuard:
    """Sliding window over the last ``window`` messages; quarantines a source when the invalid share
    exceeds ``share`` (module docstring)."""

    window: int
    share: float
    #: Tenants, and separately producers, that may be quarantined before the guard widens to partitions.
    max_quarantined: int = 10
    #: Messages without a dead letter of a quarantined source before it is released (0: 5 windows).
    release_after: int = 0
    # The window as a ring of ``_count`` slots (at most ``window``), one per message: whether it was dead,
    # its tenant, partition and producer. Once full, ``_next`` is the oldest slot, which the next message
    # takes (no allocation per message).
    _deads: list[bool] = field(default_factory=list)
    _tenants: list[str | None] = field(default_factory=list)
    _partitions: list[int] = field(default_factory=list)
    _producers: list[str | None] = field(default_factory=list)
    _count: int = 0
    _next: int = 0
    _dead: int = 0
    _dead_by_tenant: dict[str, int] = field(default_factory=dict)
    _dead_by_producer: dict[tuple[int, str], int] = field(default_factory=dict)
    _dead_by_partition: dict[int, int] = field(default_factory=dict)
    #: Messages observed so far (the clock of releases).
    _seen: int = 0
    # Quarantined sources by kind, each with the message number of its latest dead letter.
    _q_tenants: dict[str, int] = field(default_factory=dict)
    _q_producers: dict[tuple[int, str], int] = field(default_factory=dict)
    _q_partitions: dict[int, int] = field(default_factory=dict)
    #: Quarantined sources, in the order they were quarantined.
    quarantined: dict[Source, None] = field(default_factory=dict)
    #: Sources quarantined since the caller last cleared this list (to log, count and page them).
    newly_quarantined: list[Source] = field(default_factory=list)
    #: Sources released since the caller last cleared this list (to resolve their page).
    released: list[Source] = field(default_factory=list)

    def observe(self, dead: bool, tenant: str | None = None, partition: int = -1, producer: str | None = None) -> bool:
        """Record one message (``tenant``: its tenant, None when unknown; ``producer``: its producer header,
        None without one). True when it belongs to a quarantined source (it stays out of the window)."""
        self._seen += 1
        if self.quarantined:
            if self._seen % max(self.window, 1) == 0:  # a release is due within one window of its time
                self._release_quiet()
            if self._in_quarantine(dead, tenant, partition, producer):
                return True
        self._push(dead, tenant, partition, producer)
        if self._count >= self.window and self._dead > self.share * self.window:
            self._judge()
        return False

    def is_quarantined(self, tenant: str | None, partition: int = -1, producer: str | None = None) -> bool:
        """Whether a message of this tenant, partition and producer belongs to a quarantined source."""
        if tenant is not None and tenant in self._q_tenants:
            return True
        if partition in self._q_partitions:
            return True
        return bool(self._q_producers) and (partition, producer or "") in self._q_producers

    def hold(self, source: Source) -> None:
        """Quarantine ``source`` without judging it (a quarantine restored after a restart or a rebalance: its
        page is already out, so it is not listed in ``newly_quarantined``). Its release clock starts now."""
        if source in self.quarantined:
            return
        if source.kind == TENANT:
            self._q_tenants[source.name] = self._seen
        elif source.kind == PRODUCER:
            self._q_producers[(source.partition, source.name)] = self._seen
        else:
            self._q_partitions[source.partition] = self._seen
        self.quarantined[source] = None
        self._drop_quarantined()

    def drop(self, source: Source) -> None:
        """Forget the quarantine of ``source`` without releasing it (its partitions moved to another worker,
        which holds it now): not listed in ``released``."""
        if source not in self.quarantined:
            return
        del self.quarantined[source]
        if source.kind == TENANT:
            self._q_tenants.pop(source.name, None)
        elif source.kind == PRODUCER:
            self._q_producers.pop((source.partition, source.name), None)
        else:
            self._q_partitions.pop(source.partition, None)

    @property
    def tripped(self) -> bool:
        """Always False: the guard quarantines, it never halts (kept for callers of the earlier guard)."""
        return False

    @property
    def dead_share(self) -> float:
        return self._dead / self._count if self._count else 0.0

    @property
    def dead_letters(self) -> int:
        return self._dead

    # --- the window ------------------------------------------------------------------------------

    def _release_after(self) -> int:
        return self.release_after if self.release_after > 0 else 5 * max(self.window, 1)

    def _in_quarantine(self, dead: bool, tenant: str | None, partition: int, producer: str | None) -> bool:
        """Whether the message is a quarantined source's; a dead one renews every matching quarantine."""
        found = False
        seen = self._seen
        if tenant is not None and tenant in self._q_tenants:
            found = True
            if dead:
                self._q_tenants[tenant] = seen
        if partition in self._q_partitions:
            found = True
            if dead:
                self._q_partitions[partition] = seen
        if self._q_producers:
            key = (partition, producer or "")
            if key in self._q_producers:
                found = True
                if dead:
                    self._q_producers[key] = seen
        return found

    def _push(self, dead: bool, tenant: str | None, partition: int, producer: str | None) -> None:
        if self.window < 1:
            return  # a window of nothing: no message is kept
        if dead:
            self._count_dead(tenant, partition, producer, 1)
        if self._count < self.window:
            self._deads.append(dead)
            self._tenants.append(tenant)
            self._partitions.append(partition)
            self._producers.append(producer)
            self._count += 1
            return
        at = self._next
        if self._deads[at]:  # the oldest message leaves the window
            self._count_dead(self._tenants[at], self._partitions[at], self._producers[at], -1)
        self._deads[at] = dead
        self._tenants[at] = tenant
        self._partitions[at] = partition
        self._producers[at] = producer
        self._next = at + 1 if at + 1 < self.window else 0

    def _count_dead(self, tenant: str | None, partition: int, producer: str | None, step: int) -> None:
        self._dead += step
        if tenant is not None:
            _bump(self._dead_by_tenant, tenant, step)
        _bump(self._dead_by_producer, (partition, producer or ""), step)
        _bump(self._dead_by_partition, partition, step)

    # --- judging ---------------------------------------------------------------------------------

    def _judge(self) -> None:
        """Quarantine the source behind most of the excess: the tenant with the most dead letters when no
        producer has more (a producer spraying made-up tenant ids is one producer), else that producer, else
        (their caps reached) the partition with the most."""
        source: Source | None = None
        tenant, by_tenant = _worst(self._dead_by_tenant)
        producer, by_producer = _worst(self._dead_by_producer)
        if tenant is not None and by_tenant >= by_producer and len(self._q_tenants) < self.max_quarantined:
            source = Source(TENANT, tenant)
            self._q_tenants[tenant] = self._seen
        elif producer is not None and len(self._q_producers) < self.max_quarantined:
            source = Source(PRODUCER, producer[1], producer[0])
            self._q_producers[producer] = self._seen
        else:
            partition, _ = _worst(self._dead_by_partition)
            if partition is None:
                return
            source = Source(PARTITION, "", partition)
            self._q_partitions[partition] = self._seen
        self.quarantined[source] = None
        self.newly_quarantined.append(source)
        self._drop_quarantined()

    def _drop_quarantined(self) -> None:
        """Rebuild the window without the messages of quarantined sources (rare: once per quarantine)."""
        oldest_first = [*range(self._next, self._count), *range(self._next)]
        kept = [
            i
            for i in oldest_first
            if not self.is_quarantined(self._tenants[i], self._partitions[i], self._producers[i])
        ]
        self._deads = [self._deads[i] for i in kept]
        self._tenants = [self._tenants[i] for i in kept]
        self._partitions = [self._partitions[i] for i in kept]
        self._producers = [self._producers[i] for i in kept]
        self._count, self._next = len(kept), 0
        self._dead = 0
        self._dead_by_tenant, self._dead_by_producer, self._dead_by_partition = {}, {}, {}
        for i in range(self._count):
            if self._deads[i]:
                self._count_dead(self._tenants[i], self._partitions[i], self._producers[i], 1)

    def _release_quiet(self) -> None:
        """Release the sources without a dead letter for ``release_after`` messages."""
        oldest = self._seen - self._release_after()
        for source in list(self.quarantined):
            if source.kind == TENANT:
                last = self._q_tenants[source.name]
            elif source.kind == PRODUCER:
                last = self._q_producers[(source.partition, source.name)]
            else:
                last = self._q_partitions[source.partition]
            if last > oldest:
                continue
            if source.kind == TENANT:
                del self._q_tenants[source.name]
            elif source.kind == PRODUCER:
                del self._q_producers[(source.partition, source.name)]
            else:
                del self._q_partitions[source.partition]
            del self.quarantined[source]
            self.released.append(source)


def _bump(counts: dict[K, int], key: K, step: int) -> None:
    left = counts.get(key, 0) + step
    if left:
        counts[key] = left
    else:
        del counts[key]


def _worst(counts: dict[K, int]) -> tuple[K | None, int]:
    """The key with the most dead letters and its count; of equals the smallest key, so the choice does not
    depend on the order the counts were made in."""
    best: K | None = None
    most = 0
    for key, count in counts.items():
        if count > most or (count == most and best is not None and key < best):
            best, most = key, count
    return best, most
